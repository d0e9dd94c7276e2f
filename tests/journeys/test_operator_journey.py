"""The operator's day on the seed testbed, each command exactly as README.md and docs/ show it, in order:
pack refused, pack with relocation, site, drift with hand-made drift, engine restart, baseline, rollouts
(kept, reverted, memory-changing), adapters deploy and release rollback, checkpoint manifest, status.

Slow (many minutes on the 2-core machine): `make journeys` leaves it out, `pytest -m journey` runs it.
The rollout steps depend on issue 20 items 1, 3, 4 and 10 (the rollout helper's branch)."""
from __future__ import annotations

import pytest

from tests.journeys.conftest import sh

pytestmark = [pytest.mark.usefixtures("seed_testbed"), pytest.mark.slow]


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
    assert set(__import__("re").findall(r"changed=(\d+)", out)) == {"0"}


def test_drift_names_the_fix_for_hand_made_drift(host):
    host("spark2").run("docker stop -t 5 dsv41-worker")
    run = sh("ansible-playbook playbooks/drift.yml -e drift_fail=true")
    assert run.returncode != 0
    assert "fix: ansible-playbook playbooks/engine.yml" in run.stdout
    assert "Run playbooks/site.yml" not in run.stdout


def test_engine_restart_and_the_record_shows_it_running():
    ok("ansible-playbook playbooks/engine.yml -e engine_state=restarted")
    ok("ansible-playbook playbooks/drift.yml -e drift_fail=true")


def test_baseline():
    ok("ansible-playbook playbooks/baseline.yml")


def test_rollout_kept_reverted_and_memory_changing():
    ok("ansible-playbook playbooks/rollout.yml -e experiment=wo_a_w8 -e window_confirmed=true")


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
