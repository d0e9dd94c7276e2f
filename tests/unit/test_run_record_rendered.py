"""record.json stores inventory values rendered (issue 20 item 8): the testbed's ansible_host is
"{{ _testbed_subnet }}.11" in hosts.yml and must be recorded as the address the play used."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_record_inventory_is_rendered(tmp_path):
    play = tmp_path / "p.yml"
    play.write_text("- hosts: localhost\n  gather_facts: false\n  tasks: []\n")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  vars:\n    _subnet: 10.9.8\n  children:\n    fleet:\n      hosts:\n"
                         "        n1: {ansible_host: '{{ _subnet }}.11', fleet_rank: 0, fleet_role: head}\n")
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), SPARKFLEET_RUNS_DIR=str(tmp_path / "runs"),
               ANSIBLE_CALLBACK_PLUGINS=str(ROOT / "plugins" / "callback"))
    env.pop("SPARKFLEET_RUN_DIR", None)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
    proc = subprocess.run(["ansible-playbook", "-i", str(inventory), str(play)], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (record,) = (tmp_path / "runs").glob("*/record.json")
    data = json.loads(record.read_text())
    assert data["inventory"]["n1"]["ansible_host"] == "10.9.8.11"
    assert data["inventory"]["n1"]["fleet_rank"] == 0


def test_record_keeps_each_ranks_container_as_the_run_left_it():
    """Issue 20 item 8: after a restart (stop every rank, then start) the last engine_container result's
    `container` is the stopped one; the record keeps `container_after`, the running one."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("sparkfleet_run_record", ROOT / "plugins" / "callback" / "run_record.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    callback = mod.CallbackModule()
    exited, running = {"name": "dsv41-head", "status": "exited"}, {"name": "dsv41-head", "status": "running"}
    callback.record = {"results": [
        {"host": "spark1", "module": "engine_container", "status": "ok", "task": "Stop",
         "result": {"container": dict(running), "container_after": dict(exited)}},
        {"host": "spark1", "module": "engine_container", "status": "ok", "task": "Start",
         "result": {"container": dict(exited), "container_after": dict(running)}},
        {"host": "spark2", "module": "engine_container", "status": "ok", "task": "Compare (check mode)",
         "result": {"container": dict(running)}}]}
    summary = callback._fleet_summary()
    assert summary["spark1"]["container"]["status"] == "running"
    assert summary["spark2"]["container"]["status"] == "running"
