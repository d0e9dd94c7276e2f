#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: engram_status
short_description: Deprecated alias of engram_status_info (Report this rank's packed Engram shards and the engine's packed= flags)
description:
  - The old name of M(engram_status_info), kept for one release. It runs the same code with the same options and
    returns the same results (it never returned C(ansible_facts); a read-only module is named C(*_info)),
    plus a deprecation warning.
  - See M(engram_status_info) for the options and every returned key.
version_added: "0.1.0"
deprecated:
  removed_in: "2.0.0"
  why: The module is read-only and returns no ansible_facts; Ansible names such modules C(*_info).
  alternative: Use M(engram_status_info) (same options, same results).
author: sparkfleet contributors (!UNKNOWN)
extends_documentation_fragment:
  - engram_rank
  - engram_status
attributes:
  check_mode:
    support: full
    description: The module only reads; check mode returns the same result.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
seealso:
  - module: engram_status_info
"""

EXAMPLES = r"""
# Before (deprecated):
- name: Are this rank's shards valid?
  engram_status:
    dest: /home/zurih/dsv41-3x-spark/engram
    rank: 1
    tp: 3
  register: shards

# After: the same task with the new name.
- name: Are this rank's shards valid?
  engram_status_info:
    dest: /home/zurih/dsv41-3x-spark/engram
    rank: 1
    tp: 3
  register: shards
"""

RETURN = r"""
layers:
  description: The same results as M(engram_status_info); see its documentation for every key.
  returned: always
  type: raw
"""

from ansible.module_utils.engram_status import run_module


def main() -> None:
    run_module("engram_status")


if __name__ == "__main__":
    main()
