"""The campaign's state file (<run folder>/campaign-state.json) and what to do next.

The state is the campaign's memory across a dead controller: the rungs (from the plan, fixed when the
campaign starts), each rung's status (pending, running, done, skipped, not_reached), its run folders and
its result. It is written atomically (a temporary file, fsync, rename, directory fsync: module_utils/file_io)
after every change, so a kill -9 leaves the old or the new state, never a mix. A rung that is done is never
run again; a rung found ``running`` by a resumed campaign is either finished from its own evidence (its
rollout.json) or restarted in a new attempt folder after the fleet is proven or restored.
"""
from __future__ import annotations

import datetime as dt
import json
import os
from typing import Any

try:
    from ansible.module_utils.campaign_plan import combined, layered
    from ansible.module_utils.campaign_window import estimate, fits
    from ansible.module_utils.experiments import load_data_yaml
    from ansible.module_utils.file_io import write_atomic
except ImportError:  # tests import it directly
    from campaign_plan import combined, layered  # type: ignore[no-redef]
    from campaign_window import estimate, fits  # type: ignore[no-redef]
    from experiments import load_data_yaml  # type: ignore[no-redef]
    from file_io import write_atomic  # type: ignore[no-redef]

STATE_FILE = "campaign-state.json"
VERSION = 1
FINISHED = ("done", "skipped", "not_reached")
ROLLOUT_KINDS = ("host", "trial", "operator_call", "keep_best", "combination")


class StateError(ValueError):
    pass


def new_state(plan_file: str, plan: dict, rungs: list[dict], window_end: str, end: dt.datetime,
              now: dt.datetime, kept: list[str], run_dir: str) -> dict:
    return {"version": VERSION, "plan_file": plan_file, "plan": plan, "window_end": window_end,
            "deadline": end.isoformat(), "started": now.isoformat(), "run_dir": run_dir,
            "kept_at_start": list(kept), "kept": list(kept), "rungs": rungs, "stopped": None, "finished": None,
            "resumed": [], "paths": {}}


def save(state: dict, run_dir: str) -> str:
    path = os.path.join(run_dir, STATE_FILE)
    write_atomic(path, json.dumps(state, indent=2, sort_keys=True) + "\n", mode=0o644)
    return path


def load(run_dir: str) -> dict:
    path = os.path.join(run_dir, STATE_FILE)
    try:
        with open(path) as fh:
            state = json.load(fh)
    except FileNotFoundError:
        raise StateError(f"{run_dir} holds no {STATE_FILE}: resume= names a campaign's run folder "
                         "(runs/<time>-campaign)") from None
    except ValueError as exc:
        raise StateError(f"{path} is not valid JSON ({exc}); it is written atomically, so this file was edited "
                         "by hand") from None
    if state.get("version") != VERSION or not isinstance(state.get("rungs"), list):
        raise StateError(f"{path} is not a campaign state file of version {VERSION}")
    return state


def rung(state: dict, rung_id: str) -> dict:
    for r in state["rungs"]:
        if r["id"] == rung_id:
            return r
    raise StateError(f"no rung {rung_id!r} in the campaign")


def rung_dir(state: dict, r: dict) -> str:
    attempt = int(r.get("attempt") or 1)
    return os.path.join(state["run_dir"], "rungs", r["id"] + ("" if attempt == 1 else f".attempt{attempt}"))


def winners(state: dict) -> list[dict]:
    """Trial rungs whose trial was kept (operator's-call items are never winners)."""
    return [r for r in state["rungs"] if r["kind"] == "trial" and r["status"] == "done" and r.get("outcome") == "kept"]


def _best_of(r: dict) -> str | None:
    """The experiment a keep_best rung rolled out: recorded when it started, else (a state written before it was
    recorded) the name its rollout.json gives."""
    return r.get("best") or ((r.get("result") or {}).get("experiment"))


def _ratio(r: dict) -> float:
    return float(((r.get("result") or {}).get("decision") or {}).get("ratio") or 0.0)


def measured(state: dict) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in state["rungs"]:
        if r["status"] == "done" and r.get("duration_s"):
            out.setdefault(r["kind"], []).append(float(r["duration_s"]))
    return out


def _skip(r: dict, reason: str) -> dict:
    return {"action": "skip", "rung": r["id"], "reason": reason}


def next_action(state: dict, catalog: dict[str, dict], now: dt.datetime) -> dict:
    """What the campaign does now, as data: {action: run|skip|resume|stop|finish, rung, reason, ...}.

    ``run`` carries ``rollout`` (the nested rollout's variables: experiment or experiment_file, rollout_trial)
    and, when the rung's experiment is written by the campaign (a child over its parents' winners, the
    combination), ``experiment_doc``. ``stop`` means the window cannot hold the next rung: it and every
    pending rung after it are not reached."""
    if state.get("stopped"):
        return {"action": "finish", "reason": state["stopped"]["reason"]}
    for r in state["rungs"]:
        if r["status"] == "running":
            return {"action": "resume", "rung": r["id"], "run_dir": rung_dir(state, r)}
    pending = [r for r in state["rungs"] if r["status"] == "pending"]
    if not pending:
        return {"action": "finish", "reason": "every rung has run"}
    r = pending[0]
    kept = set(state.get("kept") or [])
    won = {w["experiment"]: w for w in winners(state)}
    doc: dict | None = None
    vars_: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    if r.get("needs_opt_in"):
        return _skip(r, "pack_engram relocates stale shards: the plan must opt in (relocation: true)")
    if r["kind"] in ("host", "trial", "operator_call"):
        missing = [p for p in r.get("prerequisites") or [] if p not in kept and p not in won]
        if missing:
            why = []
            for p in missing:
                parent = next((x for x in state["rungs"] if x.get("experiment") == p), None)
                why.append(f"{p} ({'not in the plan' if parent is None else (parent.get('outcome') or parent['status'])})")
            return _skip(r, "prerequisite not kept: " + ", ".join(why))
        parents = [catalog[p] for p in r.get("prerequisites") or [] if p not in kept]
        if parents:
            doc = layered(catalog[r["experiment"]], [_doc_of(won[p["name"]], catalog) for p in parents])
        else:
            vars_.update(_by_name(state, r["experiment"]))
        vars_["rollout_trial"] = r["kind"] != "host"
    elif r["kind"] == "keep_best":
        if not won:
            return _skip(r, "no single experiment won its trial")
        best = max(won.values(), key=_ratio)
        # the state records it when the rung starts (start(): `next` saves nothing, campaign_step reloads the file)
        extra["best"] = best["experiment"]
        vars_["rollout_trial"] = False
        if best.get("experiment_doc"):
            doc = best["experiment_doc"]
        else:
            vars_.update(_by_name(state, best["experiment"]))
    elif r["kind"] == "combination":
        best_rung = next((x for x in state["rungs"] if x["kind"] == "keep_best"), None)
        if not best_rung or best_rung.get("outcome") != "kept":
            return _skip(r, "the best single winner was not kept: nothing to combine with")
        best_name = _best_of(best_rung)
        if best_name not in won:
            return _skip(r, f"the kept best single winner ({best_name}) is not among the trial winners")
        others = [w for name, w in won.items() if name != best_name]
        if not others:
            return _skip(r, f"one winner ({best_name}): nothing to combine")
        doc = combined(_doc_of(won[best_name], catalog), [_doc_of(w, catalog) for w in others])
        vars_["rollout_trial"] = False
    if doc is not None:
        vars_["experiment_file"] = os.path.join(rung_dir(state, r), f"{doc['name']}.yml")
    end = dt.datetime.fromisoformat(state["deadline"])
    need = estimate(r["kind"], measured(state), int(state["plan"]["rung_budget_s"]))
    window = fits(now, end, need, int(state["plan"]["restore_budget_s"]))
    if not window["fits"]:
        return {"action": "stop", "rung": r["id"], "reason": window["reason"], "window": window}
    return {"action": "run", "rung": r["id"], "kind": r["kind"], "run_dir": rung_dir(state, r), "rollout": vars_,
            "experiment_doc": doc, "window": window, **extra}


def incumbent_slots(path: str, default: int = 4) -> int:
    """The request slots (MAX_RUNNING_REQUESTS) of the incumbent file roles/rollout writes (every string
    tagged ``!unsafe``, module_utils/experiments.py data_yaml, which Jinja's from_yaml cannot read), else
    ``default``: a missing or unreadable file, or an incumbent that does not set them."""
    import yaml

    try:
        with open(path) as fh:
            data = load_data_yaml(fh) or {}
        value = ((data.get("engine_env_incumbent") or {}) if isinstance(data, dict) else {}).get("MAX_RUNNING_REQUESTS")
        return int(value) if value is not None else int(default)
    except (OSError, yaml.YAMLError, ValueError, TypeError, AttributeError):
        return int(default)


def with_primary(settings: dict, primary: dict | None) -> dict:
    """The plan's rollout variables with the experiment's primary workload added to what is measured: the keep
    rule decides on the primary (module_utils/keep_rule.py), so a plan that measures prose c1 only still
    measures slots_8 at prose c8 (its primary; without it the decision was "too few samples (candidate 0,
    incumbent 0)"). The plan's own types and concurrencies stay, in their order."""
    if not primary:
        return settings
    out = dict(settings)
    ptype, pconc = str(primary.get("type") or "prose"), int(primary.get("concurrency") or 1)
    types = list(out.get("rollout_types") or ["prose", "code"])
    conc = [int(c) for c in out.get("rollout_concurrency") or [1, 2, 4]]
    if ptype not in types:
        out["rollout_types"] = types + [ptype]
    if pconc not in conc:
        out["rollout_concurrency"] = sorted(conc + [pconc])
    return out


def nested_run(state: dict, step: dict, slots: int = 4, primary: dict | None = None) -> tuple[str, dict]:
    """(playbook, extra vars) of a rung's nested run: rollout.yml with the plan's rollout variables for a
    rollout rung (and its experiment's ``primary`` workload, with_primary); baseline.yml or bench.yml for a
    measurement (the curve up to the incumbent's slots)."""
    r = rung(state, step["rung"])
    # The campaign ran the read-only preflight with parity required before its first rung; a rung's nested
    # run does not repeat it (15-20 s a rung on the testbed) and says so in its record. Its own restore-point
    # checks (serving, idle, exactly the incumbent's env) still run before it changes anything.
    settings = dict(state["plan"].get("rollout") or {}, preflight_skip=True)
    types = settings.get("rollout_types") or ["prose", "code"]
    bench = {"bench_types": types, "bench_concurrency": settings.get("rollout_concurrency") or [1, 2, 4],
             "bench_reps": settings.get("rollout_reps", 5), "bench_warmup": settings.get("rollout_warmup", 2),
             "bench_max_tokens": settings.get("rollout_max_tokens", 64), "bench_ignore_errors": True, "preflight_skip": True}
    if r["kind"] == "baseline":
        return "baseline.yml", dict(bench, bench_label="baseline",
                                    baseline_require_quiet="quiesce" in (state.get("kept") or []))
    if r["kind"] == "curve":
        conc = [c for c in r.get("concurrency") or [1, 2, 4] if c <= max(int(slots), 1)]
        return "bench.yml", dict(bench, bench_label="curve", bench_types=r.get("types") or types, bench_concurrency=conc)
    return "rollout.yml", dict(with_primary(settings, primary), window_confirmed=True, **(step.get("rollout") or {}))


def _by_name(state: dict, name: str) -> dict:
    """The rollout's way to name an experiment: its file when the plan's catalog holds it outside experiments/."""
    path = (state.get("paths") or {}).get(name)
    return {"experiment_file": path} if path else {"experiment": name}


def _doc_of(r: dict, catalog: dict[str, dict]) -> dict:
    """The experiment a finished rung ran (the file the campaign wrote for it, else the catalog's)."""
    return r.get("experiment_doc") or catalog[r["experiment"]]


def start(state: dict, rung_id: str, now: dt.datetime, action: dict) -> dict:
    r = rung(state, rung_id)
    if r["status"] in FINISHED:
        raise StateError(f"rung {rung_id} is {r['status']}: a finished rung is never run again")
    r.update(status="running", started=now.isoformat(), run_dir=rung_dir(state, r))
    if action.get("experiment_doc"):
        r["experiment_doc"] = action["experiment_doc"]
    if action.get("best"):
        r["best"] = action["best"]
    r["rollout"] = action.get("rollout") or {}
    return r


def restart(state: dict, rung_id: str, reason: str) -> dict:
    """A rung left running by a dead controller, without a decision: a new attempt (a new folder; the old
    one stays as evidence)."""
    r = rung(state, rung_id)
    r.setdefault("attempts", []).append({"run_dir": r.get("run_dir"), "reason": reason})
    r["attempt"] = int(r.get("attempt") or 1) + 1
    r.update(status="pending", run_dir=None)
    return r


def finish(state: dict, rung_id: str, now: dt.datetime, result: dict | None, note: str = "") -> dict:
    """Record a rung's end from its nested run's result (rollout.json, or the bench's {outcome: measured}).
    A fleet that was not restored stops the campaign (a fleet-level failure)."""
    r = rung(state, rung_id)
    if r["status"] in FINISHED:
        raise StateError(f"rung {rung_id} is already {r['status']}")
    started = dt.datetime.fromisoformat(r["started"]) if r.get("started") else now
    result = result or {"outcome": "failed", "reasons": [note or "the rung ended without a decision"],
                        "restore_ok": False}
    r.update(status="done", ended=now.isoformat(), duration_s=round((now - started).total_seconds(), 1),
             outcome=result.get("outcome"), result=_slim(result), note=note)
    if r["kind"] in ("host", "keep_best", "combination") and result.get("outcome") == "kept":
        doc = r.get("experiment_doc") or {}
        names = doc.get("includes") or [r.get("experiment") or _best_of(r)]
        state["kept"] = list(dict.fromkeys(list(state.get("kept") or []) + [n for n in names if n]))
        if r["kind"] == "combination":
            state["kept"].append(doc.get("name", "campaign-combination"))
    if r["kind"] in ROLLOUT_KINDS and result.get("restore_ok") is False and result.get("outcome") != "kept":
        stop(state, f"rung {rung_id}: the fleet was not restored ({'; '.join(result.get('reasons') or [])[:300]})",
             fleet_failure=True)
    return r


def abort(state: dict, now: dt.datetime, reason: str, decisions: dict[str, dict | None]) -> list[dict]:
    """A step of the campaign itself failed (not a rung's verdict): every rung still running is recorded, from
    its own decision when it left one (``decisions``: rung id -> rollout.json or None), else as failed with the
    failure as its note; the campaign stops as after a fleet-level failure (the fleet is proven, restored if
    need be, and reported), and what was pending is not reached."""
    why = f"a step of the campaign failed: {reason}"
    stop(state, why, fleet_failure=True)            # the pending rungs: not reached, for this reason
    ended = []
    for r in state["rungs"]:
        if r["status"] == "running":
            ended.append(finish(state, r["id"], now, decisions.get(r["id"]),
                                note=f"interrupted: a step of the campaign failed ({reason})"))
    stop(state, why, fleet_failure=True)            # finish() of a rung without a decision stopped it in its words
    return ended


def skip(state: dict, rung_id: str, reason: str, status: str = "skipped") -> dict:
    r = rung(state, rung_id)
    r.update(status=status, reason=reason)
    return r


def stop(state: dict, reason: str, fleet_failure: bool = False) -> None:
    """End the campaign: every pending rung is not reached."""
    state["stopped"] = {"reason": reason, "fleet_failure": fleet_failure}
    for r in state["rungs"]:
        if r["status"] == "pending":
            r.update(status="not_reached", reason=reason)


def _slim(result: dict) -> dict:
    keep = ("experiment", "outcome", "trial", "reasons", "decision", "restore_ok", "restored", "guards", "memory")
    return {k: result[k] for k in keep if k in result}
