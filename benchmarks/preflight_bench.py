#!/usr/bin/env python3
"""Wall time of the node preflight on the testbed (docs/preflight.md).

Runs `ansible-playbook playbooks/preflight.yml` REPEAT times, and as many times with preflight_skip=true
(the same playbook doing nothing on the hosts: Ansible's own start-up and the inventory validation), and
prints the medians, their difference (what the preflight adds to every entry playbook) and the load average.

Besides wall time it reports CPU seconds, which do not depend on how loaded the machine is: the controller's
(ansible-playbook and its children: forks, ssh) and the whole machine's (from /proc/stat, so the testbed hosts'
sshd, module and stand-in processes are counted too; other users' work counts as well, so compare it at low
load). On an oversubscribed machine the wall time is roughly machine CPU x load / cores.

    SPARKFLEET_TESTBED_ID=<k> ANSIBLE_HOME=.ansible-<k> .venv/bin/python benchmarks/preflight_bench.py [--repeat 5]
    ... --profile        # also: where one run's wall time goes, per task (benchmarks/callback/task_timer.py)
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def machine_cpu() -> float:
    """Busy CPU seconds of the whole machine so far (user+nice+system+irq+softirq+steal)."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + (fields[7] if len(fields) > 7 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


def once(skip: bool, profile: str | None = None) -> dict:
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "playbooks/preflight.yml"]
    if skip:
        argv += ["-e", "preflight_skip=true"]
    env = dict(os.environ)
    if profile:
        env["ANSIBLE_CALLBACK_PLUGINS"] = f"{ROOT}/plugins/callback:{ROOT}/benchmarks/callback"
        env["ANSIBLE_CALLBACKS_ENABLED"] = "run_record,task_timer"
        env["TASK_TIMER_OUT"] = profile
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0 = machine_cpu()
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env)
    elapsed = time.monotonic() - started
    cpu1 = machine_cpu()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"preflight.yml failed (rc {proc.returncode}): {proc.stdout[-1500:]}")
    return {"wall": elapsed, "controller_cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "machine_cpu": cpu1 - cpu0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="print where one extra run's time goes, per task")
    args = parser.parse_args()
    full, skipped = [], []
    load_before = os.getloadavg()
    for _ in range(args.repeat):
        full.append(once(False))
        skipped.append(once(True))

    def med(runs, key):
        return round(statistics.median(r[key] for r in runs), 2)
    result = {"runs": args.repeat, "preflight_s": med(full, "wall"),
              "preflight_min_max_s": [round(min(r["wall"] for r in full), 2), round(max(r["wall"] for r in full), 2)],
              "skipped_s": med(skipped, "wall"),
              "added_by_preflight_s": round(med(full, "wall") - med(skipped, "wall"), 2),
              "controller_cpu_s": med(full, "controller_cpu"), "controller_cpu_skipped_s": med(skipped, "controller_cpu"),
              "machine_cpu_s": med(full, "machine_cpu"), "machine_cpu_skipped_s": med(skipped, "machine_cpu"),
              "load_average_before": [round(x, 2) for x in load_before],
              "load_average": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}
    print(json.dumps(result))
    if args.profile:
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            once(False, out.name)
            report = json.load(open(out.name))
        print(json.dumps({"profile_total_s": report["total_s"],
                          "tasks": [[t["task"][:90], t["s"]] for t in report["tasks"][:12]]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
