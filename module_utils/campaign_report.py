"""The campaign's morning report: REPORT.md, PNG plots and a terminal summary under 40 lines.

Everything comes from the campaign state and each rung's own evidence (rollout.json, bench-*.json,
boot-logs/): the table of rungs (stage, change, primary and secondary workload medians with min-max, ratio
with its 95% interval, verdict, reason), the cumulative gain from the first baseline to the final
configuration with its interval (the same bootstrap as the keep rule, module_utils/bench_stats.py),
blocked items with their evidence (a failed boot's first error line and seconds to failure, docs/reference.md
section 9a), operator's-call items, what the window did not reach, and the one command that rolls the whole
campaign back.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import re

try:
    from ansible.module_utils.bench_stats import bootstrap_ratio_ci, median
    from ansible.module_utils.sglang_log import parse_file
except ImportError:  # tests import it directly
    from bench_stats import bootstrap_ratio_ci, median  # type: ignore[no-redef]
    from sglang_log import parse_file  # type: ignore[no-redef]

STAMP = re.compile(r"^(?:\S*?)\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
VERDICT = {"kept": "kept", "reverted": "reverted", "failed": "failed (reverted)", "measured": "measured"}


def _json(path: str):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def condition(bench, ctype: str, conc: int) -> dict | None:
    """{median, min, max, n, samples} of decode tok/s for one workload of a bench result, or None."""
    for c in (bench or {}).get("conditions") or []:
        if c.get("type") == ctype and int(c.get("concurrency") or 0) == int(conc):
            samples = [float(v) for v in ((c.get("samples") or {}).get("decode_tok_s") or []) if v is not None]
            if samples:
                return {"median": median(samples), "min": min(samples), "max": max(samples), "n": len(samples),
                        "samples": samples, "aggregate": median([float(v) for v in
                                                                 (c.get("samples") or {}).get("aggregate_tok_s") or samples])}
    return None


def _fmt(c: dict | None) -> str:
    return "-" if not c else f"{c['median']:.1f} ({c['min']:.1f}-{c['max']:.1f})"


def workloads(rung: dict, catalog: dict) -> tuple[tuple[str, int], tuple[str, int] | None]:
    """The rung's primary workload (its experiment's) and a secondary one (the other type measured)."""
    doc = rung.get("experiment_doc") or catalog.get(rung.get("experiment") or "") or {}
    wl = doc.get("workloads") or {}
    primary = wl.get("primary") or {"type": "prose", "concurrency": 1}
    p = (primary.get("type", "prose"), int(primary.get("concurrency", 1)))
    types = [t for t in (rung.get("types") or wl.get("types") or []) if t != p[0]]
    return p, ((types[0], p[1]) if types else None)


def failed_boots(folder: str) -> list[dict]:
    """Every rank's failed boot in a rung's boot-logs/: {log, host, first_error, line, seconds_to_failure}."""
    out = []
    base = os.path.join(folder, "boot-logs")
    if not os.path.isdir(base):
        return out
    for phase in sorted(os.listdir(base)):
        for name in sorted(os.listdir(os.path.join(base, phase))):
            if not name.endswith(".log") or name.endswith(".replaced.log"):
                continue
            path = os.path.join(base, phase, name)
            try:
                facts = parse_file(path)
            except (OSError, ValueError):
                continue
            errors = facts.get("errors") or []
            if not errors:
                continue
            first = errors[0]
            out.append({"phase": phase, "log": os.path.relpath(path, folder), "host": name.split("-rank")[0],
                        "first_error": " ".join(str(first.get("text", "")).split())[:300], "line": first.get("line"),
                        "seconds_to_failure": seconds_to_failure(path, first.get("line"))})
    return out


def seconds_to_failure(path: str, error_line: int | None) -> float | None:
    """Seconds from the boot's first time-stamped line to the last one at or before its first error."""
    first = last = None
    try:
        with open(path, errors="replace") as fh:
            for number, line in enumerate(fh, 1):
                m = STAMP.match(line)
                if m:
                    stamp = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
                    first = first or stamp
                    last = stamp
                if error_line and number >= error_line:
                    break
    except OSError:
        return None
    return (last - first).total_seconds() if first and last else None


def rung_row(rung: dict, folder: str, catalog: dict) -> dict:
    """One line of the table, with the numbers it shows."""
    result = rung.get("result") or {}
    decision = result.get("decision") or {}
    p, s = workloads(rung, catalog)
    cand = _json(os.path.join(folder, "bench-candidate.json")) if folder else None
    if rung["kind"] == "baseline":
        cand = _json(os.path.join(folder, "bench-baseline.json")) if folder else None
    inc = _json(os.path.join(folder, "bench-incumbent.json")) if folder and rung["kind"] != "baseline" else None
    status = rung["status"]
    if status == "done":
        verdict = VERDICT.get(str(rung.get("outcome")), str(rung.get("outcome")))
        if rung["kind"] in ("trial", "operator_call") and rung.get("outcome") == "kept":
            verdict = "won its trial" if rung["kind"] == "trial" else "faster: operator's call (not kept)"
        elif rung["kind"] == "operator_call":
            verdict = "operator's call: " + verdict
    else:
        verdict = {"skipped": "skipped", "not_reached": "not reached", "running": "running", "pending": "pending"}[status]
    reasons = result.get("reasons") or ([rung["reason"]] if rung.get("reason") else [])
    if status == "done" and rung.get("outcome") == "kept" and not reasons:
        reasons = ["kept on a measured gain" if rung["kind"] != "trial" else "gain shown; combined after the singles"]
    ci = decision.get("ci")
    return {"id": rung["id"], "stage": rung.get("stage", "-"), "kind": rung["kind"],
            "change": rung.get("experiment") or rung.get("best") or rung["kind"],
            "primary": f"{p[0]} c{p[1]}", "primary_value": condition(cand, *p),
            "secondary": f"{s[0]} c{s[1]}" if s else "-", "secondary_value": condition(cand, *s) if s else None,
            "ratio": decision.get("ratio"), "ci": ci, "threshold": decision.get("threshold"),
            # aggregate tok/s of the primary workload, incumbent and candidate arms: what more slots trade for
            "aggregate": [(condition(inc, *p) or {}).get("aggregate"), (condition(cand, *p) or {}).get("aggregate")],
            "verdict": verdict, "reason": " ".join("; ".join(str(r) for r in reasons).split())[:220],
            "folder": os.path.relpath(folder, os.path.dirname(os.path.dirname(folder))) if folder else ""}


def _ratio_text(row: dict) -> str:
    if row["ratio"] is None:
        return "-"
    ci = row["ci"] or [None, None]
    return f"{row['ratio']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci[0] is not None else f"{row['ratio']:.3f}"


def first_and_final(state: dict, workload: tuple[str, int]) -> tuple[dict | None, dict | None, str, str]:
    """The first baseline's and the final configuration's measurement of one workload (and where each is from)."""
    first = final = None
    first_src = final_src = ""
    for r in state["rungs"]:
        folder = r.get("run_dir")
        if r["status"] != "done" or not folder:
            continue
        names = ["bench-baseline.json"] if r["kind"] == "baseline" else ["bench-incumbent.json"]
        if first is None:
            for n in names:
                c = condition(_json(os.path.join(folder, n)), *workload)
                if c:
                    first, first_src = c, os.path.join(r["id"], n)
                    break
        if r["kind"] in ("host", "keep_best", "combination") and r.get("outcome") == "kept":
            c = condition(_json(os.path.join(folder, "bench-candidate.json")), *workload)
            if c:
                final, final_src = c, os.path.join(r["id"], "bench-candidate.json")
        if r["kind"] == "curve":
            c = condition(_json(os.path.join(folder, "bench-curve.json")), *workload)
            if c:
                final, final_src = c, os.path.join(r["id"], "bench-curve.json")
    if final is None and first is not None:
        final, final_src = first, first_src + " (nothing kept)"
    return first, final, first_src, final_src


def cumulative(state: dict, workload: tuple[str, int] = ("prose", 1)) -> dict:
    first, final, a, b = first_and_final(state, workload)
    if not first or not final:
        return {"workload": f"{workload[0]} c{workload[1]}", "ratio": None, "ci": None, "first": first, "final": final}
    lo, hi, ratio = bootstrap_ratio_ci(final["samples"], first["samples"])
    return {"workload": f"{workload[0]} c{workload[1]}", "ratio": ratio, "ci": [lo, hi], "first": first,
            "final": final, "first_from": a, "final_from": b}


def rollback_command(state: dict) -> str:
    """The one command that puts the fleet back where the campaign found it: the restore point of the first
    rung that recorded one (host changes kept since then are reverted too)."""
    for r in state["rungs"]:
        folder = r.get("run_dir")
        if folder and os.path.isfile(os.path.join(folder, "restore-point.json")):
            hosts = any(x["kind"] == "host" and x.get("outcome") == "kept" for x in state["rungs"])
            return (f"SPARKFLEET_RUNS_DIR={os.path.dirname(folder)} ansible-playbook playbooks/rollback.yml "
                    f"-e run={os.path.basename(folder)}" + (" -e rollback_revert_host_changes=true" if hosts else ""))
    return "nothing to roll back: no rung changed the fleet"


# The work a campaign is for (issue 23 "Performance": everything but boots and benchmarks is overhead): the
# benchmarks, the boots and stops of the engines (tasks that changed an engine container: engine_container's
# ordered starts and waits, community.docker's docker_container stops, creates and recreates of the same
# containers; the liveness judgement that follows a boot, by its name and its deprecated alias) and the host
# change itself (engram_pack). A read (a comparison, an inspect) changes nothing and is not work.
WORK_ACTIONS = ("decode_bench", "engine_liveness_info", "engine_liveness", "engram_pack")
BOOT_ACTIONS = ("engine_container", "docker_container")


def _changed(ev: dict, res: dict) -> bool:
    """Whether a task's result changed its host. Under no_log (docker_container's result holds the container's
    env) Ansible censors the whole result, `changed` included; the event's display line still starts with
    "changed:" (nested runs display with the default callback, without colour: module_utils/nested_play.py)."""
    if "changed" in res:
        return bool(res["changed"])
    return "censored" in res and str(ev.get("stdout") or "").lstrip().startswith("changed:")


def _task_intervals(events_dir: str) -> list[tuple[float, float]]:
    """(start, end) epoch seconds of the work tasks among one nested run's ansible-runner job events. A work
    task started in the background (the Engram pack: `async` with `poll: 0`, then async_status checks, roles/engram
    tasks/poll.yml) runs from its launch to the start of the check that found its job finished (the job ended
    between the previous check and that one: at most one poll interval of latency counts with it)."""
    out = []
    launched: dict[tuple, float] = {}  # (host, job id) -> start of the work task that launched it
    checks: list[tuple[tuple, float]] = []  # (host, job id), start of an async_status that found the job finished
    try:
        names = os.listdir(events_dir)
    except OSError:
        return out
    for name in names:
        if not name.endswith(".json"):
            continue
        ev = _json(os.path.join(events_dir, name)) or {}
        if ev.get("event") not in ("runner_on_ok", "runner_on_failed"):
            continue
        data = ev.get("event_data") or {}
        action = str(data.get("task_action") or "").rsplit(".", 1)[-1]
        res = data.get("res") or {}
        job = (data.get("host"), res.get("ansible_job_id"))
        finished_check = action == "async_status" and res.get("finished") and job[1]
        work = action in WORK_ACTIONS or (action in BOOT_ACTIONS and (_changed(ev, res) or ev["event"] == "runner_on_failed"))
        if not (finished_check or work):
            continue
        try:
            start = dt.datetime.fromisoformat(data["start"]).timestamp()
            end = dt.datetime.fromisoformat(data["end"]).timestamp()
        except (KeyError, TypeError, ValueError):
            continue
        if finished_check:
            checks.append((job, start))
        elif res.get("started") and not res.get("finished") and job[1]:
            launched[job] = start
        elif end >= start:
            out.append((start, end))
    for job, check_start in checks:
        if job in launched and check_start >= launched[job]:
            out.append((launched.pop(job), check_start))
    return out


def union_s(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by the intervals (ranks boot and bench in parallel: overlaps count once)."""
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def work_s(run_dir: str) -> float:
    """Seconds of boots, benchmarks and host changes in every nested run under a campaign's folder (rungs,
    their apply/revert plays, restores, proofs), from the runs' own job events."""
    intervals: list[tuple[float, float]] = []
    for folder, dirs, _ in os.walk(run_dir):
        if os.path.basename(folder) == "job_events":
            intervals += _task_intervals(folder)
            dirs[:] = []
    return union_s(intervals)


def overhead(state: dict, now: dt.datetime, run_dir: str | None = None) -> dict:
    """The campaign's own time, two ways. overhead_s: from its start (the plan loaded) to now, less the time
    its rungs' nested runs took (the checkpoint verification, the rung loop's decisions, state writes,
    polling latency, the final proof). other_s (with run_dir): the wall time less the boots, benchmarks and
    host changes of every nested run, that is also the rollouts' own checks, restore points, env rendering
    and gates. {wall_s, nested_s, overhead_s, percent, work_s, other_s, other_percent}."""
    start = dt.datetime.fromisoformat(state["started"])
    wall = (now - start).total_seconds()
    nested = sum(float(r.get("nested_s") or 0) for r in state["rungs"])
    own = max(wall - nested, 0.0)
    out = {"wall_s": round(wall, 1), "nested_s": round(nested, 1), "overhead_s": round(own, 1),
           "percent": round(100 * own / wall, 2) if wall > 0 else None}
    if run_dir:
        work = min(work_s(run_dir), wall)
        out.update(work_s=round(work, 1), other_s=round(wall - work, 1),
                   other_percent=round(100 * (wall - work) / wall, 2) if wall > 0 else None)
    return out


def build(state: dict, catalog: dict) -> dict:
    rows = [rung_row(r, r.get("run_dir") or "", catalog) for r in state["rungs"]]
    blocked = []
    for r in state["rungs"]:
        if r["status"] == "done" and r.get("outcome") == "failed":
            blocked.append({"id": r["id"], "change": r.get("experiment") or r["kind"],
                            "reasons": (r.get("result") or {}).get("reasons") or [],
                            "boots": failed_boots(r["run_dir"]) if r.get("run_dir") else []})
    return {"rows": rows, "blocked": blocked,
            "operator_call": [row for row, r in zip(rows, state["rungs"]) if r["kind"] == "operator_call"],
            "not_reached": [row for row in rows if row["verdict"] == "not reached"],
            "skipped": [row for row in rows if row["verdict"] == "skipped"],
            "cumulative": cumulative(state, _primary(state, catalog)), "kept": list(state.get("kept") or []),
            "rollback": rollback_command(state), "stopped": state.get("stopped")}


def _primary(state: dict, catalog: dict) -> tuple[str, int]:
    types = (state["plan"].get("rollout") or {}).get("rollout_types") or ["prose"]
    return (types[0], 1)


def markdown(state: dict, data: dict) -> str:
    plan = state["plan"]
    cum = data["cumulative"]
    out = [f"# Campaign {plan['name']}: morning report", "",
           f"Started {state['started']}, window end {state['window_end']} ({state['deadline']}), "
           f"finished {state.get('finished') or 'not yet'}.", ""]
    if data["stopped"]:
        out += [f"**Stopped early**: {data['stopped']['reason']}", ""]
    out += ["## Rungs", "",
            "| rung | stage | change | primary median (min-max) tok/s | secondary median (min-max) | ratio [95% CI] | verdict | reason |",
            "|---|---|---|---|---|---|---|---|"]
    for row in data["rows"]:
        out.append(f"| {row['id']} | {row['stage']} | {row['change']} | {row['primary']}: {_fmt(row['primary_value'])} | "
                   f"{row['secondary']}: {_fmt(row['secondary_value'])} | {_ratio_text(row)} | {row['verdict']} | "
                   f"{row['reason'].replace('|', '/') or '-'} |")
    out += ["", "## Cumulative gain", ""]
    if cum["ratio"] is not None:
        out.append(f"{cum['workload']} decode tok/s: {cum['first']['median']:.1f} (first baseline, {cum['first_from']}) -> "
                   f"{cum['final']['median']:.1f} (final configuration, {cum['final_from']}): "
                   f"x{cum['ratio']:.3f} [95% interval {cum['ci'][0]:.3f}, {cum['ci'][1]:.3f}] "
                   f"({100 * (cum['ratio'] - 1):+.1f}%).")
    else:
        out.append("No baseline and final measurement of the same workload: no cumulative figure.")
    out += ["", f"Kept: {', '.join(data['kept']) or 'nothing'}.", "", "## Blocked items", ""]
    for b in data["blocked"] or []:
        out.append(f"- {b['id']} {b['change']}: {'; '.join(b['reasons'])[:400]}")
        for boot in b["boots"]:
            secs = f"{boot['seconds_to_failure']:.0f} s" if boot["seconds_to_failure"] is not None else "?"
            out.append(f"  - {boot['host']} ({boot['phase']}): BOOT FAILED in {secs}, line {boot['line']}: "
                       f"`{boot['first_error']}` (log: {b['id']}/{boot['log']})")
    if not data["blocked"]:
        out.append("None.")
    out += ["", "## Operator's call (measured, never kept automatically)", ""]
    for row in data["operator_call"] or []:
        agg = row.get("aggregate") or [None, None]
        out.append(f"- {row['change']}: {row['primary']} {_fmt(row['primary_value'])} tok/s a stream, ratio {_ratio_text(row)}"
                   + (f", aggregate {agg[0]:.1f} -> {agg[1]:.1f} tok/s" if None not in agg else "")
                   + f", {row['verdict']}; {row['reason'] or 'no reason recorded'}")
    if not data["operator_call"]:
        out.append("None.")
    out += ["", "## Not reached before the window closed (or before the campaign stopped)", ""]
    out += [f"- {row['id']} {row['change']}: {row['reason']}" for row in data["not_reached"]] or ["None."]
    out += ["", "## Skipped", ""]
    out += [f"- {row['id']} {row['change']}: {row['reason']}" for row in data["skipped"]] or ["None."]
    cost = state.get("overhead") or {}
    if cost.get("percent") is not None:
        out += ["", "## The campaign's own time", "",
                f"{cost['overhead_s']:.0f} s of {cost['wall_s']:.0f} s ({cost['percent']:.1f}%) outside the rungs' nested "
                f"runs ({cost['nested_s']:.0f} s): checkpoint verification, decisions, state writes, polling latency, "
                f"the final proof."]
        if cost.get("other_percent") is not None:
            out += ["", f"Boots, benchmarks and host changes took {cost['work_s']:.0f} s of the {cost['wall_s']:.0f} s; "
                        f"everything else, the rollouts' own checks, restore points and gates included, "
                        f"{cost['other_s']:.0f} s ({cost['other_percent']:.1f}%)."]
    out += ["", "## Roll the whole campaign back", "", "```", data["rollback"], "```", "",
            "Evidence per rung: rungs/<rung>/ (rollout.md, rollout.json, restore-point.json, boot-logs/, bench-*.json); "
            "plots in plots/; the state in campaign-state.json.", ""]
    return "\n".join(out)


def terminal(state: dict, data: dict, run_dir: str) -> list[str]:
    """The play's closing summary: under 40 lines."""
    lines = [f"Campaign {state['plan']['name']}: {len(state['rungs'])} rungs"
             + (f", STOPPED: {data['stopped']['reason'][:120]}" if data["stopped"] else "")]
    for row in data["rows"][:24]:
        lines.append(f"{row['id']:<26} {row['verdict']:<30} {_ratio_text(row)}")
    if len(data["rows"]) > 24:
        lines.append(f"... {len(data['rows']) - 24} more rungs in REPORT.md")
    cum = data["cumulative"]
    if cum["ratio"] is not None:
        lines.append(f"Cumulative {cum['workload']}: {cum['first']['median']:.1f} -> {cum['final']['median']:.1f} tok/s, "
                     f"x{cum['ratio']:.3f} [{cum['ci'][0]:.3f}, {cum['ci'][1]:.3f}]")
    lines.append(f"Kept: {', '.join(data['kept']) or 'nothing'}; blocked: {len(data['blocked'])}; "
                 f"operator's call: {len(data['operator_call'])}; not reached: {len(data['not_reached'])}")
    lines.append(f"Roll back: {data['rollback']}")
    lines.append(f"Report: {os.path.join(run_dir, 'REPORT.md')}")
    return lines[:39]


def plots(state: dict, data: dict, folder: str) -> list[str]:
    """PNG plots: each measured rung's ratio with its interval, and the first against the final configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(folder, exist_ok=True)
    written = []
    rows = [r for r in data["rows"] if r["ratio"] is not None]
    if rows:
        fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.5))
        for i, r in enumerate(rows):
            lo, hi = r["ci"] or [r["ratio"], r["ratio"]]
            colour = "tab:green" if r["verdict"] in ("kept", "won its trial") else "tab:grey"
            ax.errorbar(r["ratio"], i, xerr=[[r["ratio"] - lo], [hi - r["ratio"]]], fmt="o", color=colour, capsize=4)
            if r["threshold"]:
                ax.plot([r["threshold"]] * 2, [i - 0.3, i + 0.3], color="tab:red", lw=1)
        ax.axvline(1.0, color="black", lw=0.5)
        ax.set_yticks(range(len(rows)), [f"{r['id']} ({r['verdict']})" for r in rows])
        ax.set_xlabel("median(candidate) / median(incumbent), decode tok/s, 95% interval; red: keep threshold")
        ax.set_title(f"Campaign {state['plan']['name']}: rungs")
        fig.tight_layout()
        path = os.path.join(folder, "rungs.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    cum = data["cumulative"]
    if cum["ratio"] is not None:
        fig, ax = plt.subplots(figsize=(5, 4))
        for x, (label, c) in enumerate((("first baseline", cum["first"]), ("final", cum["final"]))):
            ax.bar(x, c["median"], yerr=[[c["median"] - c["min"]], [c["max"] - c["median"]]], capsize=6,
                   color="tab:blue" if x == 0 else "tab:green")
            ax.text(x, c["median"], f"{c['median']:.1f}", ha="center", va="bottom")
        ax.set_xticks([0, 1], ["first baseline", "final configuration"])
        ax.set_ylabel(f"{cum['workload']} decode tok/s (median, min-max)")
        ax.set_title(f"x{cum['ratio']:.3f} [{cum['ci'][0]:.3f}, {cum['ci'][1]:.3f}]")
        fig.tight_layout()
        path = os.path.join(folder, "cumulative.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def write(state: dict, catalog: dict, run_dir: str) -> dict:
    """REPORT.md and plots/ in the campaign's run folder; returns {report, plots, summary, data}."""
    try:
        from ansible.module_utils.file_io import write_atomic
    except ImportError:
        from file_io import write_atomic  # type: ignore[no-redef]
    data = build(state, catalog)
    report = os.path.join(run_dir, "REPORT.md")
    write_atomic(report, markdown(state, data))
    written = plots(state, data, os.path.join(run_dir, "plots"))
    return {"report": report, "plots": written, "summary": terminal(state, data, run_dir), "data": data}
