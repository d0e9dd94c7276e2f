#!/usr/bin/env python3
"""Benchmark of the decode benchmark client itself (docs/bench.md records its figures).

Starts the engine simulator in a separate process on 127.0.0.1 (16 slots, full speed: time_scale 1.0 unless
told otherwise), runs module_utils/decode_client against it at c16, then reports:

- accuracy: per request, the client's time per output token against the one the server computes from its
  own chunk timestamps (``/server_info?timings=1``); criterion |difference| <= 1 ms for every request;
- cost: the client's CPU time (time.process_time and resource.getrusage of this process, which holds only
  the client: the server is another process) divided by wall time; criterion <= 25 % of one core.

    .venv/bin/python benchmarks/bench_client_bench.py                   # full speed, c16 (~1 min)
    .venv/bin/python benchmarks/bench_client_bench.py --time-scale 0.1  # 10x compressed: 10x the chunk rate

Exit status 0 when both criteria hold, 1 otherwise. ``--json`` prints the figures as JSON.
"""
from __future__ import annotations

import argparse
import http.client
import json
import resource
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "module_utils"))

import decode_client  # noqa: E402
from bench_stats import median, quantile  # noqa: E402
from testbed.engine.api import serving_process  # noqa: E402
from testbed.engine.model import SimConfig  # noqa: E402

TPOT_LIMIT_MS = 1.0
CPU_LIMIT = 0.25


def server_timings(url: str) -> dict:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("GET", "/server_info?timings=1")
        return {t["id"]: t for t in json.loads(conn.getresponse().read())["debug"]["timings"]}
    finally:
        conn.close()


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--types", nargs="+", default=["prose", "code"])
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--poll-interval", type=float, default=0.2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    config = SimConfig(time_scale=args.time_scale, max_running_requests=max(4, args.concurrency))
    bench = decode_client.BenchConfig(url="http://127.0.0.1:1", types=args.types, concurrency=[args.concurrency],
                                      max_tokens=args.max_tokens, warmup=args.warmup, reps=args.reps,
                                      poll_interval=args.poll_interval, idle_wait=5.0)
    with serving_process(config) as (_, url):
        bench.url = url
        wall0, cpu0, rusage0 = time.perf_counter(), time.process_time(), cpu_seconds()
        result = decode_client.run_benchmark(bench)
        wall = time.perf_counter() - wall0
        cpu_process_time = time.process_time() - cpu0
        cpu_rusage = cpu_seconds() - rusage0
        timings = server_timings(url)

    diffs, ratios = [], []
    for request in result["requests"]:
        server = timings.get(request["id"])
        if not request["ok"] or not server or "server_tpot_ms" not in server:
            continue
        diffs.append(abs(request["tpot_ms"] - server["server_tpot_ms"]))
        ratios.append(request["decode_tok_s"] / server["server_decode_tok_s"])
    chunks = sum(r["text_chunks"] for r in result["requests"])
    figures = {
        "concurrency": args.concurrency, "time_scale": args.time_scale, "max_tokens": args.max_tokens,
        "types": args.types, "waves": (args.warmup + args.reps) * len(args.types), "requests": len(diffs),
        "invalid_conditions": result["invalid_count"],
        "tpot_abs_diff_ms": {"median": median(diffs), "p95": quantile(diffs, 0.95), "max": max(diffs)},
        "decode_rate_ratio_client_over_server": {"min": min(ratios), "median": median(ratios), "max": max(ratios)},
        "median_tpot_ms": median([r["tpot_ms"] for r in result["requests"] if r["ok"]]),
        "client_wall_s": wall, "client_cpu_s_process_time": cpu_process_time, "client_cpu_s_rusage": cpu_rusage,
        "client_cpu_share_of_one_core": max(cpu_process_time, cpu_rusage) / wall,
        "text_chunks_per_s": chunks / wall,
        "decode_tok_s_median": {f"{c['type']} c{c['concurrency']}": (c["stats"] or {}).get(
            "decode_tok_s", {}).get("median") for c in result["conditions"]},
    }
    ok = (figures["invalid_conditions"] == 0 and figures["tpot_abs_diff_ms"]["max"] <= TPOT_LIMIT_MS
          and figures["client_cpu_share_of_one_core"] <= CPU_LIMIT)
    figures["pass"] = ok
    if args.json:
        print(json.dumps(figures, indent=1))
    else:
        tpot = figures["tpot_abs_diff_ms"]
        print(f"c{args.concurrency}, time_scale {args.time_scale}, {len(diffs)} requests of {args.max_tokens} tokens "
              f"({', '.join(args.types)}), median TPOT {figures['median_tpot_ms']:.2f} ms")
        print(f"|client TPOT - server TPOT|: median {tpot['median']:.4f} ms, p95 {tpot['p95']:.4f} ms, "
              f"max {tpot['max']:.4f} ms (limit {TPOT_LIMIT_MS} ms)")
        ratio = figures["decode_rate_ratio_client_over_server"]
        print(f"decode rate client/server: min {ratio['min']:.4f}, median {ratio['median']:.4f}, "
              f"max {ratio['max']:.4f}")
        print(f"client CPU: {cpu_process_time:.2f} s (process_time), {cpu_rusage:.2f} s (getrusage) over "
              f"{wall:.1f} s wall = {100 * figures['client_cpu_share_of_one_core']:.2f} % of one core "
              f"(limit {100 * CPU_LIMIT:.0f} %); {figures['text_chunks_per_s']:.0f} text chunks/s")
        for name, value in figures["decode_tok_s_median"].items():
            print(f"  {name}: decode {value:.2f} tok/s per stream (median)" if value else f"  {name}: invalid")
        print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
