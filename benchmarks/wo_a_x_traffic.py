#!/usr/bin/env python3
"""What x's traffic costs the ring kernel (round 9, docs/kernels.md), on a CUDA GPU of compute capability 9.0+.

    python benchmarks/wo_a_x_traffic.py --out xt.json

The ring kernel copies a full token tile of x (8 or 16 tokens) for every K block, zero-filling the
tokens past M without reading them. Launching the same tiling with the same tile but a smaller M
therefore runs the same instructions and changes only how many bytes of x come from L2: the
difference between M = 0 and M = the tile is the cost of x's traffic. Timed as in
benchmarks/wo_a_bench.py (CUDA-graph replay over 16 weight sets, PDL launches, medians).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

from kernels import wo_a_gluon as GL  # noqa: E402
from wo_a_bench import D, R, graph_time_us, random_twin, random_x  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--groups", type=int, default=4)
    args = ap.parse_args()
    g = args.groups
    gen = torch.Generator(device="cuda").manual_seed(11)
    twins = [random_twin(g, gen) for _ in range(16)]
    tilings = {8: (GL.RingConfig(16, 8, 4, 2, 10, pdl=True), GL.PDL_WIDE[8]),
               16: (GL.RingConfig(16, 16, 4, 2, 8, pdl=True), GL.PDL_WIDE[16])}
    res = {"device": torch.cuda.get_device_name(), "G": g, "rows": []}
    for bm, cfgs in tilings.items():
        xs = [random_x(bm, g, gen) for _ in twins]
        ys = [torch.empty((bm, g, R), dtype=torch.bfloat16, device="cuda") for _ in twins]
        for cfg in cfgs:
            for m_eff in sorted({0, 1, bm // 2, bm}):
                fns = [lambda x=x, t=t, y=y, c=cfg, m=m_eff: GL._launch_ring(x, t, y, c, m)
                       for x, t, y in zip(xs, twins, ys)]
                us = graph_time_us(fns, 50, 7)
                x_mb = g * (R // cfg.block_r) * m_eff * D * 2 / 1e6  # x bytes read from L2 per call
                res["rows"].append({"cfg": str(cfg), "tile": bm, "m_eff": m_eff, "us": us, "x_MB": x_mb})
                print(f"{cfg.block_r} rows x{cfg.row_warps} tile {bm} M={m_eff}: {us:.2f} us, x {x_mb:.1f} MB from L2",
                      flush=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
