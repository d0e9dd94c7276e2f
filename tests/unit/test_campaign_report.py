"""The morning report: a table of rungs, cumulative gain with its interval, blocked items with their evidence,
operator's call, not reached, the rollback command; plots; a terminal summary under 40 lines."""
import datetime as dt
import json
import shutil
from pathlib import Path

from ansible.module_utils import campaign_state as cs
from ansible.module_utils.bench_stats import bootstrap_ratio_ci
from ansible.module_utils.campaign_plan import load_plan, rungs
from ansible.module_utils.campaign_report import seconds_to_failure, write

ROOT = Path(__file__).resolve().parents[2]
NOW = dt.datetime(2026, 12, 2, 23, 0, tzinfo=dt.timezone.utc)
FAILED_LOG = ROOT / "tests/unit/fixtures/boot_logs/failed_nv_err_no_memory.log"


def bench(folder: Path, label: str, values, code=None):
    conds = [{"type": "prose", "concurrency": 1, "valid": True, "samples": {"decode_tok_s": list(values)}}]
    if code:
        conds.append({"type": "code", "concurrency": 1, "valid": True, "samples": {"decode_tok_s": list(code)}})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"bench-{label}.json").write_text(json.dumps({"conditions": conds}))


def test_the_morning_report_tells_the_whole_night(tmp_path):
    paths = {}
    plan, catalog = load_plan(str(ROOT / "tests/integration/fixtures/campaigns/testbed-6.yml"), str(ROOT / "experiments"), paths)
    state = cs.new_state("testbed-6.yml", plan, rungs(plan, catalog), "1h", NOW + dt.timedelta(hours=1), NOW, [],
                         str(tmp_path))
    state["paths"] = paths
    base = [100.0, 100.5, 99.8, 100.2, 100.1]
    outcomes = iter([("reverted", base, None), ("failed", None, None), ("kept", [103, 103.2, 102.9, 103.1, 103.0], 1.03)])
    for _ in range(3):
        step = cs.next_action(state, catalog, NOW)
        r = cs.start(state, step["rung"], NOW, step)
        outcome, cand, ratio = next(outcomes)
        folder = Path(r["run_dir"])
        bench(folder, "incumbent", base)
        (folder / "restore-point.json").parent.mkdir(parents=True, exist_ok=True)
        (folder / "restore-point.json").write_text("{}")
        if cand:
            bench(folder, "candidate", cand)
        if outcome == "failed":
            (folder / "boot-logs" / "candidate").mkdir(parents=True)
            shutil.copy(FAILED_LOG, folder / "boot-logs" / "candidate" / "spark2-rank1-dsv41-worker.log")
        decision = {"ratio": ratio, "ci": [ratio - 0.002, ratio + 0.002], "threshold": 1.01} if ratio else None
        cs.finish(state, step["rung"], NOW + dt.timedelta(minutes=5), {
            "outcome": outcome, "restore_ok": True, "decision": decision,
            "reasons": ["rank 1 (spark2) failed to boot the candidate: NV_ERR_NO_MEMORY"] if outcome == "failed" else []})
    skip = cs.next_action(state, catalog, NOW)
    cs.skip(state, skip["rung"], skip["reason"])
    # keep_best is forced here to show a final configuration: the prefetch winner, kept for real
    step = cs.next_action(state, catalog, NOW)
    while step["kind"] != "keep_best":
        cs.skip(state, step["rung"], "not run in this test")
        step = cs.next_action(state, catalog, NOW)
    r = cs.start(state, step["rung"], NOW, step)
    final = [103.5, 103.2, 103.9, 103.4, 103.6]
    bench(Path(r["run_dir"]), "candidate", final)
    cs.finish(state, step["rung"], NOW, {"outcome": "kept", "restore_ok": True,
                                         "decision": {"ratio": 1.034, "ci": [1.03, 1.038], "threshold": 1.01}})
    cs.stop(state, "the window closes: needs about 5 min")
    out = write(state, catalog, str(tmp_path))
    text = Path(out["report"]).read_text()
    assert "| 01-folded_fence | C | folded_fence | prose c1: 100.1 (99.8-100.5) |" in text
    assert "| reverted |" in text and "won its trial" in text and "1.030 [1.028, 1.032]" in text
    lo, hi, ratio = bootstrap_ratio_ci(final, base)
    assert f"x{ratio:.3f} [95% interval {lo:.3f}, {hi:.3f}]" in text
    assert "100.1 (first baseline, 01-folded_fence/bench-incumbent.json)" in text
    assert "spark2 (candidate): BOOT FAILED in 205 s" in text and "NV_ERR_NO_MEMORY" in text
    assert "wo_a_drop: prerequisite not kept: wo_a_w8 (failed)" in text
    assert "## Not reached before the window closed" in text and "09-combination" in text
    assert "slots_8" in text.split("## Operator's call")[1].split("##")[0]
    assert f"SPARKFLEET_RUNS_DIR={tmp_path}/rungs ansible-playbook playbooks/rollback.yml -e run=01-folded_fence" in text
    assert sorted(Path(p).name for p in out["plots"]) == ["cumulative.png", "rungs.png"]
    assert all(Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in out["plots"])
    assert len(out["summary"]) < 40 and out["summary"][-1].endswith("REPORT.md")


def test_seconds_to_failure_run_from_the_first_stamp_to_the_error():
    assert seconds_to_failure(str(FAILED_LOG), None) == 206.0
    assert seconds_to_failure(str(FAILED_LOG), 11) == 205.0


CENSORED = "the output has been hidden due to the fact that 'no_log: true' was specified for this result"


def _event(folder, n, action, start, seconds, changed=True, event="runner_on_ok", no_log=False, host="spark1"):
    t0 = dt.datetime(2026, 12, 2, 23, 0, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=start)
    folder.mkdir(parents=True, exist_ok=True)
    # as ansible-runner writes them: under no_log the result is censored, `changed` with it; the display line stays
    res = {"censored": CENSORED} if no_log else {"changed": changed}
    (folder / f"{n}-x.json").write_text(json.dumps({
        "event": event, "stdout": f"{'changed' if changed else 'ok'}: [{host}]", "event_data": {
            "task_action": action, "start": t0.isoformat(), "end": (t0 + dt.timedelta(seconds=seconds)).isoformat(),
            "res": res}}))


def test_the_campaigns_own_time_counts_boots_and_benchmarks_once_across_ranks_and_nested_runs(tmp_path):
    """ansible-runner's job events of every nested run under the campaign's folder: three ranks booting in
    parallel count once, a read of a container (not changed) is not a boot, a failed boot is, the nested
    apply play's pack counts."""
    from ansible.module_utils.campaign_report import overhead, work_s

    events = tmp_path / "rungs" / "01-pack_engram" / "runner" / "artifacts" / "nested" / "job_events"
    _event(events, 1, "engine_container", 0, 3, changed=False)        # compare: a read
    for i, rank_start in enumerate((10, 10.5, 11)):                    # stop+start on three ranks, overlapping
        _event(events, 2 + i, "engine_container", rank_start, 4)
    _event(events, 5, "decode_bench", 30, 20)
    _event(events, 6, "ansible.builtin.template", 60, 5)               # env rendering: overhead
    _event(events, 7, "engine_container", 70, 6, changed=False, event="runner_on_failed")  # a boot that failed
    apply = tmp_path / "rungs" / "01-pack_engram" / "apply" / "runner" / "artifacts" / "nested" / "job_events"
    _event(apply, 1, "engram_pack", 100, 10)
    assert work_s(str(tmp_path)) == 5 + 20 + 6 + 10
    state = {"started": "2026-12-02T23:00:00+00:00", "rungs": [{"nested_s": 150.0}]}
    cost = overhead(state, dt.datetime(2026, 12, 2, 23, 3, 20, tzinfo=dt.timezone.utc), str(tmp_path))
    assert cost == {"wall_s": 200.0, "nested_s": 150.0, "overhead_s": 50.0, "percent": 25.0,
                    "work_s": 41.0, "other_s": 159.0, "other_percent": 79.5}


def test_community_dockers_stops_and_creates_of_the_engine_containers_are_boot_work(tmp_path):
    """Since the engine containers are stopped, created and recreated by community.docker's docker_container
    (under no_log: ansible-runner's event has the result censored, `changed` included), a stop or a create that
    changed a container is boot work like engine_container's start; an unchanged stop (a rank already
    stopped), the check-mode comparison and docker_container_info's read are not."""
    from ansible.module_utils.campaign_report import work_s

    events = tmp_path / "rungs" / "02-folded_fence" / "runner" / "artifacts" / "nested" / "job_events"
    dc = "community.docker.docker_container"
    _event(events, 1, dc, 0, 2, no_log=True)                                # the stop of a running rank
    _event(events, 2, dc, 0.5, 2, changed=False, no_log=True, host="spark2")  # a rank already stopped
    _event(events, 3, dc, 10, 3, changed=False, no_log=True)                # the comparison (check mode): a read
    _event(events, 4, dc, 20, 1.5, no_log=True)                             # the create of a changed container
    _event(events, 5, "community.docker.docker_container_info", 30, 4)      # a read, whatever it says
    _event(events, 6, "engine_container", 40, 7)                            # the ordered start and wait
    assert work_s(str(tmp_path)) == 2 + 1.5 + 7


def _raw(folder, n, action, start, seconds, res, host="spark1", event="runner_on_ok"):
    t0 = dt.datetime(2026, 12, 2, 23, 0, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=start)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{n}-x.json").write_text(json.dumps({"event": event, "stdout": f"ok: [{host}]", "event_data": {
        "task_action": action, "host": host, "start": t0.isoformat(),
        "end": (t0 + dt.timedelta(seconds=seconds)).isoformat(), "res": res}}))


def test_a_pack_run_in_the_background_is_work_from_its_launch_to_the_check_that_saw_it_end(tmp_path):
    """roles/engram runs the pack with async and poll 0, then follows it with async_status checks: the launch
    returns at once, so the pack's own seconds are from the launch to the check that found the job finished
    (an unfinished check, another host's job and a job never seen finished add nothing)."""
    from ansible.module_utils.campaign_report import work_s

    apply = tmp_path / "rungs" / "01-pack_engram" / "apply" / "runner" / "artifacts" / "nested" / "job_events"
    launch = {"started": 1, "finished": 0, "ansible_job_id": "j1.1", "results_file": "/root/.ansible_async/j1.1"}
    _raw(apply, 1, "engram_pack", 0, 1, launch)
    _raw(apply, 2, "engram_pack", 0.2, 1, dict(launch, ansible_job_id="j2.2"), host="spark2")
    _raw(apply, 3, "ansible.builtin.async_status", 2, 0.5, {"finished": 0, "ansible_job_id": "j1.1"})
    _raw(apply, 4, "ansible.builtin.async_status", 12, 0.5, {"finished": 1, "ansible_job_id": "j1.1", "changed": True})
    _raw(apply, 5, "ansible.builtin.async_status", 13, 0.5, {"finished": 1, "ansible_job_id": "j1.1"}, host="spark3")
    assert work_s(str(tmp_path)) == 12          # spark1's pack: launch at 0, seen finished by the check at 12
    _raw(apply, 6, "ansible.builtin.async_status", 20, 0.5, {"finished": 1, "ansible_job_id": "j2.2"}, host="spark2")
    assert work_s(str(tmp_path)) == 20 - 0      # spark2's pack (0.2 to 20) overlaps spark1's: counted once
    _raw(apply, 7, "engram_pack", 30, 4, {"changed": True, "shards": []}, host="spark1")  # a pack run in the foreground
    assert work_s(str(tmp_path)) == 20 + 4
