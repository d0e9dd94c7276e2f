"""drift_collect: keep every task result of a drift play, per host, for the drift table (issue 25 item 5).

A play that sets the play variable ``drift_collect: true`` (playbooks/drift.yml) runs the roles' own tasks in
check mode; this plugin writes one record per task result (and per loop item) of a task that belongs to a role
to the JSON file named by SPARKFLEET_DRIFT_RECORD, which it sets when such a play starts (inside the run folder
when SPARKFLEET_RUN_DIR is set, else in a private temporary folder). The drift_report_info module reads the
file and module_utils/drift.py turns the records into rows. Values under secret-looking keys are masked
(module_utils/env_text.mask_tree) before they are written; the file is mode 0600.

In such a play ``ansible_check_mode`` is true, as under ``--check``: Ansible sets that variable from the command
line only, so a play's own ``check_mode: true`` leaves it false and the roles' guards for real runs (``when: not
ansible_check_mode``: the engine's boot, the Engram pack job, a reboot) would run simulated. The plugin sets the
option variable for the play and restores it when another play starts (ansible-core 2.19: the option variables
are one cached dict, utils.vars.load_options_vars, that every variable lookup reads).
"""
from __future__ import annotations

DOCUMENTATION = r"""
name: drift_collect
type: aggregate
short_description: record the roles' check-mode results of a drift play for the drift table
description:
  - In a play whose variable C(drift_collect) is true, writes one record per role task result and host to the
    file named by the environment variable SPARKFLEET_DRIFT_RECORD (set by this plugin).
requirements:
  - enable in ansible.cfg (callbacks_enabled = run_record, drift_collect)
"""

import json
import os
import sys
import tempfile

from ansible.plugins.callback import CallbackBase
from ansible.utils.vars import load_options_vars

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "module_utils"))
from drift import ROW_BUILDERS, short_action  # noqa: E402
from env_text import mask_tree  # noqa: E402


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "drift_collect"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.active = False
        self.path = None
        self.records: dict = {}
        self._saved_check_mode = None

    def _check_mode_var(self, on: bool):
        options = load_options_vars(None)
        if on:
            if self._saved_check_mode is None:
                self._saved_check_mode = (("ansible_check_mode" in options), options.get("ansible_check_mode"))
            options["ansible_check_mode"] = True
        elif self._saved_check_mode is not None:
            present, value = self._saved_check_mode
            if present:
                options["ansible_check_mode"] = value
            else:
                options.pop("ansible_check_mode", None)
            self._saved_check_mode = None

    def v2_playbook_on_play_start(self, play):
        try:
            self.active = str(play.vars.get("drift_collect", False)).lower() in ("true", "yes", "1")
        except Exception:  # a play without vars
            self.active = False
        self._check_mode_var(self.active)
        if not self.active:
            return
        if self.path is None:
            run_dir = os.environ.get("SPARKFLEET_RUN_DIR")
            folder = run_dir if run_dir and os.path.isdir(run_dir) else tempfile.mkdtemp(prefix="sparkfleet-drift-")
            self.path = os.path.join(folder, "drift-tasks.json")
            os.environ["SPARKFLEET_DRIFT_RECORD"] = self.path
        self.records = {}
        self._write()

    def _write(self):
        tmp = self.path + ".tmp"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(self.records, fh, default=str)
        os.replace(tmp, self.path)

    def _keep(self, result, status, item=False):
        if not self.active:
            return
        task = result._task
        role = getattr(task, "_role", None)
        res = result._result or {}
        if role is None or (not item and "results" in res):  # a loop's summary: its items were kept one by one
            return
        ds = task._ds if isinstance(getattr(task, "_ds", None), dict) else {}
        action = short_action(task.action or "")
        record = {
            "role": role.get_name(include_role_fqcn=False) if hasattr(role, "get_name") else str(role),
            "task": (getattr(result, "_task_fields", None) or {}).get("name") or task.name or action,
            "action": action,
            "status": status,
            "changed": bool(res.get("changed")),
            "handler": type(task).__name__ == "Handler",
            "planner": str(ds.get("check_mode", "")).lower() in ("true", "yes"),
            "delegated": bool(task.delegate_to),
            "state": str((task.args or {}).get("state", "")),
            "item": res.get("_ansible_item_label", res.get("item")) if item else None,
            "msg": res.get("msg", ""),
            "diff": res.get("diff"),
            "result": {k: v for k, v in res.items() if not k.startswith("_ansible")} if action in ROW_BUILDERS else None,
        }
        if isinstance(record["item"], (dict, list)):
            record["item"] = json.dumps(record["item"], sort_keys=True, default=str)[:80]
        self.records.setdefault(result._host.get_name(), []).append(mask_tree(record))
        self._write()

    def v2_runner_on_ok(self, result):
        self._keep(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._keep(result, "ok" if ignore_errors else "failed")

    def v2_runner_on_skipped(self, result):
        self._keep(result, "skipped")

    def v2_runner_on_unreachable(self, result):
        self._keep(result, "unreachable")

    def v2_runner_item_on_ok(self, result):
        self._keep(result, "ok", item=True)

    def v2_runner_item_on_failed(self, result):
        self._keep(result, "failed", item=True)

    def v2_runner_item_on_skipped(self, result):
        self._keep(result, "skipped", item=True)
