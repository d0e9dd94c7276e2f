#!/usr/bin/env python3
"""Checkpoint verification throughput against a sequential read of the same files (docs/preflight.md).

Writes FILES files of SIZE MiB (default 16 x 128 MiB, like a run of safetensors shards) into DIR, builds the
manifest, then REPEAT times runs ``verify(measure=True, measure_rounds=ROUNDS)``: a cold sequential read of the
files (one stream, pages dropped first), then the cold verification (pages dropped again), ROUNDS pairs
alternated and their medians compared. Prints one JSON line per repetition and the median ratio verify/read.
``--layout testbed`` writes the testbed checkpoint's shape instead (47 files of 4,352 bytes, one of 30.2 MiB,
one of 24.2 MiB: 57 MB), the case where one pass takes tens of milliseconds. The same measurement runs on the
fleet with ``ansible-playbook playbooks/checkpoint_manifest.yml -e checkpoint_manifest_measure=true``.

    python3 benchmarks/checkpoint_manifest_bench.py [--dir DIR] [--files 16] [--size-mib 128] [--repeat 3]
    python3 benchmarks/checkpoint_manifest_bench.py --layout testbed --rounds 7 --repeat 5
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "module_utils"))
import checkpoint_manifest as cm  # noqa: E402


TESTBED_SIZES = [4352] * 47 + [31_685_952, 25_349_432]   # testbed/checkpoint.py's 49 files


def make_files(directory: str, files: int, size_mib: int, sizes: list | None = None) -> None:
    block = os.urandom(8 << 20)
    sizes = sizes or [size_mib << 20] * files
    for i, size in enumerate(sizes):
        path = os.path.join(directory, f"model-{i + 1:05d}-of-{len(sizes):05d}.safetensors")
        if os.path.exists(path) and os.path.getsize(path) == size:
            continue
        with open(path, "wb") as fh:
            left, j = size, 0
            while left:
                piece = (i.to_bytes(4, "little") + j.to_bytes(4, "little") + block[8:])[:left]
                fh.write(piece)
                left -= len(piece)
                j += 1
            fh.flush()
            os.fsync(fh.fileno())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir")
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--size-mib", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=1, help="alternated (read, verify) pairs per repetition")
    parser.add_argument("--layout", choices=["uniform", "testbed"], default="uniform")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    directory = args.dir or tempfile.mkdtemp(prefix="sparkfleet-manifest-bench.")
    os.makedirs(directory, exist_ok=True)
    try:
        make_files(directory, args.files, args.size_mib, TESTBED_SIZES if args.layout == "testbed" else None)
        manifest = cm.build(directory, workers=args.workers)["manifest"]
        ratios = []
        for rep in range(args.repeat):
            result = cm.verify(directory, manifest, measure=True, check_index=False, workers=args.workers,
                               measure_rounds=args.rounds)
            assert result["ok"], result["problems"]
            m = result["measure"]
            ratios.append(m["ratio"])
            print(json.dumps({"rep": rep + 1, "bytes": m["read_bytes"], "read_mb_per_s": m["read_mb_per_s"],
                              "verify_mb_per_s": m["verify_mb_per_s"], "ratio": m["ratio"],
                              "workers": args.workers or cm.default_workers(), "cpus": os.cpu_count(),
                              "rounds": m.get("rounds", 1), "load": round(os.getloadavg()[0], 2)}))
        print(json.dumps({"median_ratio": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}))
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
