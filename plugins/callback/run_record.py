"""run_record: every entry playbook leaves a run folder with a machine-readable record.

runs/<UTC timestamp>-<playbook>/record.json holds the inventory (ranks, roles), the outcome, the
per-host stats, every failure with its message, and the results of sparkfleet's own modules
(snapshots, engram plans and packs, boot-log facts, autotune inventories, container diffs, benchmarks, the
nested plays and decisions of a campaign).
Boot logs and bench results are written beside it by the roles, which find the folder through the
SPARKFLEET_RUN_DIR environment variable this plugin sets when the playbook starts (set it yourself to
choose the folder).

Secrets stay secret (issue 19 item 13): every value under a secret-looking key (*_KEY, *_TOKEN, *_SECRET,
*PASSWORD*, API_KEY, plus the keys listed in sparkfleet_secret_env_keys) is written as ********, and URLs lose
their user:pass@ (module_utils/env_text.mask_tree). The run folder is made mode 0700 and record.json 0600.
"""
from __future__ import annotations

DOCUMENTATION = r"""
name: run_record
type: aggregate
short_description: write runs/<timestamp>-<playbook>/record.json for every playbook
description:
  - Creates the run folder at playbook start and exports it as SPARKFLEET_RUN_DIR.
  - At the end writes record.json with the inventory, outcome, stats, failures and sparkfleet module results.
requirements:
  - enable in ansible.cfg (callbacks_enabled = run_record)
options:
  runs_dir:
    description: Folder that holds the run folders.
    default: runs (next to the playbooks folder)
    env:
      - name: SPARKFLEET_RUNS_DIR
"""

import datetime
import json
import os
import sys

from ansible.plugins.callback import CallbackBase
from ansible.template import Templar

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "module_utils"))
from env_text import mask_tree  # noqa: E402

RECORDED_MODULES = {
    "engram_pack", "engram_status_info", "engram_status", "boot_log_info", "boot_log_facts", "autotune_cache",
    "fleet_snapshot_info", "fleet_snapshot", "engine_container",
    "decode_bench", "bench_report", "node_preflight_info", "node_preflight", "engine_liveness_info", "engine_liveness",
    # A campaign's rungs (issue 23): each nested run's result (rc, stats, failures, seconds) and each
    # campaign_step decision; campaign_step's progress steps (one every ~20 s) are left out.
    "nested_play", "campaign_step",
}
NOT_RECORDED = {("campaign_step", "progress")}
MAX_RESULT_CHARS = 200_000


def _short(action: str) -> str:
    return action.rsplit(".", 1)[-1]


def _rendered(templar, value):
    try:
        return templar.template(value)
    except Exception as exc:  # an undefined variable: keep the text and say why
        return f"{value} (not rendered: {exc})"


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "run_record"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.run_dir = None
        self.record = {}
        self._inventory_done = False
        self.secret_keys: list = []

    def v2_playbook_on_start(self, playbook):
        name = os.path.splitext(os.path.basename(playbook._file_name))[0]
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        base = os.environ.get("SPARKFLEET_RUNS_DIR") or os.path.join(os.path.dirname(playbook._basedir), "runs")
        self.run_dir = os.environ.get("SPARKFLEET_RUN_DIR") or os.path.join(base, f"{stamp}-{name}")
        os.makedirs(self.run_dir, mode=0o700, exist_ok=True)
        os.chmod(self.run_dir, 0o700)  # also when it existed: the record may hold what only the operator may read
        os.environ["SPARKFLEET_RUN_DIR"] = self.run_dir
        self.record = {"playbook": name, "file": playbook._file_name, "started": stamp, "run_dir": self.run_dir,
                       "check_mode": False, "inventory": {}, "results": [], "failures": [], "outcome": "running"}

    def v2_playbook_on_play_start(self, play):
        if self._inventory_done:
            return
        try:
            manager = play.get_variable_manager()
            inventory = manager._inventory
            hosts = inventory.get_groups_dict().get("fleet", [])
            for host in hosts:
                # The values as the play sees them: group_vars applied and templates rendered
                # ("{{ _testbed_subnet }}.11" becomes the address).
                hv = manager.get_vars(play=play, host=inventory.get_host(host))
                templar = Templar(loader=play._loader, variables=hv)
                self.record["inventory"][host] = {k: _rendered(templar, hv.get(k)) for k in (
                    "ansible_host", "fleet_rank", "fleet_role", "fleet_user", "fleet_engram_dir")}
            self.record["check_mode"] = bool(play.check_mode) if play.check_mode is not None else False
            # The keys listed in sparkfleet_secret_env_keys (-e, or the inventory's group_vars as a host sees them).
            listed = manager.extra_vars.get("sparkfleet_secret_env_keys")
            if listed is None and hosts:
                listed = manager.get_vars(play=play, host=inventory.get_host(hosts[0]), include_hostvars=False,
                                          include_delegate_to=False).get("sparkfleet_secret_env_keys")
            self.secret_keys = [str(k) for k in listed or [] if isinstance(listed, (list, tuple))]
            self._inventory_done = True
        except Exception as exc:  # the record must never break a play
            self.record["inventory_error"] = str(exc)

    def _keep(self, result, status):
        action = _short(result._task.action or "")
        host = result._host.get_name()
        data = self._clean(result._result)
        if (action, data.get("action")) in NOT_RECORDED:
            return
        if status == "failed":
            self.record["failures"].append({"host": host, "task": result._task.get_name(), "msg": data.get("msg", "")})
        # "Record:" tasks are kept too, in a role as well (get_name() prefixes the role's name).
        if action in RECORDED_MODULES or (result._task.name or "").startswith("Record:") \
                or result._task.get_name().startswith("Record:"):
            text = json.dumps(data, default=str)
            if len(text) > MAX_RESULT_CHARS:
                data = {"truncated": True, "msg": data.get("msg", ""), "changed": data.get("changed")}
            self.record["results"].append({"host": host, "task": result._task.get_name(), "module": action,
                                           "status": status, "result": data})

    def _clean(self, result):
        return mask_tree({k: v for k, v in result.items() if not k.startswith("_ansible") and k != "invocation"},
                         (), self.secret_keys)

    def v2_runner_on_ok(self, result):
        self._keep(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._keep(result, "ignored" if ignore_errors else "failed")

    def v2_runner_on_unreachable(self, result):
        self.record["failures"].append({"host": result._host.get_name(), "task": result._task.get_name(),
                                        "msg": "unreachable: " + str(result._result.get("msg", ""))})

    def _fleet_summary(self) -> dict:
        """Per host, the last word of each module that describes the fleet's state."""
        summary: dict = {}
        for item in self.record["results"]:
            if item["status"] != "ok":
                continue
            host, res, module = item["host"], item["result"], item["module"]
            entry = summary.setdefault(host, {})
            if module in ("fleet_snapshot_info", "fleet_snapshot") and isinstance(res.get("snapshot"), dict):
                snap = res["snapshot"]
                serving = snap.get("serving") or {}
                entry["serving"] = [{k: c.get(k) for k in ("name", "image", "image_id", "state", "env")}
                                    for c in serving.get("containers", [])]
                entry["image_id"] = serving.get("image_id")
                entry["memory"] = snap.get("memory")
                entry["gpu"] = snap.get("gpu")
            elif module in ("engram_status_info", "engram_status") and "layers" in res:
                entry["packed"] = {str(l.get("layer")): {"state": l.get("state"), "packed": l.get("packed")}
                                   for l in res["layers"]}
                entry["all_packed"] = res.get("all_packed")
            elif module in ("boot_log_info", "boot_log_facts") and res.get("kv"):
                entry["kv"] = res["kv"]
                entry["autotune"] = res.get("autotune")
            elif module == "engine_container" and ("container_after" in res or res.get("container")):
                # The container as the run left it (container_after; check mode has only the one before).
                entry["container"] = res["container_after"] if "container_after" in res else res["container"]
        return summary

    def v2_playbook_on_stats(self, stats):
        self.record["fleet"] = self._fleet_summary()
        hosts = sorted(stats.processed.keys())
        self.record["stats"] = {h: stats.summarize(h) for h in hosts}
        bad = any(s["failures"] or s["unreachable"] for s in self.record["stats"].values())
        self.record["outcome"] = "failed" if bad else "ok"
        self.record["finished"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        path = os.path.join(self.run_dir, "record.json")
        tmp = path + ".tmp"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(mask_tree(self.record, (), self.secret_keys), fh, indent=1, default=str, sort_keys=True)
        os.replace(tmp, path)
