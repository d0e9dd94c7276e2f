#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_preflight
short_description: Deprecated alias of node_preflight_info (Read-only preflight of one GB10 node)
description:
  - The old name of M(node_preflight_info), kept for one release. It runs the same code with the same options and
    returns the same results, plus a deprecation warning.
  - Only this name still has O(fact_name) and O(fact_labels), which return the node's summary as C(ansible_facts)
    (a read-only module is named C(*_info) and returns no C(ansible_facts)). With M(node_preflight_info), register
    the result and build the summary with the C(preflight_node_result) filter (the preflight role does).
  - See M(node_preflight_info) for the options and every returned key.
version_added: "0.1.0"
deprecated:
  removed_in: "2.0.0"
  why: The module is read-only; Ansible names such modules C(*_info), and they return no ansible_facts.
  alternative: Use M(node_preflight_info) (same options and results, without O(fact_name) and O(fact_labels)).
author: sparkfleet contributors (!UNKNOWN)
extends_documentation_fragment:
  - node_preflight
options:
  fact_name:
    description:
      - "Also set this host fact to the node's summary (C(verdict), C(ok), C(error), C(failed_checks), C(warned_checks),
        C(lines), C(checks), C(parity), C(packages) and C(gid), the resolved GID per HCA as C(hca -> {port, index, gid, ndev})),
        on success and on bad input (then C(error) holds the message). Only this deprecated name has it: with
        M(node_preflight_info), register the result and keep it with the C(preflight_node_result) filter."
    type: str
  fact_labels:
    description: Keys added to the O(fact_name) fact as they are (for example the host's name and rank).
    type: dict
    default: {}
attributes:
  check_mode:
    support: full
    description: The module only reads; check mode returns the same verdicts.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
seealso:
  - module: node_preflight_info
"""

EXAMPLES = r"""
# Before (deprecated):
- name: Preflight this node and keep its summary as preflight_result
  node_preflight:
    allowed_kernels: [7.0.0-1019-nvidia]
    fact_name: preflight_result
    fact_labels: {host: "{{ inventory_hostname }}"}
  register: preflight

# After: the new name returns no ansible_facts; the filter builds the same summary.
- name: Preflight this node
  node_preflight_info:
    allowed_kernels: [7.0.0-1019-nvidia]
  register: preflight

- name: Keep its summary as preflight_result
  ansible.builtin.set_fact:
    preflight_result: "{{ preflight | preflight_node_result({'host': inventory_hostname}) }}"
"""

RETURN = r"""
verdict:
  description: The same results as M(node_preflight_info); see its documentation for every key.
  returned: success
  type: str
  sample: start
ansible_facts:
  description: With O(fact_name), that fact - the summary of this node (see O(fact_name)).
  returned: when fact_name is set
  type: dict
  sample: {preflight_result: {verdict: start, ok: true, error: "", gid: {rocep1s0f0: {port: 1, index: 3}}}}
"""

from ansible.module_utils.node_preflight_module import run_module


def main() -> None:
    run_module("node_preflight")


if __name__ == "__main__":
    main()
