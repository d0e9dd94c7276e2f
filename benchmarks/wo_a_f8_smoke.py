#!/usr/bin/env python3
"""Quick GPU check of the fp8 x fp8 tc kernel (issue 26): a few tilings at full shape against float64
(relative error, every output written, two runs equal). Needs a CUDA GPU."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import wo_a_bench as B  # noqa: E402
from kernels import wo_a_tc as T  # noqa: E402
from kernels import wo_a_w8 as K  # noqa: E402

gen = torch.Generator(device="cuda").manual_seed(7)
for groups, m, cfg in [(4, 48, T.TcConfig(64, 64, 128, 4, 4, 3, w_as_a=False, fp8_x=True)),
                       (4, 48, T.TcConfig(64, 64, 128, 4, 4, 3, w_as_a=True, fp8_x=True)),
                       (2, 192, T.TcConfig(64, 128, 128, 2, 8, 3, w_as_a=True, fp8_x=True)),
                       (4, 1024, T.TcConfig(128, 128, 128, 1, 8, 3, w_as_a=False, fp8_x=True))]:
    twin = B.random_twin(groups, gen)
    for odd in (False, True):
        x = B.random_x(m, groups, gen, odd=odd)
        ref = torch.einsum("tgd,grd->tgr", x.double(), K.dequantize(twin).double())
        try:
            y = torch.full((m, groups, B.R), float("nan"), dtype=torch.bfloat16, device="cuda")
            K.wo_a(x, twin, out=y, config=cfg)
            y2 = torch.full_like(y, float("nan"))
            K.wo_a(x, twin, out=y2, config=cfg)
            torch.cuda.synchronize()
            print(groups, m, odd, cfg, "rel", ((y.double() - ref).norm() / ref.norm()).item(),
                  "written", bool(torch.isfinite(y).all()), "same", torch.equal(y.view(torch.int16), y2.view(torch.int16)),
                  flush=True)
        except Exception as exc:
            print(groups, m, odd, cfg, "FAILED", repr(exc)[:2000], flush=True)
