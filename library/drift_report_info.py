#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# sparkfleet: the drift table from the roles' own check-mode results (issue 25 item 5).
from __future__ import annotations

DOCUMENTATION = r"""
---
module: drift_report_info
short_description: Build the drift table from the check-mode results the drift_collect callback kept
description:
  - Reads the records the C(drift_collect) callback wrote while playbooks/drift.yml ran each role's own tasks in
    check mode, and returns one list of rows per node, the operator's table, the number of drifted rows and the
    message C(drift_fail) prints.
  - A row is a task that manages something; it drifted when the task would change the host, or failed. The
    decisions are in module_utils/drift.py.
  - Runs on the controller (delegate it to localhost). Never changes anything.
version_added: "1.0.0"
author: sparkfleet contributors (!UNKNOWN)
options:
  record:
    description: Path of the callback's JSON record (the environment variable SPARKFLEET_DRIFT_RECORD).
    type: path
    required: true
  nodes:
    description: The nodes of the report, in report order.
    type: list
    elements: str
    required: true
  unread:
    description: Nodes that could not be read (unreachable or failed outside a role); their rows are null.
    type: list
    elements: str
    default: []
  fixes:
    description: The command that fixes a drifted row, by item or by role (the first word of an item).
    type: dict
    default: {}
  across_ranks:
    description:
      - Comparisons between ranks (module_utils/drift_ranks.py), each a dict C({item, action, value, compare,
        reference, keys, except, desired, fix}); their rows follow each node's own rows.
      - C(compare) is C(same_as_reference), C(set_on_all) or C(one_value); C(fix) names the playbook and variable
        that fix the row.
    type: list
    elements: dict
    default: []
  secret_env_keys:
    description: Env keys whose values are secrets besides those that look secret; masked in every row.
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
    description: The module only reads; check mode returns the same result.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
"""

EXAMPLES = r"""
- name: Build the table of desired versus actual per node
  drift_report_info:
    record: "{{ lookup('ansible.builtin.env', 'SPARKFLEET_DRIFT_RECORD') }}"
    nodes: "{{ ansible_play_hosts_all }}"
    unread: "{{ ansible_play_hosts_all | difference(ansible_play_hosts) }}"
    fixes:
      engine: ansible-playbook playbooks/engine.yml
  delegate_to: localhost
  run_once: true
  register: drift
"""

RETURN = r"""
items:
  description: Per node its rows C({item, desired, actual, drifted, fix}) (C(fix) on drifted rows), null when not read.
  returned: always
  type: dict
table:
  description: The table's lines, one block per node.
  returned: always
  type: list
  elements: str
drifted:
  description: Number of drifted rows.
  returned: always
  type: int
unread:
  description: Nodes not read.
  returned: always
  type: list
  elements: str
failure_msg:
  description: Every drifted row with its fix, and the nodes not read, as one message.
  returned: always
  type: str
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.drift import build_report
from ansible.module_utils.env_text import mask_tree


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            record=dict(type="path", required=True),
            nodes=dict(type="list", elements="str", required=True),
            unread=dict(type="list", elements="str", default=[]),
            fixes=dict(type="dict", default={}),
            across_ranks=dict(type="list", elements="dict", default=[]),
            secret_env_keys=dict(type="list", elements="str", default=[], no_log=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        with open(p["record"], encoding="utf-8") as fh:
            records = json.load(fh)
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"cannot read the drift record {p['record']}: {exc}. Is the drift_collect callback "
                             "enabled (ansible.cfg callbacks_enabled)?")
    try:
        report = build_report(mask_tree(records, (), p["secret_env_keys"]), p["nodes"], p["unread"],
                              {str(k): str(v) for k, v in p["fixes"].items()}, p["across_ranks"])
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **report)


if __name__ == "__main__":
    main()
