#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_liveness
short_description: Deprecated alias of engine_liveness_info (Judge a ready engine live by generated tokens advancing)
description:
  - The old name of M(engine_liveness_info), kept for one release. It runs the same code with the same options and
    returns the same results (it never returned C(ansible_facts); a read-only module is named C(*_info)),
    plus a deprecation warning.
  - See M(engine_liveness_info) for the options and every returned key.
version_added: "1.0.0"
deprecated:
  removed_in: "2.0.0"
  why: The module is read-only and returns no ansible_facts; Ansible names such modules C(*_info).
  alternative: Use M(engine_liveness_info) (same options, same results).
author: sparkfleet contributors (!UNKNOWN)
extends_documentation_fragment:
  - engine_api
  - engine_liveness
attributes:
  check_mode:
    support: full
    description: The requests change nothing on the server; check mode sends them too.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
seealso:
  - module: engine_liveness_info
"""

EXAMPLES = r"""
# Before (deprecated):
- name: Judge the head live by generated tokens
  engine_liveness:
    url: http://127.0.0.1:8888
  register: liveness

# After: the same task with the new name.
- name: Judge the head live by generated tokens
  engine_liveness_info:
    url: http://127.0.0.1:8888
  register: liveness
"""

RETURN = r"""
live:
  description: The same results as M(engine_liveness_info); see its documentation for every key.
  returned: always
  type: bool
"""

from ansible.module_utils.engine_liveness import run_module


def main() -> None:
    run_module("engine_liveness")


if __name__ == "__main__":
    main()
