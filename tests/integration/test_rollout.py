"""Maintenance-window rollouts on the testbed: failed, neutral and marker-less changes end reverted with
the fleet proven back; a winning change is kept; a ladder keeps its winners as a verified combination;
rollback restores a chosen run exactly."""
from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT, ensure_testbed, locked, run_playbook

pytestmark = pytest.mark.testbed
FIXTURES = Path(__file__).parent / "fixtures"
INCUMBENT = ROOT / "inventory" / "testbed" / "group_vars" / "all" / "incumbent.yml"
# The simulator at the testbed's default time scale (0.25: 25 ms steps, docs/simulator.md); a rank that never
# joins fails the others' rendezvous after 20 s instead of 90.
# conftest.py's serving_fleet fixture boots the fleet on this incumbent.
SLOW_SIM = 'engine_env_incumbent:\n  SIM_RENDEZVOUS_TIMEOUT_S: "20"\n'
FAST = {"rollout_types": ["prose"], "rollout_concurrency": [1], "rollout_reps": 5, "rollout_warmup": 1,
        "rollout_max_tokens": 48, "window_confirmed": True}


def containers(run_dir_record: dict) -> dict:
    return {h: (r["env"], r["image_id"]) for h, r in run_dir_record["ranks"].items()}


def rollout(**extra):
    run = run_playbook("rollout.yml", extravars={**FAST, **extra})
    result = json.loads(Path(run.run_dir, "rollout.json").read_text()) if run.run_dir else {}
    return run, result


@pytest.mark.slow
def test_failed_neutral_and_markerless_changes_are_reverted(serving_fleet, host):
    run, result = rollout(experiment_file=str(FIXTURES / "experiments" / "mem_fraction_099.yml"))
    assert result["outcome"] == "failed" and run.rc != 0
    assert any("NV_ERR_NO_MEMORY" in r or "failed to boot" in r for r in result["reasons"]), result["reasons"]
    logs = sorted(p.name for p in Path(run.run_dir, "boot-logs", "candidate").glob("*.log"))
    assert [n for n in logs if not n.endswith(".replaced.log")] == [
        "spark1-rank0-dsv41-head.log", "spark2-rank1-dsv41-worker.log", "spark3-rank2-dsv41-worker.log"]
    assert "NV_ERR_NO_MEMORY" in Path(run.run_dir, "boot-logs", "candidate", "spark2-rank1-dsv41-worker.log").read_text()
    restore = json.loads(Path(run.run_dir, "restore-point.json").read_text())
    assert result["restore_ok"] and all(r["ok"] for r in result["restored"].values())
    for name, (env, image) in containers(restore).items():
        now = json.loads(host(name).check_output(f"docker container inspect {restore['ranks'][name]['container']}"))[0]
        assert sorted(now["Config"]["Env"]) == env and now["Image"] == image

    run, result = rollout(experiment="folded_fence")
    assert run.rc == 0 and result["outcome"] == "reverted", result
    assert any("gain not shown" in r for r in result["reasons"])

    run, result = rollout(experiment_file=str(FIXTURES / "experiments" / "fast_without_marker.yml"))
    assert result["outcome"] == "failed"
    assert any("did not print the marker [prefetch_turbo] armed" in r for r in result["reasons"]), result["reasons"]
    assert result["restore_ok"]


@pytest.mark.slow
def test_a_host_change_runs_its_playbook_and_its_revert(serving_fleet, host):
    """clocks_unlocked changes hosts through playbooks (site.yml --tags clock_lock): the nested apply run
    unlocks the simulated GPU clocks on every node, and, the change not being kept (the simulator does not
    care about clocks), the nested revert run locks them again. Each nested run keeps its own record."""
    lock = run_playbook("site.yml", tags="clock_lock", extravars={"preflight_skip": True})
    assert lock.rc == 0 and all(locked(host, n) for n in ("spark1", "spark2", "spark3")), lock.stdout[-2000:]
    run, result = rollout(experiment="clocks_unlocked")
    assert result["outcome"] == "reverted", result
    assert json.loads(Path(run.run_dir, "apply-vars.json").read_text()) == {"clock_lock_state": "unlocked"}
    assert Path(run.run_dir, "apply").is_dir() and Path(run.run_dir, "revert").is_dir()
    assert all(locked(host, n) for n in ("spark1", "spark2", "spark3"))


@pytest.mark.slow
def test_packing_is_kept_then_rollback_restores_the_earlier_run(serving_fleet, host):
    run, result = rollout(experiment="pack_engram")
    assert run.rc == 0 and result["outcome"] == "kept", result
    assert result["decision"]["ratio"] > 1.05
    assert "pack_engram" in INCUMBENT.read_text()
    kept_run = Path(run.run_dir).name

    run, result = rollout(experiment="block_verify")
    assert result["outcome"] in ("reverted", "kept")

    # Rolling back to before pack_engram undoes a host change: refused, changing nothing, until its revert is asked for.
    refused = run_playbook("rollback.yml", extravars={"run": kept_run})
    assert refused.rc != 0
    assert f"-e run={kept_run} -e rollback_revert_host_changes=true" in refused.stdout, refused.stdout[-2000:]
    assert "Nothing was changed." in refused.stdout
    back = run_playbook("rollback.yml", extravars={"run": kept_run, "rollback_revert_host_changes": True})
    assert back.rc == 0, back.stdout[-2000:]
    restore = json.loads(Path(ROOT, "runs", kept_run, "restore-point.json").read_text())
    for name, (env, image) in containers(restore).items():
        now = json.loads(host(name).check_output(f"docker container inspect {restore['ranks'][name]['container']}"))[0]
        assert sorted(now["Config"]["Env"]) == env and now["Image"] == image


@pytest.fixture
def serving_clean_fleet():
    """A quiet fleet (scenario clean): on the seed scenario spark3's desktop holds 0.35 GiB, which leaves its
    KV budget 0.68 GB, less than wo_a_w8's 688 MiB (the candidate fails to boot there, as it would on GB10)."""
    ensure_testbed(scenario="clean", fresh=True)
    INCUMBENT.write_text(SLOW_SIM)
    start = run_playbook("engine.yml")
    assert start.rc == 0, start.stdout[-2000:]
    yield
    INCUMBENT.unlink(missing_ok=True)
    ensure_testbed(fresh=True)


def test_a_memory_changing_experiment_is_kept_when_the_ledger_matches(serving_clean_fleet):
    """Issue 20 item 1: wo_a_w8 costs 688 MiB per rank (docs/reference.md section 5); the KV budget each rank prints
    (available_bytes=... GB) shrinks by that much, so the ledger holds and the measured gain keeps it."""
    run, result = rollout(experiment="wo_a_w8")
    assert run.rc == 0 and result["outcome"] == "kept", (result, run.stdout[-3000:])
    for host, led in result["memory"].items():
        assert led["checked"] and led["ok"], (host, led)
        assert abs(led["change_bytes"] + 688 * 1048576) <= 64 * 1048576, (host, led)
    assert "wo_a_w8" in INCUMBENT.read_text()
    assert "wo_a_w8: KEPT." in run.stdout


def test_a_no_effect_change_is_reverted_at_the_testbeds_default_time_scale(serving_fleet):
    """Issue 20 item 10: at the inventory's SIM_TIME_SCALE a neutral change (folded_fence: no modelled effect)
    measures ~1.00 against an incumbent whose CV is well under the 1.5 % the testbed promises, so the keep
    rule's bar stays near 1.01-1.03 and the change is reverted (at 0.05 the CV was 2.8-6.7 % and such a change
    was sometimes kept)."""
    run, result = rollout(experiment="folded_fence")
    assert run.rc == 0 and result["outcome"] == "reverted", (result, run.stdout[-3000:])
    decision = result["decision"]
    assert decision["incumbent_cv"] <= 0.015, decision
    assert decision["threshold"] <= 1.03 and 0.97 <= decision["ratio"] <= 1.03, decision
    assert any("gain not shown" in r for r in result["reasons"]), result["reasons"]
    assert result["restore_ok"]


@pytest.mark.slow
def test_decisions_repeat_five_of_five(serving_clean_fleet):
    """Issue 20 item 10, repeatably: five trials (measured and decided from the same incumbent, then always
    restored) of a neutral change are reverted and five of wo_a_w8 (the fp8 twins: ~-7.5 ms of a ~98 ms
    step in the model, +8 %) are kept; every incumbent CV stays under 1.5 %."""
    outcomes = {"folded_fence": [], "wo_a_w8": []}
    for _ in range(5):
        for name in outcomes:
            run, result = rollout(experiment=name, rollout_trial=True)
            assert run.rc == 0 and result["restore_ok"], (name, result, run.stdout[-3000:])
            outcomes[name].append((result["outcome"], result["decision"]["ratio"], result["decision"]["incumbent_cv"]))
    assert [o for o, _, _ in outcomes["folded_fence"]] == ["reverted"] * 5, outcomes
    assert [o for o, _, _ in outcomes["wo_a_w8"]] == ["kept"] * 5, outcomes
    assert all(cv <= 0.015 for runs in outcomes.values() for _, _, cv in runs), outcomes
    assert all(ratio > 1.05 for _, ratio, _ in outcomes["wo_a_w8"]), outcomes
    print(json.dumps(outcomes))


def test_a_failed_apply_ends_with_a_short_summary(serving_fleet):
    """Issue 20 item 3: a host change that fails on one rank ends the play with what failed, where, what was
    restored and where the evidence is; no internal error, no nested escaped JSON."""
    run, result = rollout(experiment_file=str(FIXTURES / "experiments" / "pack_without_relocation.yml"))
    assert run.rc != 0 and result["outcome"] == "failed", result
    assert any(r.startswith("applying the change failed on spark2 (rank 1): ") for r in result["reasons"]), result
    assert result["restore_ok"]
    final = [e["event_data"]["res"]["msg"] for e in run.events if e.get("event") == "runner_on_failed"][-1]
    assert final.startswith("pack_without_relocation: FAILED.")
    assert "on spark2 (rank 1)" in final and "Restored to the restore point and proven: spark1, spark2, spark3." in final
    assert f"Evidence: {run.run_dir}" in final
    assert "has no attribute" not in run.stdout and '\\"' not in final


def test_bad_input_stops_before_any_host_changes(testbed):
    for extra, text in (({"experiment": "no_such_thing", "window_confirmed": True}, "unknown experiment"),
                        ({"experiment": "folded_fence"}, "confirm the maintenance window"),
                        ({"experiment": "wo_a_drop", "window_confirmed": True}, "needs these experiments kept first: wo_a_w8")):
        run = run_playbook("rollout.yml", extravars=extra)
        assert run.rc != 0 and text in run.stdout, (extra, run.stdout[-1500:])
        assert not run.results(module="engine_container")


@pytest.mark.slow
def test_ladder_keeps_its_winners_as_a_verified_combination(serving_fleet):
    run = run_playbook("ladder.yml", extravars={"ladder": str(FIXTURES / "ladder-three.yml"), "window_confirmed": True})
    ladder = json.loads(Path(run.run_dir, "ladder.json").read_text())
    outcomes = {t["name"]: t["result"]["outcome"] for t in ladder["trials"]}
    # In the simulator a block of 5 accepts more but loses tok/s on prose (docs/reference.md section 8), the fence is
    # neutral and the confidence cap wins ~2%.
    assert outcomes == {"dspark_block_5": "reverted", "folded_fence": "reverted", "verify_cap_conf01": "kept"}, outcomes
    assert ladder["winners"] == ["verify_cap_conf01"]
    assert all(t["result"]["restore_ok"] for t in ladder["trials"])
    assert ladder["combination"]["outcome"] == "kept", ladder["combination"]
    kept = INCUMBENT.read_text()
    for name in ladder["winners"]:
        assert name in kept
    assert "DSV41_VERIFY_CAP" in kept and "DSPARK_BLOCK_SIZE" not in kept and run.rc == 0


# The head's step model (/server_info, read inside its container): the terms of one prose step at c1.
STEP_TERMS = ("import json, urllib.request\n"
              "try:\n    key = open('/state/api-key').read().strip()\nexcept OSError:\n    key = ''\n"
              "headers = {'Authorization': 'Bearer ' + key} if key else {}\n"
              "req = urllib.request.Request('http://127.0.0.1:8888/server_info', headers=headers)\n"
              "print(json.dumps(json.load(urllib.request.urlopen(req, timeout=30))['step_model']['terms']))\n")


def step_terms(host) -> dict:
    return json.loads(host("spark1").check_output(f"docker exec dsv41-head python3 -c {shlex.quote(STEP_TERMS)}"))


def test_quiesce_is_kept_with_the_gain_the_model_gives_it(serving_fleet, host):
    """Issue 22: on the real engine spark3's 19 running containers cost its rank nothing (the simulator looked
    for the removed stand-in's folder), so quiesce could only be reverted. Now the rank feels them (0.15 ms a
    step each), spark3 is the straggler, and quiesce rolled out as the operator does
    (`rollout.yml -e experiment=quiesce -e window_confirmed=true`) is kept with the model's gain, ~3 %."""
    before = step_terms(host)
    assert before["straggler_rank"] == 2 and before["per_rank"][2]["contention_ms"] >= 19 * 0.15, before
    try:
        run, result = rollout_as_operator(experiment="quiesce")
        assert run.rc == 0 and result["outcome"] == "kept", (result, run.stdout[-3000:])
        after = step_terms(host)
        assert before["per_rank"][2]["contention_ms"] - after["per_rank"][2]["contention_ms"] == pytest.approx(19 * 0.15)
        modelled = before["step_ms"] / after["step_ms"]          # decode tok/s ratio at prose c1 (acceptance unchanged)
        assert 1.02 < modelled < 1.04, (before, after)
        assert result["decision"]["ratio"] == pytest.approx(modelled, abs=0.015), (result["decision"], modelled)
        assert "quiesce" in INCUMBENT.read_text()
        assert all(st != "running" for n, st in (line.split() for line in host("spark3").check_output(
            "docker ps -a --format '{{.Names}} {{.State}}'").splitlines()) if not n.startswith("dsv41-"))
    finally:
        restored = run_playbook("site.yml", tags="quiesce", extravars={"preflight_skip": True, "quiesce_state": "restored"})
        assert restored.rc == 0, restored.stdout[-2000:]


def rollout_as_operator(**extra):
    """rollout.yml with the operator's settings (the experiment's workloads, the role's defaults)."""
    run = run_playbook("rollout.yml", extravars={"window_confirmed": True, **extra})
    result = json.loads(Path(run.run_dir, "rollout.json").read_text()) if run.run_dir else {}
    return run, result


def quiesce_kept_since(tmp_path) -> tuple[str, Path, str]:
    """A rollout run whose restore point predates a kept quiesce (a host change), with an image no rank has
    (sha256:0...), and the incumbent file that keeps quiesce now: (run name, its folder, the incumbent text)."""
    runs = Path(os.environ.get("SPARKFLEET_RUNS_DIR") or ROOT / "runs")
    name = f"{tmp_path.name}-rollout"
    folder = runs / name
    folder.mkdir(parents=True)
    (folder / "restore-point.json").write_text(json.dumps({
        "experiment": "quiesce", "incumbent": {"engine_env_incumbent": {}, "engine_env_incumbent_unset": [],
                                               "incumbent_experiments": []},
        "ranks": {h: {"host": h, "container": "dsv41-head" if h == "spark1" else "dsv41-worker",
                      "image_id": "sha256:" + "0" * 64, "image_ref": "x", "env": []}
                  for h in ("spark1", "spark2", "spark3")}}))
    kept = "incumbent_experiments: [quiesce]\nengine_env_incumbent: {}\nengine_env_incumbent_unset: []\n"
    INCUMBENT.write_text(kept)
    return name, folder, kept


def test_rollback_over_a_kept_host_change_refuses_with_the_command_that_reverts_it(testbed, tmp_path):
    """Issue 20 item 4: quiesce (a host change: site.yml --tags quiesce) is kept now but was not at the run's
    restore point; booting the older env cannot undo it, so the rollback refuses before touching a host,
    names the command that runs the revert, and leaves the incumbent file as it is."""
    name, folder, kept = quiesce_kept_since(tmp_path)
    try:
        back = run_playbook("rollback.yml", extravars={"run": name})
        assert back.rc != 0
        assert ("undoes quiesce, which changed the hosts" in back.stdout
                and f"playbooks/rollback.yml -e run={name} -e rollback_revert_host_changes=true" in back.stdout), \
            back.stdout[-3000:]
        assert "site.yml --tags quiesce" in back.stdout and '"quiesce_state": "restored"' in back.stdout
        assert INCUMBENT.read_text() == kept
        assert not back.results(module="engine_container")
    finally:
        INCUMBENT.unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)

def test_rollback_checks_every_recorded_image_before_reverting_host_changes(testbed, tmp_path):
    """A rollback asked to revert a kept host change (rollback_revert_host_changes=true) whose restore point
    names an image a rank no longer has must refuse before the revert runs: reverting the hosts and then
    failing on the image would leave the fleet half rolled back while the message says nothing changed."""
    name, folder, kept = quiesce_kept_since(tmp_path)
    try:
        back = run_playbook("rollback.yml", extravars={"run": name, "rollback_revert_host_changes": True})
        assert back.rc != 0
        assert "no longer has image sha256:" + "0" * 64 in " ".join(back.stdout.split()), back.stdout[-3000:]
        reverts = [r for r in back.results(task="host change's revert step") if r["_event"] != "runner_on_skipped"]
        assert not reverts, reverts
        assert not list(Path(back.run_dir).glob("revert-*")), sorted(os.listdir(back.run_dir))
        assert INCUMBENT.read_text() == kept
    finally:
        INCUMBENT.unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)
