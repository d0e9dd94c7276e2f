#!/usr/bin/env python3
"""Sweep of the Gluon wo_a kernels (kernels/wo_a_gluon.py) on a CUDA GPU (sm_89+).

    python benchmarks/wo_a_gluon_sweep.py --out gluon.json                    # register kernel (round 4)
    python benchmarks/wo_a_gluon_sweep.py --ring --out ring.json             # cp.async ring (rounds 5-6)

Same method as benchmarks/wo_a_bench.py: CUDA-graph replay over 16 rotated weight sets, einsum and
what the dispatcher runs now (``K.wo_a``; JSON field ``round2_us``, named when that was round 2's
kernel) timed in the same process; each configuration is first checked
against float64 at full shape (NaN-poisoned output, two runs bitwise equal, odd x strides).
"""
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

from kernels import wo_a_gluon as GL  # noqa: E402
from kernels import wo_a_w8 as K  # noqa: E402
from wo_a_bench import R, copy_bandwidth, graph_time_us, random_twin, random_x  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ms", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--groups", type=int, nargs="+", default=[4, 2])
    ap.add_argument("--warps", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--kw", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--blocks", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--block-r", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--ring", action="store_true", help="sweep RingConfig: --warps, --block-r, --sb, --stages")
    ap.add_argument("--sb", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 3, 4, 6, 8])
    ap.add_argument("--sets", type=int, default=16)
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    t0 = time.time()
    gen = torch.Generator(device="cuda").manual_seed(4)
    res = {"device": torch.cuda.get_device_name(), "copy_GBps": copy_bandwidth() / 1e9, "rows": []}
    print(f"copy bandwidth {res['copy_GBps']:.0f} GB/s", flush=True)
    best = {}
    for g in args.groups:
        twins = [random_twin(g, gen) for _ in range(args.sets)]
        w64 = K.dequantize(twins[0]).double()
        wbf = [K.dequantize(t) for t in twins]
        for m in args.ms:
            xs = [random_x(m, g, gen) for _ in twins]
            ys = [torch.empty((m, g, R), dtype=torch.bfloat16, device="cuda") for _ in twins]
            ein = graph_time_us([lambda x=x, w=w: torch.einsum("tgd,grd->tgr", x, w) for x, w in zip(xs, wbf)],
                                args.replays, args.repeats)
            r2 = graph_time_us([lambda x=x, t=t, y=y: K.wo_a(x, t, out=y) for x, t, y in zip(xs, twins, ys)],
                               args.replays, args.repeats)
            print(f"G={g} M={m}: einsum {ein:.2f} us, dispatcher {r2:.2f} us", flush=True)
            grid = itertools.product(args.warps, args.sb, args.stages, args.block_r) if args.ring else \
                itertools.product(args.warps, args.kw, args.blocks, args.block_r)
            for nw, kw, pf, br in grid:
                bm = 8 if m <= 8 else 16
                if args.ring:  # (kw, pf) = (K blocks per stage, stages)
                    cfg = GL.RingConfig(block_r=br, block_m=bm, num_warps=nw, sb=kw, stages=pf)
                    if not cfg.fits(m, R, 4096) or cfg.smem_footprint() > GL._smem_per_block(torch.device("cuda")):
                        continue
                else:
                    cfg = GL.GluonConfig(block_r=br, block_m=bm, num_warps=nw, blocks=pf, k_width=kw)
                row = {"G": g, "M": m, "warps": nw, "k_width": kw, "blocks": pf, "block_r": br, "ring": args.ring,
                       "einsum_us": ein, "round2_us": r2}
                try:
                    x = random_x(m, g, gen, odd=not args.ring)  # the ring needs aligned x
                    ref = torch.einsum("tgd,grd->tgr", x.double(), w64)
                    outs = []
                    for _ in range(2):
                        y = torch.full((m, g, R), float("nan"), dtype=torch.bfloat16, device="cuda")
                        GL.launch(x, twins[0], y, cfg)
                        outs.append(y)
                    torch.cuda.synchronize()
                    err = ((outs[0].double() - ref).norm() / ref.norm()).item()
                    ok = err < 1e-2 and not torch.isnan(outs[0]).any().item() and torch.equal(outs[0], outs[1])
                    row.update(rel_err=err, ok=bool(ok))
                    if ok:
                        fns = [lambda x=x, t=t, y=y, c=cfg: GL.launch(x, t, y, c)
                               for x, t, y in zip(xs, twins, ys)]
                        row["us"] = graph_time_us(fns, args.replays, args.repeats)
                except Exception as exc:
                    row.update(ok=False, error=repr(exc)[:400])
                res["rows"].append(row)
                print(f"  warps={nw} kw={kw} blocks={pf} block_r={br}: {row.get('us', 'n/a')} us err={row.get('rel_err', 'n/a')} "
                      f"{row.get('error', '')[:200]}", flush=True)
                if row.get("us") and (f"{g}/{m}" not in best or row["us"] < best[f"{g}/{m}"]["us"]):
                    best[f"{g}/{m}"] = row
            Path(args.out).write_text(json.dumps(res, indent=1))
        del twins, wbf
        torch.cuda.empty_cache()
    nbytes = lambda g: g * R * 4096 * (1 + 1 / 1024)  # noqa: E731
    print("\n| G | M | gluon (us) | einsum (us) | dispatcher (us) | vs einsum | % copy BW | warps,k_width,blocks,block_r |")
    for key, row in best.items():
        g = row["G"]
        pct = nbytes(g) / (row["us"] * 1e-6) / (res["copy_GBps"] * 1e9) * 100
        print(f"| {g} | {row['M']} | {row['us']:.2f} | {row['einsum_us']:.2f} | {row['round2_us']:.2f} | "
              f"{row['einsum_us'] / row['us']:.2f}x | {pct:.0f}% | {row['warps']},{row['k_width']},{row['blocks']},{row['block_r']} |")
    print(f"elapsed {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
