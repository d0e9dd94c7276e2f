#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# sparkfleet: load and check one experiment of the catalog (runs on the controller).
from __future__ import annotations

DOCUMENTATION = r"""
---
module: experiment_load_info
short_description: Load one experiment of the catalog, validate it and check its prerequisites
description:
  - Reads C(experiments/<name>.yml) (or O(file)), validates it against the schema of
    C(module_utils/experiments.py), and checks that every prerequisite is kept in the incumbent.
  - "Runs on the controller (C(delegate_to: localhost) or a localhost play); reads only."
version_added: "1.0.0"
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
"""

EXAMPLES = r"""
- name: Load wo_a_w8_mid and check that wo_a_w8 is kept
  experiment_load_info:
    name: wo_a_w8_mid
    catalog: "{{ playbook_dir }}/../experiments"
    kept: "{{ incumbent_experiments | default([]) }}"
  delegate_to: localhost
  register: experiment
"""

RETURN = r"""
experiment:
  description: The experiment, as in its file.
  returned: success
  type: dict
  sample: {name: wo_a_w8_mid, stage: D, apply: {env: {DSV41_WO_A_W8: "1", DSV41_WO_A_MID: "1"}}}
catalog_names:
  description: Every experiment in the catalog.
  returned: always
  type: list
  elements: str
  sample: [autotune_keep, pack_engram]
"""

from ansible.module_utils.experiment_load import run_module


def main() -> None:
    run_module("experiment_load_info")


if __name__ == "__main__":
    main()
