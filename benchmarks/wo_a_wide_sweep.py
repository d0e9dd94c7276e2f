#!/usr/bin/env python3
"""Sweep of the wide path's ring tilings (issue 26) against the bf16 einsum and the prefill path.

    python benchmarks/wo_a_wide_sweep.py --out sweep.json

For G in --groups and M in --ms: the bf16 einsum, the prefill path (one group's bounded bf16 scratch
plus cuBLAS), the mid kernels' dispatcher configuration (M <= 192), and ring tilings of 16/32/64-token
tiles run as ceil(M / tile) launches; every time is CUDA-graph replay over --sets weight sets (the
method of benchmarks/wo_a_bench.py). Each candidate is checked against a float64 reference and its
graph result against the eager one, bit for bit. Needs a CUDA GPU with Gluon."""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

import wo_a_bench as B  # noqa: E402
from kernels import wo_a_gluon as GL  # noqa: E402
from kernels import wo_a_w8 as K  # noqa: E402


def candidates(m: int, smem_limit: int) -> list[GL.RingConfig]:
    out = []
    for bm in (16, 32, 64):
        if bm == 16 and m > 64:
            continue
        if bm > 16 and bm >= 2 * m:
            continue
        for br, rw in ((16, 1), (32, 2)):
            for st in ((3, 4) if bm == 64 else (4, 6)):
                c = GL.RingConfig(br, bm, 4, 2, st, pdl=True, row_warps=rw)
                if c.smem_footprint() <= smem_limit:
                    out.append(c)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--ms", type=int, nargs="+", default=[24, 32, 48, 64, 96, 128, 192, 512, 1024])
    ap.add_argument("--sets", type=int, default=8)
    ap.add_argument("--replays", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--deadline", type=float, default=500.0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--table-out", default=None, help="write the dispatcher table the sweep chose (JSON)")
    args = ap.parse_args()
    t0 = time.time()
    gen = torch.Generator(device="cuda").manual_seed(26)
    smem = GL._smem_per_block(torch.device("cuda"))
    info = B.device_info()
    info.update(sets=args.sets, replays=args.replays, repeats=args.repeats, smem_per_block=smem,
                command=" ".join([Path(sys.executable).name] + sys.argv))
    print(json.dumps(info), flush=True)
    result = {"info": info, "rows": []}
    R, D = B.R, B.D
    for g in args.groups:
        twins = [B.random_twin(g, gen) for _ in range(args.sets)]
        ws = [K.dequantize(t) for t in twins]
        for m in args.ms:
            if time.time() - t0 > args.deadline:
                print("deadline reached", flush=True)
                break
            xs = [B.random_x(m, g, gen) for _ in range(args.sets)]
            outs = [torch.empty((m, g, R), dtype=torch.bfloat16, device="cuda") for _ in range(args.sets)]
            ref = torch.einsum("tgd,grd->tgr", xs[0].double(), ws[0].double())

            def timed(name, call, cfg=None):
                row = {"G": g, "M": m, "name": name, "config": asdict(cfg) if cfg is not None else None}
                try:
                    y = torch.full((m, g, R), float("nan"), dtype=torch.bfloat16, device="cuda")
                    call(0, y)
                    row["rel_err_vs_fp64"] = ((y.double() - ref).norm() / ref.norm()).item()
                    fns = [lambda i=i: call(i, outs[i]) for i in range(args.sets)]
                    row["us"] = B.graph_time_us(fns, args.replays, args.repeats)
                    row["graph_matches_eager"] = bool(torch.equal(outs[0].view(torch.int16), y.view(torch.int16)))
                except Exception as exc:  # recorded; the sweep goes on
                    row["error"] = repr(exc)[:400]
                result["rows"].append(row)
                return row

            ein = timed("einsum", lambda i, y: y.copy_(torch.einsum("tgd,grd->tgr", xs[i], ws[i])))
            # the einsum as the stock code runs it (its result, a permuted view, not copied)
            ein_fns = [lambda i=i: torch.einsum("tgd,grd->tgr", xs[i], ws[i]) for i in range(args.sets)]
            ein["us_no_copy"] = B.graph_time_us(ein_fns, args.replays, args.repeats)
            base = ein["us_no_copy"]
            rows = [timed("prefill", lambda i, y: K.wo_a(xs[i], twins[i], out=y, path="einsum"))]
            if m <= K.MID_MAX_M:
                rows.append(timed("mid", lambda i, y: K.wo_a(xs[i], twins[i], out=y, path="mid")))
            for c in candidates(m, smem):
                rows.append(timed("wide", lambda i, y, c=c: K.wo_a(xs[i], twins[i], out=y, config=c, path="wide"), c))
            good = [r for r in rows if "us" in r and r["rel_err_vs_fp64"] < 1e-2 and r["graph_matches_eager"]]
            good.sort(key=lambda r: r["us"])
            if good and good[0]["name"] == "wide":  # the best tiling as a plain launch too
                c = replace(GL.RingConfig(**good[0]["config"]), pdl=False)
                rows.append(timed("wide", lambda i, y, c=c: K.wo_a(xs[i], twins[i], out=y, config=c, path="wide"), c))
            for r in sorted(good, key=lambda r: r["us"])[:4]:
                c = r["config"] or {}
                print(f"G={g} M={m:4d} einsum {base:7.2f} us | {r['name']:7s} {r['us']:7.2f} us x{base / r['us']:.2f}"
                      f" err {r['rel_err_vs_fp64']:.1e} {c.get('block_r', '')},{c.get('block_m', '')},"
                      f"{c.get('stages', '')},{'pdl' if c.get('pdl') else ''},rw{c.get('row_warps', '')}", flush=True)
            bad = [r for r in rows if "error" in r or not (r.get("rel_err_vs_fp64", 1) < 1e-2)
                   or not r.get("graph_matches_eager", False)]
            for r in bad:
                print(f"G={g} M={m} BAD {r['name']} {r.get('config')} {r.get('error', '')} "
                      f"err {r.get('rel_err_vs_fp64')} graph {r.get('graph_matches_eager')}", flush=True)
            del xs, outs, ref
        del twins, ws
        torch.cuda.empty_cache()
    info["wall_s"] = time.time() - t0
    result["table"] = choose_table(result["rows"])
    Path(args.out).write_text(json.dumps(result, indent=1))
    if args.table_out:
        Path(args.table_out).write_text(json.dumps(result["table"], indent=1))
    print(json.dumps(result["table"]), flush=True)
    return 0


def choose_table(rows: list[dict], mid_max_m: int = K.MID_MAX_M, margin: float = 0.05) -> dict:
    """The dispatcher table from the sweep's rows. Per G and swept M (a bucket up to that M): the
    fastest correct, graph-stable fp8-only path (a wide tiling, mid up to ``mid_max_m`` rows, or
    prefill). The wide path serves 17..``wide_max_m`` rows, so it takes the leading run of buckets where
    its best tiling beats every other fp8 path, mid by more than the fraction ``margin`` (the sweep's few repeats
    cannot separate closer times; the mid kernels are the default). Then the path the dispatcher runs
    per bucket (wide, mid, or prefill above ``mid_max_m``) and the M ranges where the bf16 einsum on a
    held weight beats that path (EINSUM_FASTER; adjacent buckets merged)."""
    table: dict = {"wide": {}, "wide_max_m": {}, "einsum_faster": [], "buckets": {}}
    for g in sorted({r["G"] for r in rows}):
        ms = sorted({r["M"] for r in rows if r["G"] == g})
        wide, max_m, open_run, buckets, faster = [], 16, True, [], []
        for m in ms:
            here = [r for r in rows if r["G"] == g and r["M"] == m]
            ok = [r for r in here if "us" in r and r["rel_err_vs_fp64"] < 1e-2 and r["graph_matches_eager"]
                  and r["name"] != "einsum"]
            ein = next(r for r in here if r["name"] == "einsum")["us_no_copy"]
            best = {}
            for r in ok:
                if r["name"] not in best or r["us"] < best[r["name"]]["us"]:
                    best[r["name"]] = r
            others = [r["us"] / (1 + margin if n == "mid" else 1) for n, r in best.items() if n != "wide"]
            wide_wins = "wide" in best and all(best["wide"]["us"] < t for t in others)
            if open_run and m > 16 and wide_wins:
                wide.append([m, best["wide"]["config"]])
                max_m = m
            else:
                open_run = False
            path = "wide" if m <= max_m else "mid" if m <= mid_max_m else "prefill"
            run = best.get(path)
            fastest = min(best.values(), key=lambda r: r["us"], default=None)
            buckets.append({"M": m, "path": path, "us": run["us"] if run else None, "einsum_us": ein,
                            "fastest": fastest["name"] if fastest else None,
                            "fastest_us": fastest["us"] if fastest else None})
            if run is None or ein < run["us"]:
                lo = buckets[-2]["M"] + 1 if len(buckets) > 1 else 17
                if faster and faster[-1][1] == lo - 1:
                    faster[-1][1] = m
                else:
                    faster.append([lo, m, g])
        table["wide"][g] = wide
        table["wide_max_m"][g] = max_m
        table["einsum_faster"] += faster
        table["buckets"][g] = buckets
    return table


if __name__ == "__main__":
    sys.exit(main())
