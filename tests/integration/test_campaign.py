"""The unattended campaign on the testbed (playbooks/campaign.yml, docs/campaign.md): rungs decided by the keep
rule with the simulator's calibrated effects (docs/reference.md section 10), a window that closes mid-plan, a
controller killed mid-rung and resumed, bad input refused before any change."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT, run_playbook, state_dir

pytestmark = pytest.mark.testbed
PLANS = Path(__file__).parent / "fixtures" / "campaigns"
INCUMBENT = ROOT / "inventory" / "testbed" / "group_vars" / "all" / "incumbent.yml"
# As in test_rollout.py: a quarter of real time keeps the benchmark's noise near 1%.
# conftest.py's serving_fleet fixture boots the fleet on this incumbent.
SLOW_SIM = 'engine_env_incumbent:\n  SIM_TIME_SCALE: "0.25"\n  SIM_RENDEZVOUS_TIMEOUT_S: "20"\n'


def campaign(plan: str, window_end: str = "2h", **extra):
    run = run_playbook("campaign.yml", extravars={"window_confirmed": True, "window_end": window_end,
                                                  "campaign_plan": str(PLANS / plan), **extra})
    # The campaign's folder as its own init step names it (another campaign started meanwhile, a bad-input
    # test for one, makes the newest *-campaign folder of runs/ the wrong one).
    inits = [r for r in run.results(module="campaign_step") if r.get("state_file")]
    if inits:
        run.run_dir = str(Path(inits[0]["state_file"]).parent)
    state = json.loads(Path(run.run_dir, "campaign-state.json").read_text()) if run.run_dir and \
        Path(run.run_dir, "campaign-state.json").is_file() else {}
    return run, state


def campaign_command(plan) -> tuple[Path, dict, list]:
    """The runs folder, environment and argv of `campaign.yml` on `plan` with a 2 h window, for the tests that
    start ansible-playbook themselves (to kill it or to act while it runs)."""
    runs = Path(os.environ.get("SPARKFLEET_RUNS_DIR") or ROOT / "runs")
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), SPARKFLEET_RUNS_DIR=str(runs),
               SPARKFLEET_TESTBED_STATE=str(state_dir()),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    playbook = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), str(ROOT / "playbooks" / "campaign.yml"),
                "-i", str(ROOT / "inventory" / "testbed"), "-e", "window_confirmed=true", "-e", "window_end=2h",
                "-e", f"campaign_plan={plan}"]
    return runs, env, playbook


def progress_gaps(run) -> list[float]:
    """Seconds between consecutive lines the rung loop prints (progress lines and each rung's decision), from
    the first rung's start to the last rung's end (their events' creation times)."""
    import datetime as dt

    printed = [dt.datetime.fromisoformat(ev["created"]) for ev in run.events if ev.get("event") == "runner_on_ok"
               and (ev["event_data"].get("task") == "Progress"
                    or ev["event_data"].get("task", "").startswith(("Say what the rung decided", "Start ")))]
    return [(b - a).total_seconds() for a, b in zip(printed, printed[1:])]


def rung_events(rung_dir: str) -> list[dict]:
    """The events of a rung's nested run (nested_play keeps them in <rung>/runner/artifacts/nested/job_events)."""
    folder = Path(rung_dir, "runner", "artifacts", "nested", "job_events")
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json")) if p.name.split("-", 1)[0].isdigit()]


def outcomes(state: dict) -> dict:
    return {r["id"]: (r["status"], r.get("outcome")) for r in state["rungs"]}


def container_env(host, name: str) -> list:
    return json.loads(host(name).check_output("docker container inspect "
                                              + ("dsv41-head" if name == "spark1" else "dsv41-worker")))[0]["Config"]["Env"]


# In `make integration` (issue 23: `make test` runs a 3-rung campaign): 486 s with the fixture at load 4-6 before
# the bench client was installed once per rollout instead of once per arm, the arms' own reports (overwritten by
# the rollout's) dropped and the host change's nested playbook stopped repeating the preflight (docs/campaign.md).
def test_a_three_rung_campaign_keeps_its_winner_and_reports_the_night(serving_fleet, host):
    started = time.monotonic()
    run, state = campaign("testbed-3.yml")
    wall = time.monotonic() - started
    assert run.rc == 0, run.stdout[-4000:]
    assert outcomes(state) == {"01-pack_engram": ("done", "kept"), "02-folded_fence": ("done", "reverted"),
                               "03-dspark_block_5": ("done", "reverted"), "04-keep_best": ("skipped", None),
                               "05-combination": ("skipped", None)}, outcomes(state)
    assert state["kept"] == ["pack_engram"] and "pack_engram" in INCUMBENT.read_text()
    assert "DSPARK_BLOCK_SIZE=5" not in container_env(host, "spark2")
    report = Path(run.run_dir, "REPORT.md").read_text()
    assert "| 01-pack_engram | A | pack_engram | prose c1: " in report and "| kept |" in report
    assert "04-keep_best keep_best: no single experiment won its trial" in report
    cumulative = report.split("## Cumulative gain")[1].split("##")[0]
    assert "(first baseline, 01-pack_engram/bench-incumbent.json)" in cumulative
    assert "(final configuration, 01-pack_engram/bench-candidate.json)" in cumulative
    assert Path(run.run_dir, "plots", "rungs.png").is_file() and Path(run.run_dir, "plots", "cumulative.png").is_file()
    # progress lines during the rungs, and a closing summary under 40 lines
    assert "stage A, rung 1/5 01-pack_engram (host): " in run.stdout and "elapsed, about" in run.stdout
    summary = [r for r in run.results(task="Summary") if r.get("msg")][0]["msg"]
    assert len(summary) < 40 and summary[-1] == "Fleet proven on its incumbent: yes"
    # the bench client is read once per rollout (its incumbent arm), not again for the candidate arm, and shipped
    # only where it is not current: at most by the first rung, never again by a later one (an identical copy)
    for index, rung in enumerate(state["rungs"][:3]):
        shipped = [ev for ev in rung_events(rung["run_dir"]) if ev.get("event") == "runner_on_ok"
                   and ev["event_data"].get("task") == "Ship the client from the controller"]
        assert len(shipped) <= (1 if index == 0 else 0), (rung["id"], len(shipped))
        read = [ev for ev in rung_events(rung["run_dir"]) if ev.get("event") == "runner_on_ok" and ev["event_data"].get(
            "task") == "Read the client this host has (Python version, its files' digests, whether it runs; changes nothing)"]
        assert len(read) == 1, (rung["id"], len(read))
        # the preflight the campaign ran before its first rung is skipped in the rung as one task (playbooks/
        # preflight.yml includes its role), not as every task of the role on every host, at each of the
        # rollout's three imports of validate_inventory.yml; the restore point reads each rank in one call (its
        # display manager and quiesce record too: no separate stat and systemctl turns)
        started = [ev["event_data"].get("task") for ev in rung_events(rung["run_dir"]) if ev.get("event") == "playbook_on_task_start"]
        assert "Check the allow-lists and the fabric settings" not in started, rung["id"]
        assert started.count("Read this rank's display manager, quiesce record, containers and engine log") == 1, rung["id"]
        assert not {"Find the display manager", "Read when the quiesce record was last written"} & set(started), rung["id"]
        assert Path(rung["run_dir"], "report.md").is_file() and Path(rung["run_dir"], "plots", "decode_tok_s.png").is_file()
        # a reverted rung's report is drawn in the background while the fleet restores, a kept one's after its
        # incumbent file is written (docs/campaign.md "ov12")
        drawn_aside = any(ev.get("event") == "runner_on_ok" and ev["event_data"].get("task") == "Collect the report drawn "
                          "while the fleet restored" for ev in rung_events(rung["run_dir"]))
        assert drawn_aside == (rung["outcome"] != "kept"), (rung["id"], rung["outcome"])
    # the pack's own run (rollout.yml boots the candidate itself: engram_restart_engine=false) starts no task of
    # engine.yml's plays nor of the restart decision and packed=True verification: those plays match no host
    apply = [json.loads(p.read_text()) for p in sorted(Path(state["rungs"][0]["run_dir"], "apply", "runner", "artifacts",
                                                            "nested", "job_events").glob("*.json"))
             if p.name.split("-", 1)[0].isdigit()]
    apply_tasks = [ev["event_data"] for ev in apply if ev.get("event") == "playbook_on_task_start"]
    assert any(t.get("task") == "Pack this rank's Engram shards" for t in apply_tasks)
    assert not [t["task"] for t in apply_tasks if t.get("role") in ("engine", "engine_env")
                or t.get("task", "").startswith(("Check whether the running engine", "Check this rank's shards"))]
    gaps = progress_gaps(run)
    print(f"3-rung campaign: {wall:.0f} s wall; the campaign's own time {state.get('overhead')}; "
          f"{len(gaps)} progress gaps, max {max(gaps, default=0):.1f} s")


def test_bad_input_is_refused_before_any_change(testbed, tmp_path):
    cycle = tmp_path / "cycle"
    cycle.mkdir()
    for name, prereq in (("loop_a", "loop_b"), ("loop_b", "loop_a")):
        (cycle / f"{name}.yml").write_text(
            f"name: {name}\nstage: H\ndescription: x\napply: {{env: {{DSV41_{name.upper()}: '1'}}}}\n"
            f"prerequisites: [{prereq}]\nmarkers_on: []\nmarkers_off: []\nmemory: {{delta_mib_per_rank: 0}}\n"
            "exact_outputs: true\nworkloads: {types: [prose], concurrency: [1], primary: {type: prose, concurrency: 1}}\n")
    plan = ("name: bad\nexperiments: [{}]\ncatalog: [{}]\nrung_budget_s: 60\nrestore_budget_s: 30\n")
    (tmp_path / "unknown.yml").write_text(plan.format("folded_fence, warp_drive", str(cycle)))
    (tmp_path / "cycle.yml").write_text(plan.format("loop_a, loop_b", str(cycle)))
    for plan_file, window, text in ((tmp_path / "unknown.yml", "2h", "unknown experiment 'warp_drive'"),
                                    (tmp_path / "cycle.yml", "2h", "prerequisite cycle: loop_a -> loop_b -> loop_a"),
                                    (PLANS / "testbed-3.yml", "2020-01-01T06:00", "window_end=2020-01-01T06:00 is already over"),
                                    (PLANS / "testbed-3.yml", "4m", "less than one rung and its restore")):
        run = run_playbook("campaign.yml", extravars={"window_confirmed": True, "window_end": window,
                                                      "campaign_plan": str(plan_file)})
        assert run.rc != 0 and text in run.stdout and "Nothing was changed." in run.stdout, (text, run.stdout[-2000:])
        assert not run.results(module="engine_container") and not run.results(module="nested_play")
    run = run_playbook("campaign.yml", extravars={"window_end": "2h"})
    assert run.rc != 0 and "-e window_confirmed=true" in run.stdout


# Two clients on the head itself, each sending one long request after another (ignore_eos: the simulator
# ends this prompt after a few tokens otherwise), so one is always in flight.
BUSY_CLIENTS = """
import json, threading, time, urllib.request
body = json.dumps({"model": "DeepSeek-V4.1-Flash", "max_tokens": 4000, "temperature": 0, "ignore_eos": True,
                   "messages": [{"role": "user", "content": "Write a long story about the sea."}]}).encode()
def client():
    while True:
        try:
            urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:8888/v1/chat/completions", body,
                                                          {"Content-Type": "application/json"}), timeout=600).read()
        except OSError:
            time.sleep(0.2)
for _ in range(2):
    threading.Thread(target=client, daemon=True).start()
    time.sleep(1)
while True:
    time.sleep(60)
"""


@pytest.mark.slow
def test_a_busy_fleet_is_refused_before_any_change(serving_fleet):
    """Requests in flight on the head for the whole run: the campaign's read-only fleet check refuses (the
    rollout's own check). The first version sent one request from the test's own namespace, which cannot
    reach the head's address: the head was idle at the check and the campaign ran its first rung."""
    from tests.integration.conftest import FLEET

    clients = subprocess.Popen(FLEET + ["exec", "spark1", "--", "python3", "-c", BUSY_CLIENTS],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(3)
        run, _ = campaign("testbed-3.yml")
    finally:
        os.killpg(clients.pid, signal.SIGTERM)
        clients.wait()
    assert run.rc != 0 and "a rollout needs an idle fleet. Nothing was changed." in run.stdout, run.stdout[-2000:]
    assert not run.results(module="nested_play") and not run.results(module="engine_container")


@pytest.mark.slow
def test_the_window_closes_mid_plan_and_the_fleet_stays_on_its_proven_incumbent(serving_fleet, host, tmp_path):
    """A window that holds rung 1 (the plan's 10 s estimate plus 60 s to restore, with the campaign's ~25 s of
    start) but not rung 2 once rung 1 is measured (rung 1's own time plus the restore: more than is left whenever
    rung 1 takes over ~35 s; pack_engram took 59 s at load 3-5). The first version gave all three rungs 10 min:
    on the real engine (2026-12-04) they took 113 + 93 + 159 s and all fit, nothing was left unreached."""
    plan = tmp_path / "plan.yml"
    plan.write_text((PLANS / "testbed-3.yml").read_text().replace("rung_budget_s: 300", "rung_budget_s: 10"))
    run, state = campaign(str(plan), window_end="2m30s")
    assert run.rc == 0, run.stdout[-3000:]
    statuses = [r["status"] for r in state["rungs"]]
    assert "not_reached" in statuses, outcomes(state)
    assert state["stopped"] and "the window closes" in state["stopped"]["reason"]
    report = Path(run.run_dir, "REPORT.md").read_text()
    section = report.split("## Not reached before the window closed")[1].split("##")[0]
    assert "02-folded_fence" in section or "03-dspark_block_5" in section
    # the fleet serves the incumbent it was proven on (pack_engram kept, or nothing)
    assert not any("DSPARK_BLOCK_SIZE=5" in e or "DSV41_FOLDED_FENCE=1" in e for e in container_env(host, "spark1"))
    assert "Fleet proven on its incumbent: yes" in run.stdout


@pytest.mark.slow
def test_kill_9_of_the_controller_mid_rung_then_resume(serving_fleet, host):
    """The controller dies in the middle of rung 2 (kill -9 of ansible-playbook); -e resume=<run folder> proves
    or restores the fleet, finishes the rung from its own evidence or runs it again, never reruns rung 1, and
    ends as an uninterrupted campaign does (the cap kept, the report complete)."""
    runs, env, playbook = campaign_command(PLANS / 'testbed-3.yml')
    before = set(os.listdir(runs)) if runs.is_dir() else set()
    proc = subprocess.Popen(playbook, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    folder = None
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        new = sorted(d for d in set(os.listdir(runs)) - before if d.endswith("-campaign"))
        if new:
            folder = runs / new[-1]
            rung2 = folder / "rungs" / "02-folded_fence"
            if (rung2 / "boot-logs" / "candidate").is_dir():
                break
        time.sleep(2)
    assert folder is not None, "the campaign never reached rung 2"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed = json.loads((folder / "campaign-state.json").read_text())
    assert [r["status"] for r in killed["rungs"]][:2] == ["done", "running"]
    resumed = run_playbook("campaign.yml", extravars={"window_confirmed": True, "resume": str(folder)})
    assert resumed.rc == 0, resumed.stdout[-4000:]
    state = json.loads((folder / "campaign-state.json").read_text())
    assert outcomes(state) == {"01-pack_engram": ("done", "kept"), "02-folded_fence": ("done", "reverted"),
                               "03-dspark_block_5": ("done", "reverted"), "04-keep_best": ("skipped", None),
                               "05-combination": ("skipped", None)}, outcomes(state)
    assert state["rungs"][0]["started"] == killed["rungs"][0]["started"], "rung 1 must not run again"
    assert "DSV41_FOLDED_FENCE=1" not in container_env(host, "spark1") and "pack_engram" in INCUMBENT.read_text()
    assert "## Roll the whole campaign back" in (folder / "REPORT.md").read_text()


@pytest.mark.slow
def test_a_six_rung_campaign_gets_every_verdict_right(serving_fleet, host):
    run, state = campaign("testbed-6.yml", window_end="3h")
    got = outcomes(state)
    assert got["01-folded_fence"] == ("done", "reverted")
    assert got["02-wo_a_w8"] == ("done", "failed")           # spark3's KV budget cannot hold the twins
    assert got["03-prefetch_direct"] == ("done", "kept")     # won its trial
    assert got["04-wo_a_drop"][0] == "skipped"               # its parent was not kept
    assert got["05-verify_cap_conf01"] == ("done", "kept")   # won its trial
    assert got["06-mem_fraction_099"] == ("done", "failed")  # NV_ERR_NO_MEMORY
    # measured, not failed: its marker is one every rank prints (the first run, 2026-12-04, required rank 0's
    # max_running_requests=8 and failed on both workers)
    assert got["07-slots_8"] in (("done", "kept"), ("done", "reverted")) and state["rungs"][6]["kind"] == "operator_call"
    assert got["08-keep_best"] == ("done", "kept") and got["09-combination"][0] == "done"
    # the best single is recorded as kept (the first run recorded kept [] and then failed on the combination)
    assert state["rungs"][7]["best"] in ("prefetch_direct", "verify_cap_conf01") and state["rungs"][7]["best"] in state["kept"]
    assert got["10-curve"] == ("done", "measured") and state["stopped"] is None
    report = Path(run.run_dir, "REPORT.md").read_text()
    assert "BOOT FAILED in" in report and "NV_ERR_NO_MEMORY" in report
    logs = Path(state["rungs"][5]["run_dir"], "boot-logs", "candidate")
    assert "NV_ERR_NO_MEMORY" in (logs / "spark2-rank1-dsv41-worker.log").read_text()
    operator = report.split("## Operator's call")[1].split("##")[0]
    assert "slots_8" in operator
    # measured on its primary workload (prose c8) although the plan measures prose c1: numbers, not "too few
    # samples (candidate 0, incumbent 0)" as on 2026-12-04
    slots = state["rungs"][6]
    assert slots["result"]["decision"]["ratio"] is not None, slots["result"]
    assert json.loads(Path(slots["run_dir"], "rung-vars.json").read_text())["rollout_concurrency"] == [1, 8]
    assert "- slots_8: prose c8 " in operator and "too few samples" not in operator and "aggregate " in operator, operator
    assert "slots_8" not in state["kept"] and "MAX_RUNNING_REQUESTS=8" not in container_env(host, "spark1")
    assert run.rc == 0, run.stdout[-3000:]


@pytest.mark.slow
def test_a_failed_campaign_step_still_proves_the_fleet_and_reports(serving_fleet, host, tmp_path):
    """A step of the campaign itself fails mid-plan (not a rung's verdict): the plan file is removed while rung
    1 runs (a real fault: the file is gone, as a cleaned temporary folder or a checkout that drops it would
    leave it), so the next `What now` step, which reads it, fails. The fleet must still be proven on its
    incumbent, REPORT.md must name the failure and what was not reached, and the play must fail saying so.
    Before the rescue in campaign.yml the play ended at that step: no proof, no REPORT.md, no summary."""
    plan = tmp_path / "plan.yml"
    plan.write_text((PLANS / "testbed-3.yml").read_text()
                    .replace("[pack_engram, folded_fence, dspark_block_5]", "[folded_fence, dspark_block_5]"))
    runs, env, playbook = campaign_command(plan)
    before = set(os.listdir(runs)) if runs.is_dir() else set()
    out = tmp_path / "stdout.txt"
    with out.open("w") as fh:
        proc = subprocess.Popen(playbook, env=env, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
        folder = None
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline and proc.poll() is None:
            new = sorted(d for d in set(os.listdir(runs)) - before if d.endswith("-campaign"))
            state_file = runs / new[-1] / "campaign-state.json" if new else None
            if state_file and state_file.is_file() and \
                    json.loads(state_file.read_text())["rungs"][0]["status"] == "running":
                folder = runs / new[-1]
                plan.unlink()
                break
            time.sleep(2)
        assert folder is not None, "the campaign never started rung 1"
        rc = proc.wait(timeout=1800)
    stdout = out.read_text()
    assert rc != 0, stdout[-3000:]
    assert "The campaign stopped: a step of the campaign failed: 'What now'" in stdout, stdout[-3000:]
    assert "cannot read the plan file" in stdout
    state = json.loads((folder / "campaign-state.json").read_text())
    got = outcomes(state)
    assert got["01-folded_fence"] == ("done", "reverted"), got      # rung 1 ended and was recorded
    assert [got[r] for r in ("02-dspark_block_5", "03-keep_best", "04-combination")] == [("not_reached", None)] * 3, got
    assert state["stopped"]["fleet_failure"] and "cannot read the plan file" in state["stopped"]["reason"]
    # proven on the incumbent (the proof ran), reported (the failure and what was not reached), summary printed
    assert (folder / "proof").is_dir() and "Fleet proven on its incumbent: yes" in stdout
    report = (folder / "REPORT.md").read_text()
    assert "**Stopped early**: a step of the campaign failed: 'What now'" in report
    section = report.split("## Not reached before the window closed")[1].split("##")[0]
    assert "02-dspark_block_5" in section and "03-keep_best" in section
    assert "| 01-folded_fence | C | folded_fence | prose c1: " in report
    assert "DSV41_FOLDED_FENCE=1" not in container_env(host, "spark1")
