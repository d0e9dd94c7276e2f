#!/usr/bin/env python3
"""Where a campaign rung's (or any nested run's) wall time goes, from its own ansible-runner job events
(docs/campaign.md "Measured on the testbed").

For each run folder given (a rung folder runs/<time>-campaign/rungs/<nn>-<name>, a campaign folder for all its
rungs, or any folder holding runner/artifacts/*/job_events), prints: the nested run's wall time (its first event
to its last), the seconds of boots, benchmarks and host changes (module_utils/campaign_report.py `work_s`: the
union of decode_bench, engine_liveness_info, engram_pack (a pack run in the background: to the check that saw it
end) and the engine-container tasks that changed a container, engine_container's and docker_container's), the rest
(orchestration: Ansible's own turns, checks, rendering, reports) and the number of task starts; with --top N,
the N task names that cost most (a task's time runs from its start to the next task's start, summed by name).

    .venv/bin/python benchmarks/rung_profile.py runs/<time>-campaign/rungs/02-folded_fence [--top 25]
    .venv/bin/python benchmarks/rung_profile.py runs/<time>-campaign            # every rung of a campaign
"""
from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "module_utils"))

from module_utils.campaign_report import _task_intervals, union_s  # noqa: E402


def _events(folder: Path) -> list[dict]:
    out = []
    for p in folder.glob("*.json"):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    out.sort(key=lambda ev: ev.get("counter", 0))
    return out


def _ts(value: str) -> float:
    return dt.datetime.fromisoformat(value).timestamp()


def profile(events_dir: Path) -> dict:
    """{wall_s, work_s, orchestration_s, tasks, by_task} of one nested run's job_events folder."""
    events = _events(events_dir)
    times = [_ts(ev["created"]) for ev in events if ev.get("created")]
    wall = (max(times) - min(times)) if times else 0.0
    work = union_s(_task_intervals(str(events_dir)))
    starts = [(_ts(ev["created"]), ev["event_data"].get("task", "?")) for ev in events
              if ev.get("event") in ("playbook_on_task_start", "playbook_on_handler_task_start") and ev.get("created")]
    by_task: dict[str, float] = collections.defaultdict(float)
    ends = [t for t, _ in starts[1:]] + [max(times) if times else 0.0]
    for (start, name), end in zip(starts, ends):
        by_task[name] += max(end - start, 0.0)
    return {"wall_s": wall, "work_s": work, "orchestration_s": wall - work, "tasks": len(starts), "by_task": by_task}


def job_event_dirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("job_events") if p.is_dir())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--top", type=int, default=0, help="also list the N costliest task names")
    args = ap.parse_args()
    rows = []
    for folder in args.folders:
        rungs = sorted(p for p in (folder / "rungs").iterdir() if p.is_dir()) if (folder / "rungs").is_dir() else [folder]
        for rung in rungs:
            dirs = job_event_dirs(rung)
            if not dirs:
                continue
            parts = [profile(d) for d in dirs]
            # a host change's apply/revert plays (apply/, revert/) run inside the rung's own run, whose events span them
            main_dir = [d for d in dirs if d.parents[3] == rung]
            top = profile(main_dir[0]) if main_dir else parts[0]
            work = union_s(sum((_task_intervals(str(d)) for d in dirs), []))
            rows.append((rung.name, top["wall_s"], work, top["wall_s"] - work, sum(p["tasks"] for p in parts), top))
    print(f"{'rung':32} {'wall s':>8} {'work s':>8} {'orchestration s':>16} {'tasks':>6}")
    for name, wall, work, orch, tasks, _ in rows:
        print(f"{name:32} {wall:8.1f} {work:8.1f} {orch:16.1f} {tasks:6d}")
    if args.top:
        for name, *_, top in rows:
            print(f"\n{name}: the {args.top} costliest task names (start to next start, summed)")
            for task, secs in sorted(top["by_task"].items(), key=lambda kv: -kv[1])[:args.top]:
                print(f"  {secs:7.1f}  {task}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
