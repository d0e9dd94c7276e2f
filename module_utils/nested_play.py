"""One driver for nested plays: run a playbook of the project through ansible-runner with the caller's
inventory, vault and extra vars, and return its result as data (rc, status, per-host stats, the failures
with their own messages) instead of a command's stdout to scrape.

The rollout runs a host change's playbook (pack_engram.yml, site.yml --tags ...) and its revert this way,
ladders and campaigns run whole rollouts this way. The nested run keeps its own run record: its
SPARKFLEET_RUN_DIR is the folder the caller names. Its events stay in <private>/artifacts/<ident>/, where
``progress()`` reads the task it is on while it runs.
"""
from __future__ import annotations

import glob
import json
import os
import shlex
import time
from typing import Any, Optional

IDENT = "nested"


def command_line(extra_vars_files: list[str] = (), vault_password_files: list[str] = (), vault_ids: list[str] = (),
                 tags: list[str] = (), skip_tags: list[str] = (), check: bool = False, diff: bool = False) -> str:
    """The ansible-playbook options besides playbook, inventory and extra-vars dict, quoted for ansible-runner."""
    args: list[str] = []
    for path in extra_vars_files:
        args += ["-e", "@" + str(path)]
    for path in vault_password_files:
        args += ["--vault-password-file", str(path)]
    for vid in vault_ids:
        args += ["--vault-id", str(vid)]
    if tags:
        args += ["--tags", ",".join(tags)]
    if skip_tags:
        args += ["--skip-tags", ",".join(skip_tags)]
    if check:
        args.append("--check")
    if diff:
        args.append("--diff")
    return " ".join(shlex.quote(a) for a in args)


def failures(events: list[dict]) -> list[dict]:
    """[{host, task, msg}] of every failed or unreachable task that was not ignored, with the task's own message."""
    out = []
    for ev in events:
        if ev.get("event") not in ("runner_on_failed", "runner_on_unreachable"):
            continue
        data = ev.get("event_data") or {}
        if data.get("ignore_errors"):
            continue
        res = data.get("res") or {}
        msg = res.get("msg") or res.get("stderr") or res.get("stdout") or "failed"
        out.append({"host": data.get("host"), "task": data.get("task"), "msg": " ".join(str(msg).split())[:600]})
    return out


def run(playbook: str, private_dir: str, inventory: Optional[list[str]] = None, extra_vars: Optional[dict] = None,
        extra_vars_files: list[str] = (), vault_password_files: list[str] = (), vault_ids: list[str] = (),
        tags: list[str] = (), skip_tags: list[str] = (), env: Optional[dict] = None, limit: Optional[str] = None,
        check: bool = False, diff: bool = False, project_dir: Optional[str] = None) -> dict[str, Any]:
    """Run ``playbook`` to its end; {rc, status, ok, stats, failures, stdout_tail, elapsed_s, artifacts}.
    ``project_dir`` (default: the folder above the playbook's, the project's root) holds ansible.cfg."""
    import ansible_runner

    os.makedirs(private_dir, exist_ok=True)
    project_dir = project_dir or os.path.dirname(os.path.dirname(os.path.abspath(playbook)))
    # ansible-runner replaces the callback path with its own: the project's callbacks (run_record) go back in.
    envvars = {"ANSIBLE_CONFIG": os.environ.get("ANSIBLE_CONFIG") or os.path.join(project_dir, "ansible.cfg"),
               "ANSIBLE_CALLBACK_PLUGINS": os.path.join(project_dir, "plugins", "callback"),
               "ANSIBLE_NOCOLOR": "1"}
    for key in ("SPARKFLEET_RUNS_DIR", "SPARKFLEET_TESTBED_ID", "SPARKFLEET_TESTBED_STATE", "ANSIBLE_HOME",
                "ANSIBLE_VAULT_PASSWORD_FILE", "ANSIBLE_VAULT_IDENTITY_LIST", "PATH"):
        if os.environ.get(key):
            envvars[key] = os.environ[key]
    # Run by ansible-runner itself (a rollout in the integration tests or in a campaign rung), the caller's
    # display is runner's awx_display: the nested run must wrap the caller's original display, not itself.
    if os.environ.get("ANSIBLE_STDOUT_CALLBACK") == "awx_display":
        original = os.environ.get("ORIGINAL_STDOUT_CALLBACK") or "default"
        envvars["ANSIBLE_STDOUT_CALLBACK"] = "default" if original == "awx_display" else original
    envvars.update({k: str(v) for k, v in (env or {}).items()})
    started = time.monotonic()
    r = ansible_runner.run(private_data_dir=private_dir, project_dir=project_dir, ident=IDENT,
                           playbook=os.path.abspath(playbook), inventory=list(inventory or []) or None,
                           extravars=dict(extra_vars or {}), limit=limit, envvars=envvars, quiet=True,
                           cmdline=command_line(extra_vars_files, vault_password_files, vault_ids, tags, skip_tags,
                                                check, diff) or None)
    stdout = r.stdout.read() if r.stdout else ""
    events = list(r.events)
    stats = r.stats or {}
    rc = r.rc if isinstance(r.rc, int) else 1
    return {"rc": rc, "status": r.status, "ok": rc == 0, "stats": stats, "failures": failures(events),
            "stdout_tail": stdout[-4000:], "elapsed_s": round(time.monotonic() - started, 1),
            "artifacts": os.path.join(private_dir, "artifacts", IDENT)}


def progress(private_dir: str) -> dict:
    """Where a nested run stands from its events so far: {task, host, events, play}."""
    folder = os.path.join(private_dir, "artifacts", IDENT, "job_events")
    latest: dict = {}
    # <counter>-<uuid>.json; ansible-runner also writes <uuid>-partial.json while an event is being written
    names = sorted((p for p in glob.glob(os.path.join(folder, "*.json")) if os.path.basename(p).split("-", 1)[0].isdigit()),
                   key=lambda p: int(os.path.basename(p).split("-", 1)[0]))
    for path in reversed(names[-50:]):
        try:
            with open(path) as fh:
                data = json.load(fh).get("event_data") or {}
        except (OSError, ValueError):
            continue
        if data.get("task"):
            latest = {"task": data.get("task"), "host": data.get("host"), "play": data.get("play")}
            break
    latest["events"] = len(names)
    return latest
