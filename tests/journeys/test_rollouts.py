"""Rollouts as an operator runs them (docs/rollouts.md, README.md), each command exactly as written, in order on
one seed testbed: a neutral change reverted, a host change kept (pack_engram) and its rollback (refused, then
the printed command run as printed), the display stopped for a memory-changing change kept when the ledger
matches (wo_a_w8) and the rollback of that env change, then the stage-D ladder.

Slow (each rollout is minutes on the shared 2-core machine): `make journeys` leaves it out,
`pytest tests/journeys -m slow` runs it."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.journeys.conftest import INCUMBENT, ROOT, sh

pytestmark = [pytest.mark.usefixtures("seed_testbed", "incumbent_left_as_found"), pytest.mark.slow]
RUNS: dict = {}


def runs_dir() -> Path:
    return Path(os.environ.get("SPARKFLEET_RUNS_DIR") or ROOT / "runs" / f"testbed-{os.environ.get('SPARKFLEET_TESTBED_ID') or '0'}")


def ok(command: str) -> str:
    run = sh(command)
    assert run.returncode == 0, f"{command}\n{run.stdout[-3000:]}"
    return run.stdout


def rollout(command: str) -> tuple[str, dict]:
    before = set(runs_dir().glob("*-rollout"))
    out = ok(command)
    (folder,) = set(runs_dir().glob("*-rollout")) - before
    return folder.name, json.loads((folder / "rollout.json").read_text())


def test_the_fleet_serves():
    ok("ansible-playbook playbooks/engine.yml")


def test_a_neutral_change_is_reverted():
    _, result = rollout("ansible-playbook playbooks/rollout.yml -e experiment=folded_fence -e window_confirmed=true")
    assert result["outcome"] == "reverted" and result["restore_ok"], result
    assert result["decision"]["incumbent_cv"] <= 0.015, result["decision"]


def test_a_host_change_is_kept():
    RUNS["pack"], result = rollout("ansible-playbook playbooks/rollout.yml -e experiment=pack_engram -e window_confirmed=true")
    assert result["outcome"] == "kept", result
    assert "pack_engram" in INCUMBENT.read_text()


def test_rollback_of_the_host_change_refuses_then_runs_the_printed_command():
    run = sh(f"ansible-playbook playbooks/rollback.yml -e run={RUNS['pack']}")
    assert run.returncode != 0
    text = " ".join(run.stdout.split())
    command = f"ansible-playbook playbooks/rollback.yml -e run={RUNS['pack']} -e rollback_revert_host_changes=true"
    assert command in text, run.stdout[-3000:]
    assert "pack_engram" in INCUMBENT.read_text(), "a refused rollback leaves the incumbent as it is"
    ok(command)
    assert "pack_engram" not in INCUMBENT.read_text()


def test_a_memory_changing_change_is_kept_when_the_ledger_matches(host):
    # spark3's desktop holds GPU memory on the seed testbed (docs/simulator.md): stop it first (docs/rollouts.md, docs/host-tuning.md).
    ok("ansible-playbook playbooks/site.yml -e headless_stop_display_now=true")
    # Without the engine restart the running boot predates the freed memory: the rollout refuses before any change,
    # names what changed and the restart (module_utils/boot_currency.py); before this guard it ran and the ledger
    # reverted wo_a_w8 (spark3 -328 MiB instead of -688).
    engine = host("spark3").run("docker inspect -f '{{.State.StartedAt}}' dsv41-worker").stdout
    run = sh("ansible-playbook playbooks/rollout.yml -e experiment=wo_a_w8 -e window_confirmed=true")
    text = " ".join(run.stdout.split())
    assert run.returncode != 0 and "spark3 (rank 2) changed after its engine booted" in text, run.stdout[-3000:]
    assert "display manager gdm.service stopped at" in text, run.stdout[-3000:]
    assert "Boot the engine again first: ansible-playbook playbooks/engine.yml -e engine_state=restarted" in text
    assert host("spark3").run("docker inspect -f '{{.State.StartedAt}}' dsv41-worker").stdout == engine, "nothing changed"
    ok("ansible-playbook playbooks/engine.yml -e engine_state=restarted")
    RUNS["w8"], result = rollout("ansible-playbook playbooks/rollout.yml -e experiment=wo_a_w8 -e window_confirmed=true")
    assert result["outcome"] == "kept", result
    assert all(m["checked"] and m["ok"] for m in result["memory"].values()), result["memory"]
    assert "wo_a_w8" in INCUMBENT.read_text()


def test_rollback_of_the_env_change():
    ok(f"ansible-playbook playbooks/rollback.yml -e run={RUNS['w8']}")
    assert "wo_a_w8" not in INCUMBENT.read_text()


def test_the_stage_d_ladder():
    # The ladder's only trial is wo_a_w8 (688 MiB per rank): the documented steps before a memory-changing change
    # (docs/rollouts.md), run again here so that the ladder does not depend on the steps above (both idempotent
    # when the desktop is already stopped): the display manager stopped, then the engine booted on the freed memory.
    ok("ansible-playbook playbooks/site.yml -e headless_stop_display_now=true")
    ok("ansible-playbook playbooks/engine.yml -e engine_state=restarted")
    before = set(runs_dir().glob("*-ladder"))
    out = ok("ansible-playbook playbooks/ladder.yml -e ladder=ladders/stage-d.yml -e window_confirmed=true")
    (folder,) = set(runs_dir().glob("*-ladder")) - before
    ladder = json.loads((folder / "ladder.json").read_text())
    assert {t["name"]: t["result"]["outcome"] for t in ladder["trials"]} == {"wo_a_w8": "kept"}, ladder
    assert ladder["combination"]["outcome"] == "kept" and "wo_a_w8" in INCUMBENT.read_text()
    assert re.search(r"ladder\.md", out)
