#!/usr/bin/env python3
"""One campaign trial rung, run the way a campaign runs it, and where its time goes (docs/campaign.md).

Runs playbooks/rollout.yml with a campaign rung's variables (rung-vars.json of the testbed-3 plan: a trial of
EXPERIMENT, prose c1, 5 reps of 48 tokens, preflight_skip=true) through module_utils/nested_play.py, REPEAT
times, on a serving testbed (the fleet must serve its incumbent: tests/integration/test_campaign.py's SLOW_SIM;
a trial always restores it), and prints each run's wall time, boots and benchmarks (`work_s`), the rest
(orchestration), the number of task starts (benchmarks/rung_profile.py) and the controller's CPU seconds
(ansible-playbook, its forks and ssh: Ansible's own cost, much less sensitive to the load than wall time), then
their medians and the load average. With --tree, the playbooks and roles of another checkout of the project run against this checkout's
inventory: alternate two trees to compare them under the same load.

    SPARKFLEET_TESTBED_ID=<k> ANSIBLE_HOME=.ansible-<k> .venv/bin/python benchmarks/rung_bench.py --repeat 3
    ... --tree /path/to/other/checkout --label before
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "module_utils"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from module_utils.nested_play import run  # noqa: E402
from rung_profile import profile  # noqa: E402

RUNG_VARS = {"preflight_skip": True, "rollout_trial": True, "window_confirmed": True, "rollout_types": ["prose"],
             "rollout_concurrency": [1], "rollout_reps": 5, "rollout_warmup": 1, "rollout_max_tokens": 48}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--experiment", default="folded_fence")
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose playbooks and roles run")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / f"rung-bench-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    args = ap.parse_args()
    tree = args.tree.resolve()
    # ansible-runner starts ansible-playbook from PATH: this interpreter's (the project's .venv) first, as the
    # tests do; without it `.venv/bin/python benchmarks/rung_bench.py` failed with rc 127 outside an activated venv
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    inventory = str(ROOT / "inventory" / "testbed")
    rows = []
    for i in range(args.repeat):
        folder = args.out.resolve() / f"{i + 1:02d}{'-' + args.label if args.label else ''}"
        folder.mkdir(parents=True, exist_ok=True)
        load0 = os.getloadavg()[0]
        cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        # the tree's own ansible.cfg (roles, library, module_utils relative to it)
        os.environ["ANSIBLE_CONFIG"] = str(tree / "ansible.cfg")
        result = run(str(tree / "playbooks" / "rollout.yml"), str(folder / "runner"), inventory=[inventory],
                     extra_vars=dict(RUNG_VARS, experiment=args.experiment), env={"SPARKFLEET_RUN_DIR": str(folder)},
                     project_dir=str(tree))
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = profile(folder / "runner" / "artifacts" / "nested" / "job_events")
        # the controller's CPU seconds (ansible-playbook, its forks and ssh): what Ansible's turns cost, whatever
        # the load; the hosts' side (modules, boots, the benchmark) is not counted
        p["cpu_s"] = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
        outcome = json.loads((folder / "rollout.json").read_text())["outcome"] if (folder / "rollout.json").is_file() else "-"
        rows.append(dict(p, rc=result["rc"], outcome=outcome, load=(load0 + os.getloadavg()[0]) / 2))
        print(f"{folder.name}: rc {result['rc']} {outcome}; wall {p['wall_s']:.1f} s, boots and benchmarks "
              f"{p['work_s']:.1f} s, orchestration {p['orchestration_s']:.1f} s, {p['tasks']} task starts, "
              f"controller CPU {p['cpu_s']:.1f} s, load {rows[-1]['load']:.1f}", flush=True)
        if result["rc"] != 0:
            print(result["stdout_tail"][-2000:])
            return 1
    med = {k: statistics.median(r[k] for r in rows) for k in ("wall_s", "work_s", "orchestration_s", "tasks", "cpu_s", "load")}
    print(f"median of {len(rows)} ({tree}): wall {med['wall_s']:.1f} s, boots and benchmarks {med['work_s']:.1f} s, "
          f"orchestration {med['orchestration_s']:.1f} s, {med['tasks']:.0f} task starts, controller CPU {med['cpu_s']:.1f} s, "
          f"load {med['load']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
