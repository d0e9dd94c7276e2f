#!/usr/bin/env python3
"""Wall time of the node preflight on the testbed (docs/preflight.md).

Runs `ansible-playbook playbooks/preflight.yml` REPEAT times, and as many times with preflight_skip=true
(the same playbook doing nothing on the hosts: Ansible's own start-up and the inventory validation), and
prints the medians, their difference (what the preflight adds to every entry playbook) and the load average.

    SPARKFLEET_TESTBED_ID=<k> ANSIBLE_HOME=.ansible-<k> .venv/bin/python benchmarks/preflight_bench.py [--repeat 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def once(skip: bool) -> float:
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "playbooks/preflight.yml"]
    if skip:
        argv += ["-e", "preflight_skip=true"]
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"preflight.yml failed (rc {proc.returncode}): {proc.stdout[-1500:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    full, skipped = [], []
    for _ in range(args.repeat):
        full.append(once(False))
        skipped.append(once(True))
    result = {"runs": args.repeat, "preflight_s": round(statistics.median(full), 2),
              "preflight_min_max_s": [round(min(full), 2), round(max(full), 2)],
              "skipped_s": round(statistics.median(skipped), 2),
              "added_by_preflight_s": round(statistics.median(full) - statistics.median(skipped), 2),
              "load_average": os.getloadavg(), "cpus": os.cpu_count()}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
