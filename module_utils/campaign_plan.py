"""The campaign plan (campaigns/*.yml): the operators' plan of docs/reference.md section 9 as one night's rungs.

A plan names experiments of the catalog (experiments/*.yml); this module validates it against the catalog,
orders the experiments by their prerequisites (the experiment files' own, plus the plan's ``order_after``
for an order that is not a keep requirement: the confidence cap only after block 5 alone), and turns it
into the list of rungs the campaign runs:

- ``host``: a change through a playbook (stage A: pack_engram, quiesce; later clocks_unlocked), rolled out
  on its own and kept or reverted by the keep rule;
- ``baseline``: a fresh measurement of the incumbent after stage A (the first light of the report);
- ``trial``: one env experiment from the current incumbent, measured, decided and always restored
  (docs/rollouts.md, ladders); ``operator_call`` items are trials too, never kept, reported for the operator;
- ``keep_best``: the best single winner rolled out for real (kept only on its own gain);
- ``combination``: the other winners laid over it, kept only if it beats the best single by the keep rule;
- ``curve``: the final configuration's concurrency curve.

Pure data in, data out: nothing here touches a host, so a bad plan is refused before any change.
"""
from __future__ import annotations

import os
from typing import Any

try:
    from ansible.module_utils.experiments import STAGES, TYPES, validate as validate_experiment
except ImportError:  # tests import it directly
    from experiments import STAGES, TYPES, validate as validate_experiment  # type: ignore[no-redef]

# field: (required, types, description)
FIELDS: dict[str, tuple[bool, tuple, str]] = {
    "name": (True, (str,), "the plan's name"),
    "description": (False, (str,), "one line"),
    "experiments": (True, (list,), "experiment names of the catalog, in the plan's order"),
    "catalog": (False, (list,), "extra experiment folders, relative to the plan file (tests)"),
    "order_after": (False, (dict,), "NAME: [names] tried before NAME (order only, not a keep requirement)"),
    "operator_call": (False, (list,), "experiments that trade speed for capacity: measured, reported, never kept"),
    "relocation": (False, (bool,), "pack_engram may relocate stale shards (the operator's opt-in)"),
    "rollout": (False, (dict,), "rollout.yml variables for every rung (rollout_reps, rollout_types, ...)"),
    "rung_budget_s": (True, (int,), "estimated seconds of one rung until one is measured"),
    "restore_budget_s": (True, (int,), "seconds kept free at the end of the window to restore the incumbent"),
    "baseline": (False, (bool,), "take a fresh baseline after stage A (default true)"),
    "combine": (False, (bool,), "keep the best single winner, then try the winners combined (default true)"),
    "curve": (False, (dict, type(None)), "final concurrency curve: {types: [...], concurrency: [...]}"),
}
ROLLOUT_VARS = {"rollout_reps", "rollout_warmup", "rollout_max_tokens", "rollout_types", "rollout_concurrency",
                "rollout_kv_tolerance_mib"}


class PlanError(ValueError):
    """A plan that cannot run; the message names every problem."""


def _names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) and v for v in value)


def validate_plan(plan: Any) -> list[str]:
    """Every structural problem of a plan document (no catalog needed); empty when it is well formed."""
    if not isinstance(plan, dict):
        return ["the plan file must hold a mapping"]
    unknown = [f"unknown field {k!r} (known: {', '.join(FIELDS)})" for k in plan if k not in FIELDS]
    problems: list[str] = []
    for key, (required, types, desc) in FIELDS.items():
        if key not in plan:
            if required:
                problems.append(f"missing field {key!r} ({desc})")
        elif not isinstance(plan[key], types) or isinstance(plan[key], bool) and bool not in types:
            problems.append(f"{key!r} must be {' or '.join(t.__name__ for t in types)}, not {type(plan[key]).__name__}")
    if problems:
        return unknown + problems
    problems = unknown
    if not plan["experiments"] or not _names(plan["experiments"]):
        problems.append("'experiments' must be a non-empty list of experiment names")
    elif len(set(plan["experiments"])) != len(plan["experiments"]):
        dup = sorted({n for n in plan["experiments"] if plan["experiments"].count(n) > 1})
        problems.append(f"experiments named twice: {', '.join(dup)}")
    for key in ("operator_call", "catalog"):
        if key in plan and not _names(plan[key]):
            problems.append(f"{key!r} must be a list of names")
    for name, before in (plan.get("order_after") or {}).items():
        if not _names(before):
            problems.append(f"order_after.{name} must be a list of experiment names")
    for key in ("rung_budget_s", "restore_budget_s"):
        if plan[key] < 1:
            problems.append(f"{key} must be at least 1 second, not {plan[key]}")
    extra = set(plan.get("rollout") or {}) - ROLLOUT_VARS
    if extra:
        problems.append(f"rollout has unknown variables {sorted(extra)} (known: {', '.join(sorted(ROLLOUT_VARS))})")
    curve = plan.get("curve")
    if curve:
        types, conc = curve.get("types"), curve.get("concurrency")
        if not _names(types) or any(t not in TYPES for t in types):
            problems.append(f"curve.types must be a list of {', '.join(TYPES)}")
        if not isinstance(conc, list) or not conc or any(not isinstance(c, int) or c < 1 for c in conc):
            problems.append("curve.concurrency must be a non-empty list of integers >= 1")
    return problems


def find_cycle(edges: dict[str, list[str]]) -> list[str]:
    """One cycle of a graph {node: [nodes it needs first]}, as [a, b, ..., a]; empty when there is none."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in edges.get(node, []):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = 2
        path.pop()
        return []

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def dependency_order(names: list[str], edges: dict[str, list[str]], catalog: dict[str, dict]) -> list[str]:
    """The plan's experiments in an order where every one comes after what it needs (prerequisites and
    order_after); among those free to go, the earliest stage first, then the plan's own order."""
    position = {n: i for i, n in enumerate(names)}
    needs = {n: [p for p in edges.get(n, []) if p in position] for n in names}
    done: list[str] = []
    while len(done) < len(names):
        ready = [n for n in names if n not in done and all(p in done for p in needs[n])]
        if not ready:
            raise PlanError("prerequisite cycle: " + " -> ".join(find_cycle(needs)))
        ready.sort(key=lambda n: (STAGES.index(catalog[n]["stage"]), position[n]))
        done.append(ready[0])
    return done


def check_plan(plan: Any, catalog: dict[str, dict], kept: list[str] | None = None) -> list[str]:
    """Every problem of a plan against the catalog: structure, unknown experiments, invalid experiment files,
    operator's-call items outside the plan, prerequisite cycles. Empty when the plan can run."""
    problems = validate_plan(plan)
    if problems:
        return problems
    known = sorted(catalog)
    for name in plan["experiments"]:
        if name not in catalog:
            problems.append(f"unknown experiment {name!r} (the catalog has: {', '.join(known)})")
        else:
            bad = validate_experiment(catalog[name], name)
            if bad:
                problems.append(f"experiment {name} fails the schema: {'; '.join(bad)}")
    for name in plan.get("operator_call") or []:
        if name not in plan["experiments"]:
            problems.append(f"operator_call item {name!r} is not one of the plan's experiments")
    for name, before in (plan.get("order_after") or {}).items():
        for n in [name] + list(before):
            if n not in plan["experiments"]:
                problems.append(f"order_after names {n!r}, which is not one of the plan's experiments")
    if problems:
        return problems
    cycle = find_cycle(edges_of(plan, catalog))
    if cycle:
        problems.append("prerequisite cycle: " + " -> ".join(cycle)
                        + " (experiment files' prerequisites and the plan's order_after)")
    return problems


def edges_of(plan: dict, catalog: dict[str, dict]) -> dict[str, list[str]]:
    """{experiment: [what must come first]}: the experiment file's prerequisites and the plan's order_after."""
    edges: dict[str, list[str]] = {}
    for name in plan["experiments"]:
        edges[name] = list(catalog[name].get("prerequisites") or []) + list((plan.get("order_after") or {}).get(name, []))
    return edges


def is_host_change(doc: dict) -> bool:
    return bool((doc.get("apply") or {}).get("playbook"))


def rungs(plan: dict, catalog: dict[str, dict]) -> list[dict]:
    """The campaign's rungs in the order they run (see the module's docstring). Raises PlanError on a bad plan."""
    problems = check_plan(plan, catalog)
    if problems:
        raise PlanError("; ".join(problems))
    order = dependency_order(plan["experiments"], edges_of(plan, catalog), catalog)
    operator = set(plan.get("operator_call") or [])
    out: list[dict] = []

    def add(kind: str, name: str | None = None, **extra: Any) -> None:
        doc = catalog.get(name or "", {})
        rung = {"id": f"{len(out) + 1:02d}-{name or kind}", "kind": kind, "experiment": name,
                "stage": doc.get("stage", extra.pop("stage", "-")),
                "description": doc.get("description", extra.pop("description", "")),
                "prerequisites": list(doc.get("prerequisites") or []), "status": "pending"}
        rung.update(extra)
        out.append(rung)

    stage_a = [n for n in order if catalog[n]["stage"] == "A"]
    later_hosts = [n for n in order if n not in stage_a and is_host_change(catalog[n])]
    trials = [n for n in order if n not in stage_a and n not in later_hosts]
    for name in stage_a:
        add("host", name, needs_opt_in=name == "pack_engram" and not plan.get("relocation", False))
    if plan.get("baseline", True):
        add("baseline", stage="-", description="a fresh baseline of the incumbent after stage A")
    for name in trials:
        add("operator_call" if name in operator else "trial", name)
    if plan.get("combine", True) and any(n not in operator for n in trials):
        add("keep_best", stage="-", description="the best single winner, rolled out for real")
        add("combination", stage="-", description="the other winners laid over the best single")
    for name in later_hosts:
        add("host", name)
    if plan.get("curve"):
        add("curve", stage="-", description="the final configuration's concurrency curve",
            types=list(plan["curve"]["types"]), concurrency=list(plan["curve"]["concurrency"]))
    return out


def load_catalog(folders: list[str], paths: dict[str, str] | None = None) -> dict[str, dict]:
    """{name: document} of every *.yml in the folders (a later folder's file of the same name wins);
    ``paths`` receives {name: file} for the files outside the first folder (the project's catalog)."""
    import yaml

    catalog: dict[str, dict] = {}
    for folder in folders:
        for entry in sorted(os.listdir(folder)):
            if entry.endswith(".yml"):
                path = os.path.join(folder, entry)
                try:
                    with open(path) as fh:
                        catalog[entry[:-4]] = yaml.safe_load(fh)
                    if paths is not None and folder != folders[0]:
                        paths[entry[:-4]] = path
                except (OSError, yaml.YAMLError) as exc:
                    raise PlanError(f"cannot read the experiment file {path}: {exc}") from exc
    return catalog


def load_plan(path: str, catalog_dir: str, paths: dict[str, str] | None = None) -> tuple[dict, dict[str, dict]]:
    """(plan, catalog) of a plan file: the plan's own experiment folders come after the project's catalog."""
    import yaml

    try:
        with open(path) as fh:
            plan = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError) as exc:
        raise PlanError(f"cannot read the plan file {path}: {exc}") from exc
    problems = validate_plan(plan)
    if problems:
        raise PlanError(f"{path}: " + "; ".join(problems))
    base = os.path.dirname(os.path.abspath(path))
    folders = [catalog_dir] + [os.path.normpath(os.path.join(base, f)) for f in plan.get("catalog") or []]
    return plan, load_catalog(folders, paths)


def layered(child: dict, parents: list[dict]) -> dict:
    """An experiment laid over the winners of its prerequisites' trials (they are not kept in the incumbent,
    so the child's rung carries them): the parents' env under the child's, their markers added, the
    prerequisites they satisfy dropped. The ledger: the child's own when its env already sets every
    parent's keys (the file then describes the whole change from the incumbent, as wo_a_drop does), else the
    sum. Exactness only if all claim it."""
    env: dict = {}
    for p in parents:
        env.update((p.get("apply") or {}).get("env") or {})
    env.update((child.get("apply") or {}).get("env") or {})
    own_keys = set(((child.get("apply") or {}).get("env") or {}))
    self_contained = all(set(((p.get("apply") or {}).get("env") or {})) <= own_keys for p in parents)
    delta = int(child["memory"]["delta_mib_per_rank"])
    if not self_contained:
        delta += sum(int(p["memory"]["delta_mib_per_rank"]) for p in parents)
    names = [p["name"] for p in parents]
    doc = dict(child)
    doc["apply"] = dict(child.get("apply") or {}, env=env)
    doc["prerequisites"] = [n for n in child.get("prerequisites") or [] if n not in names]
    doc["markers_on"] = _unique([m for p in parents for m in p.get("markers_on") or []] + list(child.get("markers_on") or []))
    doc["markers_off"] = _unique([m for d in parents + [child] for m in d.get("markers_off") or []])
    doc["memory"] = {"delta_mib_per_rank": delta,
                     "note": f"{child['name']} over {', '.join(names)} (written by the campaign)"}
    doc["exact_outputs"] = all(bool(d.get("exact_outputs")) for d in [child] + parents)
    doc["includes"] = names + [child["name"]]
    return doc


def combined(best: dict, others: list[dict], name: str = "campaign-combination") -> dict:
    """The winners other than the best single, laid over it (the best single is the incumbent when this runs:
    its env is repeated, its ledger is not). Kept only if it beats the best single by the keep rule.

    A winner that was laid over the best single in its own rung (wo_a_drop over wo_a_w8) is counted from the
    best single: the best single's markers are on before the change (not a negative control), and its ledger
    is the winner's whole change less the best single's."""
    env: dict = dict((best.get("apply") or {}).get("env") or {})
    for d in others:
        env.update((d.get("apply") or {}).get("env") or {})
    all_docs = [best] + others
    includes = _unique([n for d in all_docs for n in (d.get("includes") or [d["name"]])])
    best_names = set(best.get("includes") or [best["name"]])
    best_off = set(best.get("markers_off") or [])
    best_mib = int(best["memory"]["delta_mib_per_rank"])

    def over_best(d: dict) -> bool:
        return best_names <= set(d.get("includes") or [d["name"]])

    return {"name": name, "stage": max(d["stage"] for d in all_docs),
            "description": "combination of " + ", ".join(includes),
            "apply": {"env": env},
            "prerequisites": [],
            "markers_on": _unique([m for d in all_docs for m in d.get("markers_on") or []]),
            "markers_off": _unique([m for d in others for m in d.get("markers_off") or []
                                    if not (over_best(d) and m in best_off)]),
            "memory": {"delta_mib_per_rank": sum(int(d["memory"]["delta_mib_per_rank"]) - (best_mib if over_best(d) else 0)
                                                 for d in others),
                       "note": f"the winners over the best single {best['name']}"},
            "exact_outputs": all(bool(d.get("exact_outputs")) for d in all_docs),
            "timing_valid": all(d.get("timing_valid", True) for d in all_docs),
            "workloads": best["workloads"], "includes": includes,
            "notes": "written by playbooks/campaign.yml"}


def _unique(items: list) -> list:
    out: list = []
    for item in items:
        if item not in out:
            out.append(item)
    return out
