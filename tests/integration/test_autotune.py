"""playbooks/autotune.yml on the testbed: caches that disagree are planned in check mode, moved aside on every
rank together, retuned and pinned by a boot with the keep switch, then reused by every rank."""
from __future__ import annotations

import os
import re

import pytest
import testinfra
import yaml

from tests.integration.conftest import ROOT, ensure_testbed, play, state_dir

# This module's playbooks use their own run folders and the testbed inventory without incumbent.yml
# (tests/integration/conftest.py: isolated_inventory, play).
pytestmark = [pytest.mark.testbed, pytest.mark.usefixtures("isolated_inventory")]

HOSTS = {"spark1": (0, "mia", "dsv41-head"), "spark2": (1, "zurih", "dsv41-worker"),
         "spark3": (2, "zurih", "dsv41-worker")}
BASE = {"preflight_skip": True}   # the node preflight has its own tests
FLASHINFER = "0.5.2/sm121"


def node(name: str):
    return testinfra.get_host(f"ssh://{name}", ssh_config=str(state_dir() / "ssh" / "config"))


def root(name: str) -> str:
    return f"/home/{HOSTS[name][1]}/.cache/sglang/flashinfer/autotune"


def keys_on(name: str) -> set:
    out = node(name).run(f"ls {root(name)}/{FLASHINFER} 2>/dev/null").stdout.split()
    return {f"{FLASHINFER}/{k}" for k in out}


def keep_vars(**extra) -> dict:
    env = yaml.safe_load((ROOT / "inventory/testbed/group_vars/all/engine.yml").read_text())["engine_env"]
    env["DSV41_AUTOTUNE_KEEP"] = "1"
    return dict(BASE, engine_env=env, **extra)


def this_boot(name: str) -> list:
    """The container log lines of the last boot of this rank."""
    rank, _, container = HOSTS[name]
    lines = node(name).run(f"docker logs {container}").stdout.splitlines()
    # A launch starts at the launcher's first line (docs/reference.md section 7a); this rank's server_args follows.
    starts = [i for i, line in enumerate(lines) if line.startswith("DSV41 MXFP8 dense linears routed")]
    assert not starts or f"'node_rank': {rank}," in "\n".join(lines[starts[-1]:starts[-1] + 8])
    return lines[starts[-1]:] if starts else []


@pytest.fixture(scope="module")
def seed():
    if os.geteuid() != 0:
        pytest.skip("the testbed needs root")
    ensure_testbed(fresh=True)
    seeded = {name: keys_on(name) for name in HOSTS}
    assert all(len(keys) == 2 for keys in seeded.values()) and len(set(map(frozenset, seeded.values()))) == 1
    return next(iter(seeded.values()))


def plan_of(run) -> dict:
    return next(r for r in run.results(task="Record: autotune plan"))["autotune_plan"]


def test_an_engine_image_missing_on_a_node_is_refused_naming_it(seed):
    run = play("autotune.yml", extravars=keep_vars(engine_image="dsv41:not-built"), check=True)
    assert run.rc != 0
    failed = {r["_host"]: r["msg"] for r in run.results(task="Refuse when the engine image is not on this node")
              if r["_event"] == "runner_on_failed"}
    assert set(failed) == set(HOSTS), run.stdout[-3000:]
    assert failed["spark2"].startswith("spark2: the engine image dsv41:not-built is not on this node")
    assert {name: keys_on(name) for name in HOSTS} == dict.fromkeys(HOSTS, seed), "a refused run moved a cache"


def test_disagreeing_caches_are_planned_in_check_mode_then_moved_aside_on_every_rank_together(seed):
    checked = play("autotune.yml", extravars=keep_vars(), check=True, diff=True)
    assert checked.rc == 0, checked.stdout[-3000:]
    plan = plan_of(checked)
    assert sorted(plan["invalidate"]) == sorted(seed) and plan["usable"] == []
    for key in seed:
        assert any("no provenance recorded" in reason for reason in plan["reasons"][key])
    assert {name: keys_on(name) for name in HOSTS} == dict.fromkeys(HOSTS, seed), "check mode moved a cache"

    run = play("autotune.yml", extravars=keep_vars())
    assert run.rc == 0, run.stdout[-3000:]
    moves = {r["_host"]: r for r in run.results(module="autotune_cache") if r.get("moves")}
    assert set(moves) == set(HOSTS), "every rank moves its caches in the same task"
    asides = {r["aside_dir"].rsplit("/", 1)[-1] for r in moves.values()}
    assert len(asides) == 1, "every rank's caches go under one name"
    for name in HOSTS:
        assert keys_on(name) == set()
        aside = moves[name]["aside_dir"]
        for key in seed:
            assert node(name).file(f"{aside}/{key}/rank_tp{HOSTS[name][0]}_pp0_dp0.json").exists


def test_a_boot_with_the_keep_switch_tunes_pins_and_then_reuses_on_every_rank(seed):
    run = play("engine.yml", extravars=keep_vars())
    assert run.rc == 0, run.stdout[-3000:]
    for name in HOSTS:
        lines = this_boot(name)
        assert any("[autotune_keep] armed" in line for line in lines), name
        assert sum("[autotune_keep] tuned and saved" in line for line in lines) == 2, name
        for key in seed:
            assert node(name).file(f"{root(name)}/{key}/sparkfleet-provenance.json").exists, (name, key)

    replan = play("autotune.yml", extravars=keep_vars())
    assert replan.rc == 0, replan.stdout[-3000:]
    plan = plan_of(replan)
    assert sorted(plan["usable"]) == sorted(seed) and plan["invalidate"] == []
    assert replan.changed() == []

    restart = play("engine.yml", extravars=keep_vars(engine_state="restarted"))
    assert restart.rc == 0, restart.stdout[-3000:]
    for name in HOSTS:
        lines = this_boot(name)
        reused = [line for line in lines if "[autotune_keep] reused" in line]
        assert len(reused) == 2, (name, lines)
        assert not any("disagree" in line or "Running FlashInfer autotune" in line for line in lines), name


def test_a_key_missing_on_one_rank_is_moved_aside_on_every_rank(seed):
    """After the keep boot above, both keys are pinned and reusable; one rank losing one key makes every rank
    move that key aside and keep the other."""
    key = sorted(seed)[0]
    node("spark3").check_output(f"rm -rf {root('spark3')}/{key}")
    run = play("autotune.yml", extravars=keep_vars())
    assert run.rc == 0, run.stdout[-3000:]
    plan = plan_of(run)
    assert plan["invalidate"] == [key] and plan["usable"] == sorted(seed - {key})
    assert any(re.search(r"rank 2 \(spark3\) has no cache for this key", r) for r in plan["reasons"][key])
    for name in HOSTS:
        assert keys_on(name) == seed - {key}, name
