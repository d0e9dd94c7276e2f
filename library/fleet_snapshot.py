#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_snapshot
short_description: Deprecated alias of fleet_snapshot_info (One read-only snapshot of a fleet host)
description:
  - The old name of M(fleet_snapshot_info), kept for one release. It runs the same code with the same options and
    returns the same results (it never returned C(ansible_facts); a read-only module is named C(*_info)),
    plus a deprecation warning.
  - See M(fleet_snapshot_info) for the options and every returned key.
version_added: "0.1.0"
deprecated:
  removed_in: "2.0.0"
  why: The module is read-only and returns no ansible_facts; Ansible names such modules C(*_info).
  alternative: Use M(fleet_snapshot_info) (same options, same results).
author: sparkfleet contributors (!UNKNOWN)
extends_documentation_fragment:
  - fleet_snapshot
attributes:
  check_mode:
    support: full
    description: The module only reads; check mode returns the same result.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
seealso:
  - module: fleet_snapshot_info
"""

EXAMPLES = r"""
# Before (deprecated):
- name: Read only the GPU clocks and lock
  fleet_snapshot:
    gather: [gpu]
  register: clocks

# After: the same task with the new name.
- name: Read only the GPU clocks and lock
  fleet_snapshot_info:
    gather: [gpu]
  register: clocks
"""

RETURN = r"""
snapshot:
  description: The same results as M(fleet_snapshot_info); see its documentation for every key.
  returned: always
  type: raw
"""

from ansible.module_utils.fleet_snapshot import run_module


def main() -> None:
    run_module("fleet_snapshot")


if __name__ == "__main__":
    main()
