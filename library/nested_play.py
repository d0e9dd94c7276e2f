#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""nested_play: run a playbook of the project as a nested play and return its result as data."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nested_play
short_description: Run a nested playbook through ansible-runner and return its result as data
description:
  - Runs O(playbook) with the caller's inventory, vault and extra vars through ansible-runner
    (C(module_utils/nested_play.py)), to its end, and returns rc, status, per-host stats and every failure
    with its own message.
  - The nested run writes its own run record in O(run_dir) (its C(SPARKFLEET_RUN_DIR)).
  - "Runs on the controller (a localhost play). Use C(async) with C(poll: 0) and follow it to print progress
    during a long run."
version_added: "1.1.0"
author: sparkfleet contributors (!UNKNOWN)
options:
  playbook:
    description: Path of the playbook to run.
    type: path
    required: true
  inventory:
    description: Inventory sources, as the caller's C(ansible_inventory_sources).
    type: list
    elements: str
    default: []
  extra_vars:
    description: Extra variables (one C(-e) of JSON).
    type: dict
    default: {}
  extra_vars_files:
    description: Files of extra variables (one C(-e @file) each), in order, after O(extra_vars).
    type: list
    elements: path
    default: []
  vault_password_files:
    description: Vault password files; C(ANSIBLE_VAULT_PASSWORD_FILE) of the caller is passed on as well.
    type: list
    elements: path
    default: []
  tags:
    description: Only the tasks with these tags.
    type: list
    elements: str
    default: []
  run_dir:
    description: The nested run's run folder (its C(SPARKFLEET_RUN_DIR)); ansible-runner's files go to its C(runner/).
    type: path
    required: true
  env:
    description: More environment variables for the nested run.
    type: dict
    default: {}
  fail_on_error:
    description: Fail when the nested play fails (otherwise return its failures as data).
    type: bool
    default: false
attributes:
  check_mode:
    support: partial
    details: In check mode the nested play is not run at all; the module returns C(skipped) and changes nothing.
    description: A nested play changes what its playbook changes; in check mode nothing runs and C(skipped) is returned.
  diff_mode:
    support: none
    description: The nested play's own diffs are in its run record.
"""

EXAMPLES = r"""
- name: Run a host change's playbook with its variables
  nested_play:
    playbook: "{{ playbook_dir }}/pack_engram.yml"
    inventory: "{{ ansible_inventory_sources }}"
    extra_vars_files: ["{{ run_dir }}/apply-vars.json"]
    run_dir: "{{ run_dir }}/apply"
  register: apply

- name: A rollout in the background, followed with progress lines
  nested_play:
    playbook: "{{ playbook_dir }}/rollout.yml"
    inventory: "{{ ansible_inventory_sources }}"
    extra_vars: {experiment: folded_fence, rollout_trial: true, window_confirmed: true}
    run_dir: "{{ run_dir }}/rungs/01-folded_fence"
  async: 14400
  poll: 0
  register: job
"""

RETURN = r"""
rc:
  description: The nested ansible-playbook's exit status (the task does not fail on it unless O(fail_on_error)).
  returned: always
  type: int
  sample: 0
status:
  description: ansible-runner's status (successful, failed, timeout, canceled).
  returned: always
  type: str
  sample: successful
stats:
  description: Per-host counters of the nested play (ok, changed, failures, dark, skipped, ...).
  returned: always
  type: dict
  sample: {failures: {spark2: 1}, ok: {spark1: 12}}
failures:
  description: Every failed task that was not ignored, with its own message.
  returned: always
  type: list
  elements: dict
  sample: [{host: spark2, task: Pack this rank, msg: "not enough space on /engram: 63 GiB needed, 12 GiB free"}]
stdout_tail:
  description: The last 4,000 characters of the nested play's output.
  returned: always
  type: str
elapsed_s:
  description: Seconds the nested play ran.
  returned: always
  type: float
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.nested_play import run


def main() -> None:
    module = AnsibleModule(argument_spec=dict(
        playbook=dict(type="path", required=True), inventory=dict(type="list", elements="str", default=[]),
        extra_vars=dict(type="dict", default={}), extra_vars_files=dict(type="list", elements="path", default=[]),
        vault_password_files=dict(type="list", elements="path", default=[], no_log=False),
        tags=dict(type="list", elements="str", default=[]), run_dir=dict(type="path", required=True),
        env=dict(type="dict", default={}), fail_on_error=dict(type="bool", default=False)), supports_check_mode=True)
    p = module.params
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, msg="check mode: the nested play was not run")
    if not os.path.isfile(p["playbook"]):
        module.fail_json(msg=f"nested_play: no playbook at {p['playbook']}")
    try:
        import ansible_runner  # noqa: F401
    except ImportError:
        module.fail_json(msg="nested_play runs on the controller and needs ansible-runner (requirements.txt): "
                             "run it in a localhost play with the project's venv")
    os.makedirs(p["run_dir"], exist_ok=True)
    # Who runs this nested play, for a resumed caller that finds it still running (campaign.yml -e resume=...).
    with open(os.path.join(p["run_dir"], "nested.pid"), "w") as fh:
        fh.write(f"{os.getpid()}\n")
    env = dict(p["env"], SPARKFLEET_RUN_DIR=p["run_dir"])
    result = run(p["playbook"], os.path.join(p["run_dir"], "runner"), inventory=p["inventory"],
                 extra_vars=p["extra_vars"], extra_vars_files=p["extra_vars_files"],
                 vault_password_files=p["vault_password_files"], tags=p["tags"], env=env)
    if p["fail_on_error"] and not result["ok"]:
        first = result["failures"][0] if result["failures"] else {}
        module.fail_json(msg=f"{os.path.basename(p['playbook'])} failed (rc {result['rc']})"
                             + (f" on {first.get('host')} at {first.get('task')!r}: {first.get('msg')}" if first else ""),
                         changed=True, **result)
    # A non-zero rc alone would make Ansible fail the task ("rc" convention): the nested play's failure is
    # data here, for the caller to judge (fail_on_error=true fails instead).
    module.exit_json(changed=True, failed=False, **result)


if __name__ == "__main__":
    main()
