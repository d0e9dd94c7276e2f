#!/usr/bin/env python3
"""Sweep of the ``tc`` path's tilings (issue 26) against the bf16 einsum and the other fp8-only paths.

    python benchmarks/wo_a_tc_sweep.py --out sweep.json

For G in --groups and M in --ms: the bf16 einsum on the weight, the two prefill forms without it (one
group's bf16 scratch + cuBLAS per group; all groups dequantised in one launch into a scratch freed with
the call + one batched GEMM), the path the dispatcher runs today without the weight, and candidate
``TcConfig`` tilings. Every time is CUDA-graph replay over --sets weight sets (benchmarks/wo_a_bench.py's
method); every candidate is checked against a float64 reference (rel. error <= 1e-2, every output
written) and for bitwise equality between two eager runs and the graph replay. Kernels are compiled in
parallel worker processes first. Needs a CUDA GPU."""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

import wo_a_bench as B  # noqa: E402
from kernels import wo_a_tc as T  # noqa: E402
from kernels import wo_a_w8 as K  # noqa: E402

R, D = B.R, B.D


def _p2(m: int) -> int:
    return 1 << (m - 1).bit_length()


def candidates(m: int, groups: int, sms: int = 132, narrow: bool = False) -> list[T.TcConfig]:
    """Tilings around what should win at M rows: one token tile for M <= 64 (weights read once), 64-256
    token tiles above; weight rows 32..128; split-K sized for about 1 to 3 programs per SM; both kernels
    (one dot per block_k with the tile reshaped to meet its scales, or one dot per 32-wide K block).
    ``narrow``: only the reshaping kernel with 128-wide K tiles and 3 stages (every winner of the wide
    sweep but one), each with the scale multiply in bf16 and in fp32 (e4m3 -> fp32 -> bf16 avoids the
    conversion pipe's e4m3 -> f16 -> bf16: round 4)."""
    if narrow:
        return [replace(c, bf16_scale=b) for c in candidates(m, groups, sms)
                if not c.sub_blocks and c.block_k == 128 and c.num_stages == 3 for b in (True, False)]
    if m <= 64:
        bts = [max(16, _p2(m))]
    elif m <= 192:
        bts = [64, 128]
    else:
        bts = [128, 256]
    out = []
    for sub, bt, w_as_a, br, bk in itertools.product((True, False), bts, (True, False), (32, 64, 128), (128, 256)):
        if w_as_a and br < 64:
            continue  # the weight rows are the MMA's M: 64 per warpgroup
        if not sub and (bk > 128 or br > 64):
            continue  # the first sweep: the reshaping kernel ran out of shared memory or lost there
        if bt * br > 128 * 256 or (m > 192 and br < 64):
            continue
        warps = 4 if bt * br <= 64 * 64 else 8
        tiles = -(-m // bt) * groups * (R // br)
        splits = sorted({s for s in (1, 2, 4, 8, 16) if tiles * s <= 3 * sms and D % (bk * s) == 0}
                        | ({1} if tiles >= sms else set()))
        splits = [s for s in splits if tiles * s >= sms // 2 or s == max(splits)][-2:]
        for split, stages in itertools.product(splits, (2, 3, 4) if sub else (3,)):
            c = T.TcConfig(bt, br, bk, split, warps, stages, w_as_a=w_as_a, sub_blocks=sub)
            if c.fits(R, D):
                out.append(c)
    return out


def tma_candidates(m: int, groups: int, sms: int = 132) -> list[T.TcConfig]:
    """The narrowed tilings with the fp32 scale multiply, each also with its weight and x tiles loaded by
    tensor descriptors (``tma``) at 3 and 4 stages: both forms timed in the same run."""
    base = [c for c in candidates(m, groups, sms, narrow=True) if not c.bf16_scale]
    return base + [replace(c, tma=True, num_stages=st) for c in base for st in (3, 4)]


def big_candidates(m: int, groups: int, sms: int = 132, smem: int = 200 * 1024) -> list[T.TcConfig]:
    """Fourth session (issue 26, roofline-led): one token tile for all M up to 192 rows (each weight tile
    read and decoded once for every token), 64/128 weight rows per program, 128/256-wide K tiles, 3-4
    stages (2-3 for prefill), split-K for 1/2..4 programs per SM, W as the register A operand (no shared-memory round trip
    of the decoded tile) or x as A, with and without descriptors; for prefill 128/256 x 128/256 tiles at
    8 warps. Tilings whose staged tiles exceed ``smem`` or whose fp32 accumulator exceeds 128 registers
    per thread are left out (they spill or do not compile)."""
    out = []
    if m <= 32:
        return out  # the wide ring's rows: the einsum and the dispatcher are timed, no tc tiling
    if m <= 192:
        bts, brs, bks, stages_all = [max(16, _p2(m))], (64, 128), (128, 256), (3, 4)
    else:
        bts, brs, bks, stages_all = [128, 256], (128, 256), (128,), (2, 3)
    for bt, br, bk, w_as_a, tma in itertools.product(bts, brs, bks, (True, False), (False, True)):
        for warps in ((4, 8) if br == 64 else (8,)):
            if bt * br > 4096 * warps:
                continue
            tiles = -(-m // bt) * groups * (R // br)
            splits = [s for s in (1, 2, 4, 8, 16) if D % (bk * s) == 0 and sms // 2 <= tiles * s <= 4 * sms]
            splits = splits or [1]
            for split, stages in itertools.product(splits[:2], stages_all):
                staged = stages * (br * bk + 2 * bt * bk) + (0 if w_as_a else 2 * br * bk)
                if staged > smem:
                    continue
                c = T.TcConfig(bt, br, bk, split, warps, stages, w_as_a=w_as_a, bf16_scale=False, tma=tma)
                if c.fits(R, D):
                    out.append(c)
    return out


def sweep_candidates(m: int, groups: int, sms: int, args) -> list[T.TcConfig]:
    if args.big:
        return big_candidates(m, groups, sms)
    return tma_candidates(m, groups, sms) if args.tma else candidates(m, groups, sms, args.narrow)


def choose_tables(rows: list[dict], mid_max_m: int = K.MID_MAX_M, margin: float = 0.05) -> dict:
    """The dispatcher's ``TC_TABLE`` and ``PREFILL_BATCHED`` from the sweep's rows. Per G and swept M (a
    bucket from the previous swept M + 1 up to this M; the last bucket has no upper end) a challenger
    replaces the baseline only where it is faster by more than the fraction ``margin`` (three repeats
    per candidate cannot separate closer times). Up to ``mid_max_m`` rows the baseline is the path the
    dispatcher ran without the weight (wide or mid) and the challenger the best correct ``tc`` tiling; a
    bucket the dispatcher already ran on tc (no other path timed there) keeps tc with the best tiling.
    Above, the baseline is the per-group prefill and the challengers the batched prefill, then a ``tc``
    tiling. Returns {"tc": {G: [[lo, hi, config]]}, "prefill_batched": {G: [[lo, hi or None]]},
    "buckets": {G: [{M, path, us, baseline, baseline_us, einsum_us}]}}."""
    out: dict = {"tc": {}, "prefill_batched": {}, "buckets": {}}
    for g in sorted({r["G"] for r in rows}):
        ms = sorted({r["M"] for r in rows if r["G"] == g})
        tc, batched, buckets = [], [], []
        for i, m in enumerate(ms):
            lo, hi = (ms[i - 1] + 1 if i else 17), (m if i < len(ms) - 1 else None)
            here = [r for r in rows if r["G"] == g and r["M"] == m and "us" in r]
            ein = next(r for r in here if r["path"] == "einsum_bf16")["us"]
            ok_tc = [r for r in here if r["path"] == "tc" and r.get("ok")]
            best_tc = min(ok_tc, key=lambda r: r["us"], default=None)
            incumbent = None
            if m <= mid_max_m:
                now = next(r for r in here if r["path"] == "dispatcher_no_weight")
                base, base_us = now.get("chosen"), now["us"]
                if base == "tc" and "tc_config" in now:
                    # the installed tiling, timed in this run: a challenger must beat it by the margin
                    incumbent = now["tc_config"]
                elif base == "tc":
                    base_us = float("inf")  # no other path timed here: tc stays (an earlier sweep chose it)
            else:
                per_group = next(r for r in here if r["path"] == "prefill_per_group")
                base, base_us = "prefill", per_group["us"]
            path, us = base, base_us
            fast = [r for r in here if r["path"] == "prefill_batched" and r["rel_err"] <= 1e-2 and r["written"]
                    and r["deterministic"]]
            best_b = min(fast, key=lambda r: r["us"], default=None)
            if best_b is not None and m > mid_max_m and best_b["us"] * (1 + margin) < us:
                path, us = "prefill_batched", best_b["us"]
                batched.append([lo, hi])
            if best_tc is not None and best_tc["us"] * (1 + margin) < us:
                if path == "prefill_batched":
                    batched.pop()
                path, us = "tc", best_tc["us"]
                tc.append([lo, hi, best_tc["config"]])
            elif incumbent is not None:
                tc.append([lo, hi, incumbent])
            buckets.append({"M": m, "path": path, "us": us, "baseline": base,
                            "baseline_us": None if base_us == float("inf") else base_us, "einsum_us": ein})
        for ranges in (tc, batched):  # adjacent buckets with the same choice merge
            merged = []
            for rng in ranges:
                if merged and merged[-1][1] is not None and merged[-1][1] + 1 == rng[0] and merged[-1][2:] == rng[2:]:
                    merged[-1][1] = rng[1]
                else:
                    merged.append(list(rng))
            ranges[:] = merged
        out["tc"][g], out["prefill_batched"][g], out["buckets"][g] = tc, batched, buckets
    return out


def launch_tc(x, twin, y, cfg: dict) -> None:
    """A compile task's launch (wo_a_bench.compile_worker): one tc tiling."""
    T.launch(x, twin.values, twin.exponents, twin.semaphores, y, T.TcConfig(**cfg))


def compile_key(c: T.TcConfig) -> tuple:
    return tuple(sorted(asdict(c).items()))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--ms", type=int, nargs="+", default=[24, 32, 48, 64, 96, 128, 192, 512, 1024])
    ap.add_argument("--sets", type=int, default=8)
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=min(15, os.cpu_count() or 1))
    ap.add_argument("--deadline", type=float, default=420.0)
    ap.add_argument("--narrow", action="store_true", help="the narrowed candidates, bf16 and fp32 scale multiply")
    ap.add_argument("--tma", action="store_true", help="the narrowed fp32-scale candidates with and without descriptors")
    ap.add_argument("--big", action="store_true", help="one token tile up to 192 rows, deep pipelines, prefill tiles")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    t0 = time.time()
    gen = torch.Generator(device="cuda").manual_seed(2026)
    info = B.device_info()
    info.update(sets=args.sets, replays=args.replays, repeats=args.repeats,
                command=" ".join([Path(sys.executable).name] + sys.argv))
    print(json.dumps(info), flush=True)
    sms = info["sms"]
    tasks, seen = [], set()
    for g, m in itertools.product(args.groups, args.ms):
        for c in sweep_candidates(m, g, sms, args):
            if compile_key(c) not in seen:
                seen.add(compile_key(c))
                tasks.append((g, m, asdict(c)))
    tc = time.time()
    failures = B.precompile(tasks, args.workers, launch_tc)
    failed = {compile_key(T.TcConfig(**c)) for _, _, c, _ in failures}
    print(f"compiled {len(tasks)} tilings in {time.time() - tc:.0f}s, {len(failures)} failed", flush=True)
    result = {"info": info, "compile_failures": failures, "rows": []}

    for groups in args.groups:
        twins = [B.random_twin(groups, gen) for _ in range(args.sets)]
        w_bf16 = [K.dequantize(t) for t in twins]
        for m in args.ms:
            xs = [B.random_x(m, groups, gen) for _ in range(args.sets)]
            outs = [torch.empty((m, groups, R), dtype=torch.bfloat16, device="cuda") for _ in range(args.sets)]
            ref = torch.einsum("tgd,grd->tgr", xs[0].double(), w_bf16[0].double())

            def timed(fn_of_i, check=True):
                t = B.graph_time_us([lambda i=i: fn_of_i(i) for i in range(args.sets)], args.replays, args.repeats)
                row = {"us": t}
                if check:
                    outs[0].fill_(float("nan"))
                    y = fn_of_i(0)
                    y = outs[0] if y is None else y
                    first = y.clone()
                    outs[0].fill_(float("nan"))
                    y2 = fn_of_i(0)
                    y2 = outs[0] if y2 is None else y2
                    row["rel_err"] = ((first.double() - ref).norm() / ref.norm()).item()
                    row["written"] = bool(torch.isfinite(first).all())
                    row["deterministic"] = bool(torch.equal(first.view(torch.int16), y2.view(torch.int16)))
                return row

            base = {"G": groups, "M": m}
            ein = timed(lambda i: torch.einsum("tgd,grd->tgr", xs[i], w_bf16[i]))
            result["rows"].append({**base, "path": "einsum_bf16", **ein})
            now = timed(lambda i: K.wo_a(xs[i], twins[i], out=outs[i]))
            chosen = K.select_path(m, groups)
            extra = {"tc_config": asdict(K.tc_config(m, groups, R, D))} if chosen == "tc" else {}
            result["rows"].append({**base, "path": "dispatcher_no_weight", "chosen": chosen, **extra, **now})
            for batched, bk in ((False, 128), (True, 128), (True, 512)):
                r = timed(lambda i, b=batched, bk=bk: K.prefill(xs[i], twins[i], outs[i], batched=b, block_k=bk))
                result["rows"].append({**base, "path": "prefill_batched" if batched else "prefill_per_group",
                                       "dequant_block_k": bk, **r})
            best = None
            for c in sweep_candidates(m, groups, sms, args):
                if time.time() - t0 > args.deadline:
                    result["cut_at_deadline"] = True
                    break
                if compile_key(c) in failed:
                    continue
                try:
                    r = timed(lambda i, c=c: T.launch(xs[i], twins[i].values, twins[i].exponents, twins[i].semaphores,
                                                      outs[i], c))
                except Exception as exc:
                    result["rows"].append({**base, "path": "tc", "config": asdict(c), "error": repr(exc)[:300]})
                    continue
                ok = r["rel_err"] <= 1e-2 and r["written"] and r["deterministic"]
                result["rows"].append({**base, "path": "tc", "config": asdict(c), "ok": ok, **r})
                if ok and (best is None or r["us"] < best[0]):
                    best = (r["us"], c)
            pf = [x for x in result["rows"] if x["G"] == groups and x["M"] == m and x["path"].startswith("prefill")]
            line = (f"G={groups} M={m:4d} einsum {ein['us']:7.2f} | no-weight now {now['us']:7.2f} | prefill "
                    + " / ".join(f"{x['us']:.2f}" for x in pf))
            if best:
                line += f" | tc best {best[0]:7.2f} x{ein['us'] / best[0]:.2f} {asdict(best[1])}"
            print(line, flush=True)
            Path(args.out).write_text(json.dumps(result, separators=(",", ":")))
            del xs, outs
        del twins, w_bf16
        torch.cuda.empty_cache()
    info["wall_s"] = time.time() - t0
    result["tables"] = choose_tables(result["rows"])
    Path(args.out).write_text(json.dumps(result, separators=(",", ":")))
    print(json.dumps(result["tables"]["tc"]), json.dumps(result["tables"]["prefill_batched"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
