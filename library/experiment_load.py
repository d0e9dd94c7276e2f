#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: experiment_load
short_description: Deprecated alias of experiment_load_info (Load one experiment of the catalog and check it)
description:
  - The old name of M(experiment_load_info), kept for one release. It runs the same code with the same options and
    returns the same results (it never returned C(ansible_facts); a read-only module is named C(*_info)),
    plus a deprecation warning.
  - See M(experiment_load_info) for the options and every returned key.
version_added: "1.0.0"
deprecated:
  removed_in: "2.0.0"
  why: The module is read-only and returns no ansible_facts; Ansible names such modules C(*_info).
  alternative: Use M(experiment_load_info) (same options, same results).
author: sparkfleet contributors (!UNKNOWN)
extends_documentation_fragment:
  - experiment_load
attributes:
  check_mode:
    support: full
    description: Reads only; the same in check mode.
  diff_mode:
    support: none
    description: Nothing changes.
seealso:
  - module: experiment_load_info
"""

EXAMPLES = r"""
# Before (deprecated):
- name: Load wo_a_w8_mid and check that wo_a_w8 is kept
  experiment_load:
    name: wo_a_w8_mid
    catalog: "{{ playbook_dir }}/../experiments"
  delegate_to: localhost
  register: experiment

# After: the same task with the new name.
- name: Load wo_a_w8_mid and check that wo_a_w8 is kept
  experiment_load_info:
    name: wo_a_w8_mid
    catalog: "{{ playbook_dir }}/../experiments"
  delegate_to: localhost
  register: experiment
"""

RETURN = r"""
experiment:
  description: The same results as M(experiment_load_info); see its documentation for every key.
  returned: success
  type: dict
"""

from ansible.module_utils.experiment_load import run_module


def main() -> None:
    run_module("experiment_load")


if __name__ == "__main__":
    main()
