"""The campaign state: atomic, resumable, a finished rung never rerun; what to do next, decided in Python."""
import datetime as dt
import json
import os
from pathlib import Path

import pytest

from ansible.module_utils import campaign_state as cs
from ansible.module_utils.campaign_plan import load_plan, rungs

ROOT = Path(__file__).resolve().parents[2]
NOW = dt.datetime(2026, 12, 2, 23, 0, tzinfo=dt.timezone.utc)


def campaign(tmp_path, name="testbed-6.yml", hours=6, kept=()):
    paths = {}
    plan, catalog = load_plan(str(ROOT / "tests/integration/fixtures/campaigns" / name), str(ROOT / "experiments"), paths)
    state = cs.new_state(name, plan, rungs(plan, catalog), "6h", NOW + dt.timedelta(hours=hours), NOW, list(kept),
                         str(tmp_path))
    state["paths"] = paths
    return state, catalog


def run(state, catalog, outcome, now=NOW, ratio=1.02, restore_ok=True, minutes=4):
    action = cs.next_action(state, catalog, now)
    assert action["action"] == "run", action
    cs.start(state, action["rung"], now, action)
    cs.finish(state, action["rung"], now + dt.timedelta(minutes=minutes),
              {"outcome": outcome, "reasons": [], "restore_ok": restore_ok, "decision": {"ratio": ratio}})
    return action


def test_the_state_file_is_replaced_atomically_and_reads_back(tmp_path):
    state, _ = campaign(tmp_path)
    path = cs.save(state, str(tmp_path))
    assert json.loads(Path(path).read_text()) == state and cs.load(str(tmp_path)) == state
    assert [p for p in os.listdir(tmp_path) if p.endswith(".tmp")] == []
    Path(path).write_text("{half")
    with pytest.raises(cs.StateError, match="not valid JSON"):
        cs.load(str(tmp_path))
    with pytest.raises(cs.StateError, match="holds no campaign-state.json"):
        cs.load(str(tmp_path / "nope"))


def test_a_whole_campaign_decided_rung_by_rung(tmp_path):
    state, catalog = campaign(tmp_path)
    # stage by stage: C folded_fence, D wo_a_w8, E prefetch_direct, F wo_a_drop, G cap, I the rest
    first = run(state, catalog, "reverted", ratio=1.0)                       # folded_fence
    assert first["rollout"] == {"experiment": "folded_fence", "rollout_trial": True}
    run(state, catalog, "failed", ratio=None)                                 # wo_a_w8 does not boot
    third = run(state, catalog, "kept", ratio=1.03)                           # prefetch_direct (fixture file)
    assert third["rollout"]["experiment_file"].endswith("campaign-experiments/prefetch_direct.yml")
    skipped = cs.next_action(state, catalog, NOW)
    assert skipped == {"action": "skip", "rung": "04-wo_a_drop", "reason": "prerequisite not kept: wo_a_w8 (failed)"}
    cs.skip(state, skipped["rung"], skipped["reason"])
    run(state, catalog, "kept", ratio=1.021)                                  # verify_cap_conf01
    run(state, catalog, "failed", ratio=None)                                 # mem_fraction_099
    op = run(state, catalog, "kept", ratio=1.2)                               # slots_8: operator's call
    assert op["kind"] == "operator_call" and op["rollout"]["rollout_trial"] is True
    best = cs.next_action(state, catalog, NOW)
    # the best single winner is the highest ratio among real winners, never the operator's call
    assert best["kind"] == "keep_best" and best["rollout"]["experiment_file"].endswith("prefetch_direct.yml")
    assert best["rollout"]["rollout_trial"] is False
    cs.start(state, best["rung"], NOW, best)
    cs.finish(state, best["rung"], NOW, {"outcome": "kept", "reasons": [], "restore_ok": True})
    assert state["kept"] == ["prefetch_direct"]
    combo = cs.next_action(state, catalog, NOW)
    doc = combo["experiment_doc"]
    assert combo["kind"] == "combination" and doc["includes"] == ["prefetch_direct", "verify_cap_conf01"]
    assert combo["rollout"]["experiment_file"] == os.path.join(combo["run_dir"], "campaign-combination.yml")
    cs.start(state, combo["rung"], NOW, combo)
    cs.finish(state, combo["rung"], NOW, {"outcome": "reverted", "reasons": ["gain not shown"], "restore_ok": True})
    assert state["kept"] == ["prefetch_direct"]
    curve = cs.next_action(state, catalog, NOW)
    assert curve["kind"] == "curve"
    cs.start(state, curve["rung"], NOW, curve)
    cs.finish(state, curve["rung"], NOW, {"outcome": "measured"})
    assert cs.next_action(state, catalog, NOW) == {"action": "finish", "reason": "every rung has run"}


def test_a_child_of_a_trial_winner_carries_its_parent(tmp_path):
    state, catalog = campaign(tmp_path)
    for outcome in ("reverted", "kept", "kept"):                              # wo_a_w8 wins its trial
        run(state, catalog, outcome)
    drop = cs.next_action(state, catalog, NOW)
    assert drop["rung"] == "04-wo_a_drop" and drop["experiment_doc"]["includes"] == ["wo_a_w8", "wo_a_drop"]
    assert drop["rollout"]["experiment_file"].endswith("rungs/04-wo_a_drop/wo_a_drop.yml")


def test_a_prerequisite_kept_in_the_incumbent_needs_no_layering(tmp_path):
    state, catalog = campaign(tmp_path, kept=["wo_a_w8"])
    for outcome in ("reverted", "failed", "kept"):
        run(state, catalog, outcome)
    drop = cs.next_action(state, catalog, NOW)
    assert drop["action"] == "run" and drop["rollout"] == {"experiment": "wo_a_drop", "rollout_trial": True}


def test_a_rung_that_does_not_fit_stops_the_campaign(tmp_path):
    state, catalog = campaign(tmp_path, hours=1)
    run(state, catalog, "reverted", minutes=20)
    run(state, catalog, "kept", now=NOW + dt.timedelta(minutes=20), minutes=20)
    # 40 min gone, 20 left: a measured rung takes 20 min, plus 1 min to restore: it does not fit
    stop = cs.next_action(state, catalog, NOW + dt.timedelta(minutes=40))
    assert stop["action"] == "stop" and "20 min 00 s plus 1 min 00 s to restore" in stop["reason"], stop
    cs.stop(state, "window: " + stop["reason"])
    assert [r["status"] for r in state["rungs"]].count("not_reached") == len(state["rungs"]) - 2
    assert cs.next_action(state, catalog, NOW)["action"] == "finish"


def test_a_finished_rung_is_never_run_again_and_a_dead_one_restarts_in_a_new_folder(tmp_path):
    state, catalog = campaign(tmp_path)
    run(state, catalog, "reverted")
    with pytest.raises(cs.StateError, match="never run again"):
        cs.start(state, "01-folded_fence", NOW, {})
    action = cs.next_action(state, catalog, NOW)
    cs.start(state, action["rung"], NOW, action)
    resumed = cs.next_action(cs.load(cs.save(state, str(tmp_path)) and str(tmp_path)), catalog, NOW)
    assert resumed == {"action": "resume", "rung": "02-wo_a_w8",
                       "run_dir": str(tmp_path / "rungs" / "02-wo_a_w8")}
    cs.restart(state, "02-wo_a_w8", "the controller died before the rung decided")
    again = cs.next_action(state, catalog, NOW)
    assert again["rung"] == "02-wo_a_w8" and again["run_dir"].endswith("02-wo_a_w8.attempt2")


def test_a_fleet_that_was_not_restored_stops_the_campaign(tmp_path):
    state, catalog = campaign(tmp_path)
    run(state, catalog, "failed", restore_ok=False)
    assert state["stopped"]["fleet_failure"] is True and "not restored" in state["stopped"]["reason"]
    assert all(r["status"] == "not_reached" for r in state["rungs"][1:])


def test_relocation_needs_the_operators_opt_in(tmp_path):
    paths = {}
    plan, catalog = load_plan(str(ROOT / "campaigns" / "default.yml"), str(ROOT / "experiments"), paths)
    state = cs.new_state("default.yml", plan, rungs(plan, catalog), "6h", NOW + dt.timedelta(hours=6), NOW, [],
                         str(tmp_path))
    action = cs.next_action(state, catalog, NOW)
    assert action["action"] == "skip" and "relocation: true" in action["reason"]


def test_a_rungs_nested_run_skips_the_preflight_the_campaign_already_ran(tmp_path):
    state, catalog = campaign(tmp_path, name="testbed-3.yml")
    action = cs.next_action(state, catalog, NOW)
    playbook, nested = cs.nested_run(state, action)
    assert playbook == "rollout.yml" and nested["preflight_skip"] is True and nested["window_confirmed"] is True
    assert nested["rollout_reps"] == 5 and nested["experiment"] == "pack_engram"


def test_the_incumbents_slots_are_read_from_the_file_the_rollout_writes(tmp_path):
    """roles/rollout writes incumbent.yml with every string tagged !unsafe (data_yaml); Jinja's from_yaml
    cannot read that tag, which failed the 3-rung campaign's second turn after pack_engram was kept."""
    from ansible.module_utils.experiments import data_yaml

    path = tmp_path / "incumbent.yml"
    path.write_text(data_yaml({"incumbent_experiments": ["pack_engram"],
                               "engine_env_incumbent": {"SIM_TIME_SCALE": "0.25", "MAX_RUNNING_REQUESTS": "8"}}, "x"))
    assert "!unsafe" in path.read_text() and cs.incumbent_slots(str(path), 4) == 8
    path.write_text(data_yaml({"incumbent_experiments": ["pack_engram"], "engine_env_incumbent": {"A": "1"}}))
    assert cs.incumbent_slots(str(path), 4) == 4
    assert cs.incumbent_slots(str(tmp_path / "missing.yml"), 3) == 3


def test_the_best_single_winner_survives_the_state_file_between_steps(tmp_path):
    """campaign_step runs each step from the state file: `next` saves nothing, `start` gets the step as JSON.
    The best single winner must reach the state through `start`, or the combination has nothing to lay the
    others over and the keep_best rung's experiment is not recorded as kept (6-rung campaign, 2026-12-04:
    kept [] after keep_best, then `next` failed with KeyError 'best')."""
    state, catalog = campaign(tmp_path)
    for outcome, ratio in (("reverted", 1.0), ("failed", None), ("kept", 1.03)):
        run(state, catalog, outcome, ratio=ratio)
    cs.skip(state, "04-wo_a_drop", "prerequisite not kept: wo_a_w8 (failed)")
    for outcome, ratio in (("kept", 1.021), ("failed", None), ("kept", 1.2)):
        run(state, catalog, outcome, ratio=ratio)
    cs.save(state, str(tmp_path))

    def step(action_fn, save=True):
        saved = cs.load(str(tmp_path))
        out = action_fn(saved)
        if save:                        # as campaign_step: every action but `next` saves the state
            cs.save(saved, str(tmp_path))
        return out

    best = json.loads(json.dumps(step(lambda s: cs.next_action(s, catalog, NOW), save=False)))
    assert best["kind"] == "keep_best"
    step(lambda s: cs.start(s, best["rung"], NOW, best))
    step(lambda s: cs.finish(s, best["rung"], NOW, {"outcome": "kept", "reasons": [], "restore_ok": True}))
    assert cs.load(str(tmp_path))["kept"] == ["prefetch_direct"]
    combo = step(lambda s: cs.next_action(s, catalog, NOW), save=False)
    assert combo["kind"] == "combination" and combo["experiment_doc"]["includes"] == ["prefetch_direct", "verify_cap_conf01"]


def test_every_rung_measures_its_experiments_primary_workload(tmp_path):
    """The keep rule decides on the experiment's primary workload; the testbed plans measure prose c1 only, so
    slots_8 (primary prose c8, the operator's call) was decided on no sample at all: "too few samples
    (candidate 0, incumbent 0)" (6-rung campaign, 2026-12-04). Its primary is added to what is measured."""
    state, catalog = campaign(tmp_path)
    for outcome in ("reverted", "failed", "kept"):
        run(state, catalog, outcome)
    cs.skip(state, "04-wo_a_drop", "x")
    for outcome in ("kept", "failed"):
        run(state, catalog, outcome)
    action = cs.next_action(state, catalog, NOW)
    assert action["rung"] == "07-slots_8"
    _, nested = cs.nested_run(state, action, 4, catalog["slots_8"]["workloads"]["primary"])
    assert nested["rollout_types"] == ["prose"] and nested["rollout_concurrency"] == [1, 8]
    # already measured: nothing added; another type: added after the plan's own
    settings = {"rollout_types": ["prose"], "rollout_concurrency": [1, 2]}
    assert cs.with_primary(settings, {"type": "prose", "concurrency": 2}) == settings
    assert cs.with_primary(settings, {"type": "code", "concurrency": 4}) == {"rollout_types": ["prose", "code"],
                                                                            "rollout_concurrency": [1, 2, 4]}
    assert cs.with_primary(settings, None) == settings


def test_a_failed_campaign_step_records_the_running_rung_and_stops(tmp_path):
    """A step of the campaign itself failed (not a rung's verdict): the rung in progress is recorded from its
    own decision if it left one, else as failed and interrupted; the campaign stops as after a fleet-level
    failure and the rest is not reached."""
    state, catalog = campaign(tmp_path)
    action = cs.next_action(state, catalog, NOW)
    cs.start(state, action["rung"], NOW, action)
    ended = cs.abort(state, NOW, "'What now': cannot read the plan file", {action["rung"]: None})
    assert [r["id"] for r in ended] == ["01-folded_fence"]
    assert (ended[0]["status"], ended[0]["outcome"]) == ("done", "failed") and "interrupted" in ended[0]["note"]
    assert state["stopped"] == {"reason": "a step of the campaign failed: 'What now': cannot read the plan file",
                                "fleet_failure": True}
    assert all(r["status"] == "not_reached" for r in state["rungs"][1:])
    state, catalog = campaign(tmp_path)
    action = cs.next_action(state, catalog, NOW)
    cs.start(state, action["rung"], NOW, action)
    cs.abort(state, NOW, "x", {action["rung"]: {"outcome": "reverted", "reasons": ["gain not shown"], "restore_ok": True}})
    assert (state["rungs"][0]["outcome"], state["stopped"]["fleet_failure"]) == ("reverted", True)
