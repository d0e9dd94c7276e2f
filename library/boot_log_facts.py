#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: boot_log_facts
short_description: Deprecated alias of boot_log_info (parse an SGLang / DSV41 engine boot log)
description:
  - The old name of M(boot_log_info), kept for one release. It runs the same code with the same options and
    returns the same results (it never returned C(ansible_facts), hence the new C(_info) name), plus a
    deprecation warning.
  - See M(boot_log_info) for the options and every returned key.
version_added: "0.1.0"
deprecated:
  removed_in: "2.0.0"
  why: The module is read-only and returns no ansible_facts; Ansible names such modules C(*_info).
  alternative: Use M(boot_log_info) (same options, same results).
author: sparkfleet contributors (!UNKNOWN)
options:
  path:
    description: Log file on the managed host. Mutually exclusive with O(content).
    type: path
  content:
    description: Log text given inline (for example the C(stdout) of C(docker logs)).
    type: str
  markers:
    description: Lines to look for in the last launch (C(re:<regex>) or a plain substring).
    type: list
    elements: str
    default: []
  max_errors:
    description: Keep at most this many entries in C(errors).
    type: int
    default: 100
attributes:
  check_mode:
    support: full
    description: The module only reads; check mode returns the same facts.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
seealso:
  - module: boot_log_info
"""

EXAMPLES = r"""
# Before (deprecated):
- name: Read this rank's boot log
  boot_log_facts:
    path: "/var/log/sparkfleet/{{ fleet_engine_container }}.log"
  register: boot

# After: the same task with the new name.
- name: Read this rank's boot log
  boot_log_info:
    path: "/var/log/sparkfleet/{{ fleet_engine_container }}.log"
  register: boot
"""

RETURN = r"""
status:
  description: The same results as M(boot_log_info); see its documentation for every key.
  returned: always
  type: str
  sample: ready
"""

from ansible.module_utils.sglang_log_module import run_module


def main() -> None:
    run_module("boot_log_facts")


if __name__ == "__main__":
    main()
