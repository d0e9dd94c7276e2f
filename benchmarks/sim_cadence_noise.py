"""The simulator's decision noise: incumbent CV and a no-effect A/B ratio, optionally under host load.

Two simulator processes with the same config (A = incumbent, B = a change with no modelled effect) serve
`--reps` repetitions each of one prose request (c1) through the bench client's stream_request; a
repetition's figure is its decode tok/s (first/last token times). Prints the CV of A's repetitions and
mean(B) / mean(A) per trial. `--busy N` starts N CPU-bound processes for the run (ended by pid).

  .venv/bin/python benchmarks/sim_cadence_noise.py [--engine-dir testbed/engine] [--busy 2] [--trials 3]

Run it against an older copy of the engine (`--engine-dir /tmp/old_engine`) for a with/without comparison.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "module_utils"))
import decode_client  # noqa: E402
import prompt_catalog  # noqa: E402


def _busy() -> None:
    while True:
        pass


def _load_engine(engine_dir: str):
    sys.path.insert(0, os.path.abspath(engine_dir))  # api.py imports model.py as a sibling when it is a script
    spec = importlib.util.spec_from_file_location("sim_api_under_test", os.path.join(engine_dir, "api.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _reps(api, url: str, reps: int, tokens: int) -> list[float]:
    ep = decode_client.Endpoint(url, None)
    body = json.dumps({"model": "DeepSeek-V4.1-Flash", "stream": True, "max_tokens": tokens, "temperature": 0.0,
                       "ignore_eos": True, "stream_options": {"include_usage": True}, "messages": [{"role": "user",
                                                         "content": prompt_catalog.CATALOG["prose"][0]}]}).encode()
    rates = []
    for rep in range(reps + 1):  # the first is a warm-up
        result = decode_client.RequestResult("prose", 1, rep, rep == 0, 0, 0)
        decode_client.stream_request(ep, body, 60.0, result)
        if not result.ok or result.decode_tok_s is None:
            raise SystemExit(f"request failed: {result.error}")
        if rep:
            rates.append(result.decode_tok_s)
    return rates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-dir", default=os.path.join(os.path.dirname(__file__), "..", "testbed", "engine"))
    parser.add_argument("--time-scale", type=float, default=0.25)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--busy", type=int, default=0)
    args = parser.parse_args()
    api = _load_engine(args.engine_dir)
    busy = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(args.busy)]
    for proc in busy:
        proc.start()
    try:
        for trial in range(args.trials):
            rates = {}
            for arm in ("A", "B"):
                with api.serving_process(api.SimConfig(time_scale=args.time_scale)) as (_, url):
                    rates[arm] = _reps(api, url, args.reps, args.tokens)
            mean_a = statistics.mean(rates["A"])
            print(f"trial {trial + 1}: incumbent CV {100 * statistics.stdev(rates['A']) / mean_a:.2f} %  "
                  f"no-effect ratio {statistics.mean(rates['B']) / mean_a:.3f}  "
                  f"(A {mean_a:.1f} tok/s, load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        for proc in busy:
            os.kill(proc.pid, 9)
            proc.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
