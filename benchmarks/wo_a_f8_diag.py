#!/usr/bin/env python3
"""Localises a wrong result of the fp8 x fp8 tc kernel (issue 26) on a GPU: the x quantisation kernel
against torch's e4m3 conversion, and the main kernel on torch-made terms with fp8 dots and with the
interpreter's fp32 upcast dots. Needs a CUDA GPU."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import triton  # noqa: E402

import wo_a_bench as B  # noqa: E402
from kernels import wo_a_tc as T  # noqa: E402
from kernels import wo_a_w8 as K  # noqa: E402

gen = torch.Generator(device="cuda").manual_seed(7)
m, groups, d, r = 48, 4, B.D, B.R
twin = B.random_twin(groups, gen)
w = K.dequantize(twin).double()
for odd in (False, True):
    x = B.random_x(m, groups, gen, odd=odd)
    q = torch.full((2, m, groups, d), float("nan"), dtype=torch.float32, device="cuda").to(torch.float8_e4m3fn)
    sx = torch.full((m, groups), float("nan"), dtype=torch.float32, device="cuda")
    lo_off = m * groups * d
    T._quant_x_kernel[(m * groups,)](x, q, sx, groups, d, lo_off, x.stride(0), x.stride(1),
                                     BLOCK_D=triton.next_power_of_2(d), num_warps=4)
    torch.cuda.synchronize()
    xf = x.float()
    s_ref = xf.abs().amax(-1) / 448
    xs = xf / s_ref[..., None]
    hi_ref = xs.to(torch.float8_e4m3fn)
    lo_ref = (xs - hi_ref.float()).to(torch.float8_e4m3fn)
    rec = sx[..., None] * (q[0].float() + q[1].float())
    print(f"odd={odd} quant: s finite {bool(torch.isfinite(sx).all())} s==ref {torch.allclose(sx, s_ref)} "
          f"hi==ref {(q[0].view(torch.uint8) == hi_ref.view(torch.uint8)).float().mean().item():.4f} "
          f"lo==ref {(q[1].view(torch.uint8) == lo_ref.view(torch.uint8)).float().mean().item():.4f} "
          f"rec rel {((rec - xf).norm() / xf.norm()).item():.3g}", flush=True)
    qt = torch.stack([hi_ref, lo_ref]).contiguous()
    st = s_ref.contiguous()
    xr = (st[..., None] * (hi_ref.double() + lo_ref.double()))
    ref = torch.einsum("tgd,grd->tgr", xr, w)
    for cfg in (T.TcConfig(64, 64, 128, 4, 4, 3, w_as_a=False, fp8_x=True),
                T.TcConfig(64, 64, 128, 4, 4, 3, w_as_a=True, fp8_x=True),
                T.TcConfig(64, 64, 128, 1, 4, 1, w_as_a=True, fp8_x=True)):
        for upcast in (False, True):
            y = torch.full((m, groups, r), float("nan"), dtype=torch.bfloat16, device="cuda")
            grid = cfg.grid(m, groups, r)
            ws = torch.empty(grid[0] * grid[1] * cfg.split_k * cfg.block_r * cfg.block_t, dtype=torch.float32,
                             device="cuda")
            T._f8_kernel[grid](qt, st, twin.values, twin.exponents, y, ws, twin.semaphores,
                               m, groups, r, d, lo_off, d // cfg.split_k, cfg.split_k, y.stride(0), y.stride(1),
                               BLOCK_T=cfg.block_t, BLOCK_R=cfg.block_r, BLOCK_K=cfg.block_k, W_AS_A=cfg.w_as_a,
                               USE_SPLIT=cfg.split_k > 1, SPLIT=cfg.split_k, INTERPRET=upcast,
                               num_warps=cfg.num_warps, num_stages=cfg.num_stages)
            torch.cuda.synchronize()
            print(f"  f8 {cfg.w_as_a=} {cfg.split_k=} {cfg.num_stages=} {upcast=}: rel "
                  f"{((y.double() - ref).norm() / ref.norm()).item():.3g} written {bool(torch.isfinite(y).all())}",
                  flush=True)
