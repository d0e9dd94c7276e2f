#!/usr/bin/env python3
"""Programmatic dependent launch (PDL) for the ring kernel, same process, on a CUDA GPU of compute
capability 9.0+ (rounds 7 and 8, docs/kernels.md).

    python benchmarks/wo_a_pdl_compare.py --out pdl.json

A decode step runs the layers' kernels back to back in one CUDA graph. With PDL (the launch attribute
``programmaticStreamSerialization``, Triton's ``launch_pdl``) a kernel's programs may start while the
previous kernel still runs: the ring kernel lets the next kernel launch at once
(``griddepcontrol.launch_dependents``), requests its first S - 1 stages of weights (constants), and only
then waits for the previous kernel's writes (``griddepcontrol.wait``) before it copies x.

Every tiling of TILINGS is timed with a plain launch and with PDL, as in benchmarks/wo_a_bench.py
(CUDA-graph replay over 16 rotated weight sets, medians), next to the pure read of the same bytes
(plain and PDL) and the bf16 einsum. Each run is checked against float64 (NaN-poisoned output), and a
PDL launch must give its tiling's plain launch bit for bit, eager and replayed (a chain where each
layer reads the previous kernel's output is tests/kernels/test_wo_a_gluon.py's).
``--tilings R,NW,SB,S,RH ...`` times those tilings instead of TILINGS; ``--modes pdl`` only PDL launches.
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
from wo_a_bench import D, R, copy_bandwidth, graph_time_us, random_twin, random_x, read_ceiling  # noqa: E402

# (block_r, warps along K, sb, stages, warps along rows) per token tile: round 7's 16-row programs (at
# most two per H200 SM) and one 32-row program per SM for 9..16 rows; round 8's: 32-row programs whose two
# row halves share one copy of x (row_warps=2, PDL_WIDE), 4 K blocks per stage, 8 warps along K
TILINGS = {8: ((16, 4, 2, 10, 1), (16, 4, 4, 5, 1), (16, 8, 2, 5, 1), (32, 4, 2, 8, 2), (32, 4, 2, 10, 2),
               (32, 4, 2, 12, 2), (32, 4, 2, 14, 2), (32, 4, 4, 5, 2)),
           16: ((16, 4, 2, 8, 1), (16, 4, 4, 4, 1), (32, 4, 2, 10, 1), (32, 4, 2, 8, 2), (32, 4, 2, 10, 2),
                (32, 4, 2, 12, 2), (32, 4, 4, 5, 2))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ms", type=int, nargs="+", default=[1, 2, 4, 6, 8, 12, 16])
    ap.add_argument("--groups", type=int, nargs="+", default=[4, 2])
    ap.add_argument("--tilings", nargs="+", metavar="R,NW,SB,S,RH",
                    help="instead of TILINGS: these (block_r, warps along K, sb, stages, row_warps), both token tiles")
    ap.add_argument("--modes", default="plain,pdl", type=lambda v: v.split(","),
                    help="launch kinds to time, comma-separated: plain, pdl or both")
    args = ap.parse_args()
    tilings = TILINGS
    if args.tilings:
        mine = tuple(tuple(int(v) for v in t.split(",")) for t in args.tilings)
        tilings = {8: mine, 16: mine}
    if not args.modes or set(args.modes) - {"plain", "pdl"}:
        ap.error(f"--modes takes plain, pdl or both, got {','.join(args.modes)}")
    modes = tuple(m == "pdl" for m in args.modes)
    t0 = time.time()
    gen = torch.Generator(device="cuda").manual_seed(7)
    res = {"device": torch.cuda.get_device_name(), "copy_GBps": copy_bandwidth() / 1e9, "read": {}, "rows": []}
    print(f"copy bandwidth {res['copy_GBps']:.0f} GB/s", flush=True)
    for g in args.groups:
        res["read"][g] = {"plain": read_ceiling(g * R * D, 16, 50, 7),
                          "pdl": read_ceiling(g * R * D, 16, 50, 7, pdl=True)}
        print(f"G={g} pure read: " + ", ".join(f"{k} {v['us']:.2f} us" for k, v in res["read"][g].items()),
              flush=True)
        twins = [random_twin(g, gen) for _ in range(16)]
        wbf = [K.dequantize(t) for t in twins]
        for m in args.ms:
            bm = 8 if m <= 8 else 16
            xs = [random_x(m, g, gen) for _ in twins]
            ys = [torch.empty((m, g, R), dtype=torch.bfloat16, device="cuda") for _ in twins]
            ref = torch.einsum("tgd,grd->tgr", xs[0].double(), wbf[0].double())
            row = {"G": g, "M": m, "default": str(GL.ring_config_for(m, g, R, D, "cuda")), "runs": []}
            row["einsum_us"] = graph_time_us([lambda x=x, w=w: torch.einsum("tgd,grd->tgr", x, w)
                                              for x, w in zip(xs, wbf)], 50, 7)
            for tiling, pdl in itertools.product(tilings[bm], modes):
                br, nw, sb, st, rh = tiling
                c = GL.RingConfig(br, bm, nw, sb, st, pdl, rh)
                if not c.fits(m, R, D):
                    continue
                run = {"cfg": [br, bm, nw, sb, st, rh], "smem": c.smem_bytes(), "pdl": pdl}
                y = torch.full((m, g, R), float("nan"), dtype=torch.bfloat16, device="cuda")
                GL.launch(xs[0], twins[0], y, c)
                torch.cuda.synchronize()
                run["rel_err"] = ((y.double() - ref).norm() / ref.norm()).item()
                if pdl == modes[0]:
                    first = y.clone()  # a tiling's PDL launch must give its plain launch's bits
                same = bool(torch.equal(y.view(torch.int16), first.view(torch.int16)))
                fns = [lambda x=x, t=t, y=y, c=c: GL.launch(x, t, y, c) for x, t, y in zip(xs, twins, ys)]
                try:
                    run["us"] = graph_time_us(fns, 50, 7)
                    same &= bool(torch.equal(ys[0].view(torch.int16), first.view(torch.int16)))
                except Exception as exc:  # a variant that fails to capture is recorded, not fatal
                    run["error"] = repr(exc)[:300]
                run["ok"] = same and run["rel_err"] < 1e-2
                row["runs"].append(run)
            print(f"G={g} M={m}: einsum {row['einsum_us']:.2f} | " + " | ".join(
                f"{r['cfg'][0]}/{r['cfg'][2]}x{r['cfg'][5]}w/{r['cfg'][3]}x{r['cfg'][4]}{' pdl' if r['pdl'] else ''} "
                f"{r.get('us', float('nan')):.2f}{'' if r['ok'] else ' WRONG'}" for r in row["runs"]), flush=True)
            res["rows"].append(row)
            Path(args.out).write_text(json.dumps(res, indent=1))
        del twins, wbf
        torch.cuda.empty_cache()
    print(f"elapsed {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
