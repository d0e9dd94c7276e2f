#!/usr/bin/env python3
"""Sweep of the prefill path's dequantise kernel (issue 26, item 2: prefill without the bf16 weight).

    python benchmarks/wo_a_dequant_sweep.py --out dequant.json

Per G: the twin -> bf16 [G*R, D] dequantisation alone (CUDA-graph replay over --sets weight sets; bytes
= fp8 values + exponents read, bf16 written, against the copy bandwidth measured in the same run), for
the current kernel (_dequant_kernel, block_k 128/512) and _dequant_rows_kernel tilings; every output
compared bit for bit with K.dequantize. Then the batched prefill (dequantise + einsum) with the best
tiling at --ms rows against the bf16 einsum. Needs a CUDA GPU."""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

import wo_a_bench as B  # noqa: E402
from kernels import wo_a_w8 as K  # noqa: E402

R, D = B.R, B.D


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--ms", type=int, nargs="+", default=[256, 512, 1024])
    ap.add_argument("--sets", type=int, default=8)
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    t0 = time.time()
    info = B.device_info()
    info["copy_bandwidth_GBps"] = B.copy_bandwidth() / 1e9
    print(json.dumps(info), flush=True)
    gen = torch.Generator(device="cuda").manual_seed(26)
    result = {"info": info, "rows": []}
    variants = [("old", dict(block_k=bk), w) for bk in (128, 512) for w in (4,)]
    variants += [("rows", dict(ROWS=rows, BLOCK_K=bk, FLAT=False), w)
                 for rows, bk, w in itertools.product((32, 64, 128), (128, 256, 512, 1024), (4, 8))
                 if rows * bk <= 64 * 1024]
    variants += [("flat", dict(ROWS=32, BLOCK_K=bk, FLAT=True), w) for bk, w in itertools.product((256, 512, 1024, 2048), (4, 8))]
    for groups in args.groups:
        twins = [B.random_twin(groups, gen) for _ in range(args.sets)]
        refs = [K.dequantize(t) for t in twins]
        outs = [torch.empty((groups * R, D), dtype=torch.bfloat16, device="cuda") for _ in range(args.sets)]
        nbytes = groups * R * D * 3 + twins[0].exponents.numel()
        best = None
        for kind, kw, warps in variants:
            def fn(i, kind=kind, kw=kw, warps=warps):
                v = twins[i].values.view(groups * R, D)
                e = twins[i].exponents.view(groups * R // 32, D // 32)
                if kind == "old":
                    K._dequantize_rows(v, e, outs[i], kw["block_k"])
                else:
                    grid = (groups * R // kw["ROWS"], D // kw["BLOCK_K"])
                    K._dequant_rows_kernel[grid](v, e, outs[i], D, **kw, num_warps=warps)
            try:
                outs[0].fill_(float("nan"))
                fn(0)
                exact = torch.equal(outs[0].view(torch.int16), refs[0].view(groups * R, D).view(torch.int16))
                us = B.graph_time_us([lambda i=i: fn(i) for i in range(args.sets)], args.replays, args.repeats)
            except Exception as exc:
                result["rows"].append({"G": groups, "kind": kind, "kw": kw, "warps": warps, "error": repr(exc)[:300]})
                print(groups, kind, kw, warps, "FAILED", repr(exc)[:200], flush=True)
                continue
            gbps = nbytes / (us * 1e-6) / 1e9
            row = {"G": groups, "kind": kind, "kw": kw, "warps": warps, "us": us, "GBps": gbps, "exact": exact,
                   "copy_fraction": gbps / info["copy_bandwidth_GBps"]}
            result["rows"].append(row)
            print(f"G={groups} {kind:4s} {kw} warps {warps}: {us:7.2f} us {gbps:6.0f} GB/s exact {exact}", flush=True)
            if exact and (best is None or us < best["us"]):
                best = row
        result.setdefault("best", {})[groups] = best
        print("best", best, flush=True)
        for m in args.ms:
            xs = [B.random_x(m, groups, gen) for _ in range(args.sets)]
            scratch = torch.empty((groups, R, D), dtype=torch.bfloat16, device="cuda")
            ein = B.graph_time_us([lambda i=i: torch.einsum("tgd,grd->tgr", xs[i], refs[i]) for i in range(args.sets)],
                                  args.replays, args.repeats)
            now = B.graph_time_us([lambda i=i: K.prefill(xs[i], twins[i], batched=True) for i in range(args.sets)],
                                  args.replays, args.repeats)
            kw, warps = best["kw"], best["warps"]

            def new(i):
                v = twins[i].values.view(groups * R, D)
                e = twins[i].exponents.view(groups * R // 32, D // 32)
                if best["kind"] == "old":
                    K._dequantize_rows(v, e, scratch.view(groups * R, D), kw["block_k"])
                else:
                    K._dequant_rows_kernel[(groups * R // kw["ROWS"], D // kw["BLOCK_K"])](
                        v, e, scratch.view(groups * R, D), D, **kw, num_warps=warps)
                return torch.einsum("tgd,grd->tgr", xs[i], scratch)
            nw = B.graph_time_us([lambda i=i: new(i) for i in range(args.sets)], args.replays, args.repeats)
            row = {"G": groups, "M": m, "einsum_us": ein, "prefill_batched_now_us": now, "prefill_best_dequant_us": nw}
            result["rows"].append(row)
            print(f"G={groups} M={m}: einsum {ein:.2f} prefill now {now:.2f} with best dequant {nw:.2f} "
                  f"(x{ein / nw:.2f})", flush=True)
            del xs
        del twins, refs, outs
        torch.cuda.empty_cache()
    info["wall_s"] = time.time() - t0
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
