#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""campaign_step: the campaign's decisions (module_utils/campaign_*.py) for playbooks/campaign.yml."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: campaign_step
short_description: One step of an unattended campaign (plan, window, state, next rung, report)
description:
  - The decisions of C(playbooks/campaign.yml) live in C(module_utils/campaign_plan.py), C(campaign_window.py),
    C(campaign_state.py) and C(campaign_report.py); this module calls them and keeps the state file.
  - O(action=init) loads and validates the plan against the catalog and the window (refusing before any
    change), and writes the state file; with O(resume) it loads the state of an earlier run instead.
  - O(action=next) says what to do now (run, skip, resume, stop or finish) and writes the experiment file of a
    rung the campaign composes; O(action=start), O(action=finish), O(action=skip), O(action=restart) and
    O(action=stop) record what happened; O(action=abort) records that a step of the campaign itself failed (the
    running rung from its own evidence, the campaign stopped as after a fleet-level failure, what was pending not
    reached); O(action=progress) says where a running rung stands;
    O(action=report) writes REPORT.md, the plots and the terminal summary.
  - "Runs on the controller (a localhost play)."
version_added: "1.1.0"
author: sparkfleet contributors (!UNKNOWN)
options:
  action:
    description: The step.
    type: str
    required: true
    choices: [init, next, start, finish, skip, restart, stop, abort, progress, report]
  run_dir:
    description: The campaign's run folder (holds campaign-state.json).
    type: path
    required: true
  plan:
    description: The plan file (O(action=init) without O(resume)).
    type: path
  catalog:
    description: The project's experiment folder.
    type: path
    required: true
  window_end:
    description: Local time HH:MM, a date-time or a duration (O(action=init)).
    type: str
  kept:
    description: Experiments kept in the incumbent now (O(action=init)).
    type: list
    elements: str
    default: []
  resume:
    description: Continue the campaign whose state is in O(run_dir) (O(action=init)).
    type: bool
    default: false
  rung:
    description: The rung of O(action=start), O(action=finish), O(action=skip), O(action=restart), O(action=progress).
    type: str
  reason:
    description: >-
      Why (O(action=skip), O(action=restart), O(action=stop); the failed step and its message for
      O(action=abort)); a note for O(action=finish).
    type: str
    default: ""
  step:
    description: The O(action=next) result this O(action=start) starts.
    type: dict
    default: {}
  nested:
    description: The nested run's result (O(action=finish)), for its failures when it left no decision.
    type: dict
    default: {}
  results_file:
    description: For O(action=progress), the rung's async job results file; the step waits for it to end, at most until
      O(interval_s) after its previous answer (C(progress_wait) of C(module_utils/campaign_window.py)).
    type: path
  pid_file:
    description: For O(action=progress), the nested run's pid file; a job whose process is gone has ended.
    type: path
  interval_s:
    description: >-
      For O(action=progress), seconds between two answers (so between two progress lines, whatever the turn of
      the playbook around the call costs); the step answers at once when the job ends.
    type: int
    default: 20
  slots:
    description: >-
      Request slots of the incumbent now (O(action=next)) when O(incumbent_file) does not set them; the final
      curve stops at this concurrency.
    type: int
    default: 4
  incumbent_file:
    description: >-
      The incumbent file a kept rung rewrites (group_vars/all/incumbent.yml, strings tagged C(!unsafe)); for
      O(action=next), its C(engine_env_incumbent.MAX_RUNNING_REQUESTS) gives the slots.
    type: path
attributes:
  check_mode:
    support: full
    description: In check mode the state and report files are not written; the decisions are returned.
  diff_mode:
    support: none
    description: The state file is the campaign's own record.
"""

EXAMPLES = r"""
- name: Load the plan and the window (refuses before any change)
  campaign_step:
    action: init
    run_dir: "{{ run_dir }}"
    plan: "{{ playbook_dir }}/../campaigns/default.yml"
    catalog: "{{ playbook_dir }}/../experiments"
    window_end: "06:00"
    kept: "{{ incumbent_experiments | default([]) }}"

- name: What now
  campaign_step:
    action: next
    run_dir: "{{ run_dir }}"
    catalog: "{{ playbook_dir }}/../experiments"
  register: step
"""

RETURN = r"""
step:
  description: For O(action=next), what to do (action run, skip, resume, stop or finish; rung; rollout variables; reason).
  returned: action=next
  type: dict
  sample: {action: run, rung: 02-verify_cap_conf01, kind: trial, rollout: {experiment: verify_cap_conf01, rollout_trial: true}}
rungs:
  description: Every rung with its status and outcome.
  returned: always
  type: list
  elements: dict
  sample: [{id: 01-folded_fence, kind: trial, status: done, outcome: reverted}]
deadline:
  description: The window's end (ISO 8601, local time zone).
  returned: always
  type: str
  sample: "2026-12-03T06:00:00+01:00"
ended:
  description: For O(action=abort), the rungs that were running and are now recorded.
  returned: action=abort
  type: list
  elements: str
  sample: [02-folded_fence]
stopped:
  description: Why the campaign stopped early (the window, a fleet-level failure), or null.
  returned: always
  type: dict
finished:
  description: For O(action=progress), whether the rung's job has ended.
  returned: action=progress
  type: bool
progress:
  description: For O(action=progress), one line saying stage, rung, arm, the nested task, elapsed and estimated time left.
  returned: action=progress
  type: str
summary:
  description: For O(action=report), the terminal summary (under 40 lines).
  returned: action=report
  type: list
  elements: str
report:
  description: For O(action=report), the path of REPORT.md.
  returned: action=report
  type: str
"""

import datetime as dt
import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils import campaign_state as cs
from ansible.module_utils.campaign_plan import PlanError, load_catalog, load_plan, rungs
from ansible.module_utils.campaign_report import overhead, write as write_report
from ansible.module_utils.campaign_window import WindowError, deadline, estimate, hm, progress_wait
from ansible.module_utils.experiments import data_yaml, trial_phase
from ansible.module_utils.nested_play import progress as nested_progress


def _now() -> dt.datetime:
    return dt.datetime.now().astimezone()


def _catalog(state: dict, catalog_dir: str) -> dict:
    _, catalog = load_plan(state["plan_file"], catalog_dir)
    return catalog


def _report_catalog(state: dict, catalog_dir: str) -> dict:
    """The catalog for the report, which is written whatever happened: the plan file as the campaign runs it,
    else (the file was removed or broken under the campaign, the failure the report then names) the plan the
    state recorded when the campaign started, with its experiment folders."""
    try:
        return _catalog(state, catalog_dir)
    except PlanError:
        base = os.path.dirname(state["plan_file"])
        folders = [catalog_dir] + [os.path.normpath(os.path.join(base, f)) for f in state["plan"].get("catalog") or []]
        try:
            return load_catalog([f for f in folders if os.path.isdir(f)])
        except PlanError:
            return {}


def _decision(r: dict, folder: str) -> dict | None:
    """A rung's decision from its own evidence: rollout.json, or {outcome: measured} for a measurement rung whose
    bench result exists; None when it left none."""
    if r["kind"] in ("baseline", "curve"):
        label = "baseline" if r["kind"] == "baseline" else "curve"
        return {"outcome": "measured", "reasons": []} if os.path.isfile(os.path.join(folder, f"bench-{label}.json")) else None
    path = os.path.join(folder, "rollout.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError) as exc:
        raise cs.StateError(f"{path} cannot be read ({exc})") from None


def job_finished(results_file: str, pid_file: str | None, wait_s: float) -> bool:
    """Wait up to wait_s for an async job (async_wrapper's results file) to end: ended when the file holds the
    module's result rather than the {started: 1, finished: 0} placeholder, or when the job's process is gone."""
    import time

    end = time.monotonic() + max(wait_s, 0)
    while True:
        try:
            with open(results_file) as fh:
                data = json.load(fh)
            if "started" not in data or data.get("finished"):
                return True
        except (OSError, ValueError):
            pass
        if pid_file:
            try:
                with open(pid_file) as fh:
                    pid = int(fh.read().strip() or 0)
                if pid > 0 and not os.path.exists(f"/proc/{pid}"):
                    return True
            except (OSError, ValueError):
                pass
        if time.monotonic() >= end:
            return False
        # A quarter of a second: the rung's end is seen within it (a read of two small files a turn).
        time.sleep(min(0.25, max(end - time.monotonic(), 0.05)))


PROGRESS_MARK = "progress.json"


def _progress(module, r: dict, folder: str, p: dict) -> dict:
    """Wait for the rung's job until interval_s after the previous answer (its time in <rung>/progress.json),
    then answer: {finished, waited_s}."""
    import time

    mark = os.path.join(folder, PROGRESS_MARK)
    previous = None
    try:
        with open(mark) as fh:
            previous = float(json.load(fh).get("answered"))
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    wait = progress_wait(previous, time.time(), interval_s=float(p["interval_s"]))
    finished = job_finished(p["results_file"], p["pid_file"], wait) if p["results_file"] else False
    if not module.check_mode and os.path.isdir(folder):
        with open(mark + ".tmp", "w") as fh:
            json.dump({"answered": time.time(), "rung": r["id"]}, fh)
        os.replace(mark + ".tmp", mark)
    return {"finished": finished, "waited_s": round(wait, 1)}


def _summary(state: dict) -> list[dict]:
    return [{k: r.get(k) for k in ("id", "kind", "experiment", "stage", "status", "outcome", "run_dir", "reason")}
            for r in state["rungs"]]


def main() -> None:
    module = AnsibleModule(argument_spec=dict(
        action=dict(type="str", required=True, choices=["init", "next", "start", "finish", "skip", "restart", "stop",
                                                         "abort", "progress", "report"]),
        run_dir=dict(type="path", required=True), plan=dict(type="path"), catalog=dict(type="path", required=True),
        window_end=dict(type="str"), kept=dict(type="list", elements="str", default=[]),
        resume=dict(type="bool", default=False), rung=dict(type="str"), reason=dict(type="str", default=""),
        step=dict(type="dict", default={}), nested=dict(type="dict", default={}),
        slots=dict(type="int", default=4), incumbent_file=dict(type="path"), results_file=dict(type="path"), pid_file=dict(type="path"),
        interval_s=dict(type="int", default=20)), supports_check_mode=True)
    p = module.params
    run_dir, now, out = p["run_dir"], _now(), {"changed": False}

    def save(state: dict) -> None:
        if not module.check_mode:
            cs.save(state, run_dir)
            out["changed"] = True

    try:
        if p["action"] == "init" and not p["resume"]:
            if not p["plan"] or not p["window_end"]:
                module.fail_json(msg="init needs plan and window_end")
            paths: dict = {}
            plan, catalog = load_plan(p["plan"], p["catalog"], paths)
            steps = rungs(plan, catalog)
            end = deadline(p["window_end"], now)
            first = estimate(steps[0]["kind"], {}, plan["rung_budget_s"]) + plan["restore_budget_s"]
            if (end - now).total_seconds() < first:
                raise WindowError(f"window_end={p['window_end']} leaves {hm((end - now).total_seconds())}, less than "
                                  f"one rung and its restore ({hm(first)}, rung_budget_s + restore_budget_s of the plan)")
            os.makedirs(run_dir, exist_ok=True)
            if os.path.exists(os.path.join(run_dir, cs.STATE_FILE)):
                module.fail_json(msg=f"{run_dir} already holds a campaign: continue it with -e resume={run_dir}")
            state = cs.new_state(os.path.abspath(p["plan"]), plan, steps, p["window_end"], end, now, p["kept"], run_dir)
            state["paths"] = paths
            save(state)
        else:
            state = cs.load(run_dir)
            if p["action"] == "init":
                state["resumed"].append(now.isoformat())
                save(state)
        if p["action"] == "next":
            catalog = _catalog(state, p["catalog"])
            step = cs.next_action(state, catalog, now)
            doc = step.pop("experiment_doc", None)
            if doc is not None and not module.check_mode:
                os.makedirs(step["run_dir"], exist_ok=True)
                with open(step["rollout"]["experiment_file"], "w") as fh:
                    fh.write(data_yaml(doc, f"{doc['name']}: written by playbooks/campaign.yml for rung {step['rung']}"))
                step["experiment_doc"] = doc
            if step["action"] == "run":
                slots = cs.incumbent_slots(p["incumbent_file"], p["slots"]) if p["incumbent_file"] else p["slots"]
                exp = doc or catalog.get(step.get("best") or cs.rung(state, step["rung"]).get("experiment") or "") or {}
                primary = (exp.get("workloads") or {}).get("primary")
                step["playbook"], nested_vars = cs.nested_run(state, step, slots, primary)
                step["vars_file"] = os.path.join(step["run_dir"], "rung-vars.json")
                if not module.check_mode:
                    os.makedirs(step["run_dir"], exist_ok=True)
                    with open(step["vars_file"], "w") as fh:
                        json.dump(nested_vars, fh, indent=2, sort_keys=True)
            out["step"] = step
        elif p["action"] == "start":
            step = dict(p["step"])
            if step.get("rollout", {}).get("experiment_file") and step.get("experiment_doc") is None:
                step.pop("experiment_doc", None)
            cs.start(state, p["rung"], now, step)
            save(state)
        elif p["action"] == "finish":
            r = cs.rung(state, p["rung"])
            folder = r.get("run_dir") or cs.rung_dir(state, r)
            result = _decision(r, folder)
            note = p["reason"]
            if result is None:
                fails = (p["nested"] or {}).get("failures") or []
                note = note or ("the nested run ended without a decision (rc %s)%s" % (
                    (p["nested"] or {}).get("rc", "?"),
                    f": {fails[0].get('host')}: {fails[0].get('msg')}" if fails else ""))
                if r["kind"] in ("baseline", "curve"):
                    result = {"outcome": "failed", "reasons": [note]}
            done = cs.finish(state, p["rung"], now, result, note)
            if isinstance((p["nested"] or {}).get("elapsed_s"), (int, float)):
                done["nested_s"] = float(p["nested"]["elapsed_s"])
            save(state)
            # For the campaign's record.json (plugins/callback/run_record.py): the rung as decided and what its
            # nested run returned (rc, status, per-host stats, failures, seconds).
            out["rung"] = done
            out["nested"] = {k: (p["nested"] or {}).get(k) for k in ("rc", "status", "ok", "stats", "failures", "elapsed_s")}
        elif p["action"] == "skip":
            cs.skip(state, p["rung"], p["reason"])
            save(state)
        elif p["action"] == "restart":
            cs.restart(state, p["rung"], p["reason"])
            save(state)
        elif p["action"] == "stop":
            cs.stop(state, p["reason"])
            save(state)
        elif p["action"] == "abort":
            decisions = {}
            for r in state["rungs"]:
                if r["status"] == "running":
                    try:
                        decisions[r["id"]] = _decision(r, r.get("run_dir") or cs.rung_dir(state, r))
                    except cs.StateError:
                        decisions[r["id"]] = None
            out["ended"] = [r["id"] for r in cs.abort(state, now, p["reason"], decisions)]
            save(state)
        elif p["action"] == "progress":
            r = cs.rung(state, p["rung"])
            folder = r.get("run_dir") or cs.rung_dir(state, r)
            out.update(_progress(module, r, folder, p))
            now = _now()
            started = dt.datetime.fromisoformat(r["started"]) if r.get("started") else now
            elapsed = (now - started).total_seconds()
            need = estimate(r["kind"], cs.measured(state), int(state["plan"]["rung_budget_s"]))
            index = [x["id"] for x in state["rungs"]].index(r["id"]) + 1
            arm = trial_phase(folder) if r["kind"] not in ("baseline", "curve") else "measuring"
            task = nested_progress(os.path.join(folder, "runner")).get("task") or "starting"
            left = (dt.datetime.fromisoformat(state["deadline"]) - now).total_seconds()
            out["progress"] = (f"stage {r.get('stage', '-')}, rung {index}/{len(state['rungs'])} {r['id']} ({r['kind']}): "
                               f"{arm}; now: {task}; {hm(elapsed)} elapsed, about {hm(max(need - elapsed, 0))} left "
                               f"of this rung; window closes in {hm(max(left, 0))}")
        elif p["action"] == "report":
            if not state.get("finished") and not any(r["status"] in ("pending", "running") for r in state["rungs"]):
                state["finished"] = now.isoformat()
            state["overhead"] = overhead(state, now, run_dir)
            save(state)
            if not module.check_mode:
                rep = write_report(state, _report_catalog(state, p["catalog"]), run_dir)
                out.update(report=rep["report"], plots=rep["plots"], summary=rep["summary"], changed=True)
    except (PlanError, WindowError, cs.StateError) as exc:
        module.fail_json(msg=f"{exc}." + (" Nothing was changed." if p["action"] == "init" else ""))
    out.update(action=p["action"], rungs=_summary(state), deadline=state["deadline"], stopped=state.get("stopped"),
               kept=state.get("kept"), state_file=os.path.join(run_dir, cs.STATE_FILE))
    module.exit_json(**out)


if __name__ == "__main__":
    main()
