"""The operator's day on the seed testbed, each command exactly as README.md and docs/ show it, in order:
pack refused, pack with relocation, site, drift with hand-made drift, engine restart, baseline, a memory-changing
rollout kept, adapters deploy and release rollback, checkpoint manifest, node updates, status.

Slow (many minutes on the 2-core machine): `make journeys` leaves it out, `pytest -m journey` runs it.
The rollouts, rollbacks and the ladder have their own journey (tests/journeys/test_rollouts.py)."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.journeys.conftest import ROOT, sh

pytestmark = [pytest.mark.usefixtures("seed_testbed", "incumbent_left_as_found"), pytest.mark.slow]


def ok(command: str) -> str:
    run = sh(command)
    assert run.returncode == 0, f"{command}\n{run.stdout[-3000:]}"
    return run.stdout


def test_pack_is_refused_first():
    run = sh("ansible-playbook playbooks/pack_engram.yml")
    assert run.returncode != 0 and "Not enough space to pack, nothing was written" in run.stdout


def test_pack_with_relocation():
    ok("ansible-playbook playbooks/pack_engram.yml -e engram_relocate_stale=true "
       "-e engram_relocate_remove_source=true -e engram_restart_engine=true")


def test_site_converges_then_shows_no_change():
    ok("ansible-playbook playbooks/site.yml")
    out = ok("ansible-playbook playbooks/site.yml --check --diff")
    assert set(re.findall(r"changed=(\d+)", out)) == {"0"}


def test_drift_names_the_fix_for_hand_made_drift(host):
    host("spark2").run("docker stop -t 5 dsv41-worker")
    run = sh("ansible-playbook playbooks/drift.yml -e drift_fail=true")
    assert run.returncode != 0
    assert "fix: ansible-playbook playbooks/engine.yml" in run.stdout
    assert "Run playbooks/site.yml" not in run.stdout


def test_engine_restart_and_the_record_shows_it_running():
    runs = Path(os.environ.get("SPARKFLEET_RUNS_DIR") or ROOT / "runs" / f"testbed-{os.environ.get('SPARKFLEET_TESTBED_ID') or '0'}")
    before = set(runs.glob("*-engine"))
    ok("ansible-playbook playbooks/engine.yml -e engine_state=restarted")
    (folder,) = set(runs.glob("*-engine")) - before
    record = json.loads((folder / "record.json").read_text())
    # Issue 20 item 8: the containers as the run left them (running), the addresses as the play used them.
    assert {h: e["container"]["status"] for h, e in record["fleet"].items()} == dict.fromkeys(record["fleet"], "running")
    assert all(record["inventory"][h]["ansible_host"].startswith("10.213.") for h in record["fleet"]), record["inventory"]
    # The adapters are not deployed yet on the seed: their rows are the only drift left, each naming adapters.yml.
    run = sh("ansible-playbook playbooks/drift.yml -e drift_fail=true")
    fixes = re.findall(r"fix: ansible-playbook playbooks/([\w.-]+\.yml)", run.stdout)
    assert run.returncode != 0 and fixes and set(fixes) == {"adapters.yml"}, run.stdout[-3000:]


def test_baseline_refuses_a_busy_node_then_measures_after_the_printed_fix():
    run = sh("ansible-playbook playbooks/baseline.yml")
    fix = "ansible-playbook playbooks/site.yml --tags headless -e headless_stop_display_now=true"
    assert run.returncode != 0 and "spark3 is busy: display manager" in run.stdout and fix in run.stdout, run.stdout[-3000:]
    ok(fix)
    ok("ansible-playbook playbooks/baseline.yml")
    # The incumbent's boot must see the freed memory before a memory-changing rollout (docs/rollouts.md).
    ok("ansible-playbook playbooks/engine.yml -e engine_state=restarted")


def test_a_memory_changing_rollout_is_kept():
    # wo_a_w8's 688 MiB fit on spark3 once its desktop is stopped (the baseline step above did it, docs/rollouts.md).
    out = ok("ansible-playbook playbooks/rollout.yml -e experiment=wo_a_w8 -e window_confirmed=true")
    assert "wo_a_w8: KEPT." in out, out[-3000:]


def test_adapters_deploy_and_release_rollback():
    ok("ansible-playbook playbooks/adapters.yml")
    ok("ansible-playbook playbooks/adapters.yml -e adapters_release=previous")
    ok("ansible-playbook playbooks/drift.yml -e '{\"drift_roles\": [\"adapters\"]}'")


def test_checkpoint_manifest():
    ok("ansible-playbook playbooks/checkpoint_manifest.yml")


def test_node_updates_then_status():
    ok("ansible-playbook playbooks/node_updates.yml")
    out = ok("ansible-playbook playbooks/status.yml")
    assert "3/3 ranks serving" in out
