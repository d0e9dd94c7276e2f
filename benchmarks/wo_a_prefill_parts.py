#!/usr/bin/env python3
"""The prefill forms without the bf16 weight taken apart (issue 26, fourth session).

    python benchmarks/wo_a_prefill_parts.py --out parts.json

Per G and M: one group's dequantisation alone, one group's GEMM alone (into the strided y[:, g, :]
and into a contiguous [M, R]), the per-group and batched prefill, the whole
dequantisation of all groups, and the bf16 einsum; CUDA-graph replay over --sets weight sets
(benchmarks/wo_a_bench.py's method). Needs a CUDA GPU. The stored run (docs/measurements/wo_a_issue26_prefill_parts.json) also timed the
overlapped prefill of commit 1064c1f (removed again: slower than the batched form at every M)."""
from __future__ import annotations

import argparse
import json
import sys
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
    ap.add_argument("--ms", type=int, nargs="+", default=[64, 128, 192, 512, 1024])
    ap.add_argument("--sets", type=int, default=8)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(7)
    info = B.device_info()
    print(json.dumps(info), flush=True)
    rows = []
    for g in args.groups:
        twins = [B.random_twin(g, gen) for _ in range(args.sets)]
        w = [K.dequantize(t) for t in twins]
        scratch = torch.empty((R, D), dtype=torch.bfloat16, device="cuda")
        full = torch.empty((g, R, D), dtype=torch.bfloat16, device="cuda")
        for m in args.ms:
            xs = [B.random_x(m, g, gen) for _ in range(args.sets)]
            ys = [torch.empty((m, g, R), dtype=torch.bfloat16, device="cuda") for _ in range(args.sets)]
            flat = torch.empty((m, R), dtype=torch.bfloat16, device="cuda")
            forms = {
                "einsum_bf16": lambda i: torch.einsum("tgd,grd->tgr", xs[i], w[i]),
                "dequant_one_group": lambda i: K.dequantize_group(twins[i], 0, scratch),
                "dequant_all_groups": lambda i: K._dequantize_rows(
                    twins[i].values.view(g * R, D), twins[i].exponents.view(-1, D // K.BLOCK), full.view(g * R, D)),
                "mm_one_group_strided": lambda i: torch.mm(xs[i][:, 0, :], w[i][0].t(), out=ys[i][:, 0, :]),
                "mm_one_group_contiguous": lambda i: torch.mm(xs[i][:, 0, :], w[i][0].t(), out=flat),
                "prefill_per_group": lambda i: K.prefill(xs[i], twins[i], ys[i]),
                "prefill_batched": lambda i: K.prefill(xs[i], twins[i], ys[i], batched=True),
            }
            line = {"G": g, "M": m}
            for name, fn in forms.items():
                line[name] = B.graph_time_us([lambda i=i, fn=fn: fn(i) for i in range(args.sets)], 30, 5)
            rows.append(line)
            print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in line.items()}), flush=True)
        del twins, w, full
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps({"info": info, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
