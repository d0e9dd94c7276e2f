#!/usr/bin/env python3
"""Same-process comparison of an earlier ring kernel with the current one, on a CUDA GPU (round 6).

    git show 0dc0c40:kernels/wo_a_gluon.py > /tmp/round5_gluon.py      # the round-5 ring (cvt decode)
    python benchmarks/wo_a_ring_compare.py --baseline /tmp/round5_gluon.py --out compare.json

The baseline module must define ``_wo_a_ring_kernel``, ``pack_tiles`` and ``default_ring_config(m,
rows, cols, smem)`` as round 5 did. Same method as benchmarks/wo_a_bench.py (CUDA-graph replay over 16
rotated weight sets, medians); every configuration is first checked against float64 (NaN-poisoned
output, two runs bitwise equal). The current kernel is timed over a grid of ring tilings.
"""
from __future__ import annotations

import argparse
import importlib.util
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


def load_baseline(path: str):
    spec = importlib.util.spec_from_file_location("baseline_gluon", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="the earlier kernels/wo_a_gluon.py")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ms", type=int, nargs="+", default=[1, 2, 4, 8, 12, 16])
    ap.add_argument("--groups", type=int, nargs="+", default=[4, 2])
    args = ap.parse_args()
    old = load_baseline(args.baseline)
    t0 = time.time()
    gen = torch.Generator(device="cuda").manual_seed(6)
    smem = GL._smem_per_block(torch.device("cuda"))
    res = {"device": torch.cuda.get_device_name(), "copy_GBps": copy_bandwidth() / 1e9, "rows": [], "read": {}}
    print(f"copy bandwidth {res['copy_GBps']:.0f} GB/s", flush=True)

    def old_launch(x, tiles, twin, y, c):
        m, g, d = x.shape
        old._wo_a_ring_kernel[(g * (R // c.block_r),)](
            x, tiles, twin.exponents.view(torch.int32), y, m, R, x.stride(0), x.stride(1), y.stride(0), y.stride(1),
            D=d, NW=c.num_warps, BLOCK_M=c.block_m, BLOCK_R=c.block_r, S=c.stages, SB=c.sb, num_warps=c.num_warps)

    for g in args.groups:
        res["read"][g] = read_ceiling(g * R * D, 16, 50, 7)
        twins = [random_twin(g, gen) for _ in range(16)]
        old_tiles = [old.pack_tiles(t.values) for t in twins]
        wbf = [K.dequantize(t) for t in twins]
        for m in args.ms:
            xs = [random_x(m, g, gen) for _ in twins]
            ys = [torch.empty((m, g, R), dtype=torch.bfloat16, device="cuda") for _ in twins]
            ref = torch.einsum("tgd,grd->tgr", xs[0].double(), wbf[0].double())

            def check(fn):
                outs = []
                for _ in range(2):
                    y = torch.full((m, g, R), float("nan"), dtype=torch.bfloat16, device="cuda")
                    fn(y)
                    outs.append(y)
                err = ((outs[0].double() - ref).norm() / ref.norm()).item()
                return err, bool(err < 1e-2 and not torch.isnan(outs[0]).any() and torch.equal(outs[0], outs[1]))

            oc = old.default_ring_config(m, R, D, smem)
            row = {"G": g, "M": m, "old_cfg": str(oc), "new": []}
            row["einsum_us"] = graph_time_us([lambda x=x, w=w: torch.einsum("tgd,grd->tgr", x, w)
                                              for x, w in zip(xs, wbf)], 50, 7)
            row["old_err"], row["old_ok"] = check(lambda y: old_launch(xs[0], old_tiles[0], twins[0], y, oc))
            row["old_us"] = graph_time_us([lambda x=x, t=t, tl=tl, y=y: old_launch(x, tl, t, y, oc)
                                           for x, t, tl, y in zip(xs, twins, old_tiles, ys)], 50, 7)
            block_m = 8 if m <= 8 else 16
            for nw, br, sb, st in itertools.product((4, 8), (16, 32), (2, 4), (2, 3, 4, 6, 8)):
                c = GL.RingConfig(br, block_m, nw, sb, st)
                if not c.fits(m, R, D) or c.smem_footprint() > smem:
                    continue
                entry = {"cfg": [br, block_m, nw, sb, st]}
                try:
                    entry["err"], entry["ok"] = check(lambda y, c=c: GL.launch(xs[0], twins[0], y, c))
                    if entry["ok"]:
                        entry["us"] = graph_time_us([lambda x=x, t=t, y=y, c=c: GL.launch(x, t, y, c)
                                                     for x, t, y in zip(xs, twins, ys)], 50, 7)
                except Exception as exc:  # a tiling that does not compile is recorded, not fatal
                    entry["error"] = repr(exc)[:300]
                row["new"].append(entry)
            best = sorted((e for e in row["new"] if e.get("us")), key=lambda e: e["us"])
            print(f"G={g} M={m}: einsum {row['einsum_us']:.2f} us, baseline {row['old_us']:.2f} us "
                  f"(ok {row['old_ok']}), best: " + ", ".join(f"{e['cfg']} {e['us']:.2f}" for e in best[:4]), flush=True)
            res["rows"].append(row)
            Path(args.out).write_text(json.dumps(res, indent=1))
        del twins, wbf, old_tiles
        torch.cuda.empty_cache()
    print(f"elapsed {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
