"""Gluon (explicit-layout Triton) ``wo_a`` kernel for 1..8 rows on sm_89+ GPUs (the ``gluon`` path).

Round 4 of issue 9 (docs/kernels.md). Plain Triton stages the fp8 weight tile through shared memory
and reads it back two bytes at a time in the dot-operand layout. Here the weight goes from global
memory straight into the mma.sync operand layout (``k_width`` = 8 consecutive K values per thread:
one 8-byte load), is converted to bf16 in registers and never touches shared memory.

A program owns BLOCK_R output rows (16 or 32, inside one 32-row scale block) of one group over all
of K; its NW warps split K (warp w takes columns [w*D/NW, (w+1)*D/NW)). Per 32-wide K block each warp
computes the block product with mma.sync (raw e4m3 values, exact in bf16, times bf16 x, fp32 sums),
multiplies it by the block's power of two (exact) and adds it to its accumulator; the NW accumulators
are summed once at the end, in a fixed order: results are bitwise reproducible. Every load of an
iteration (eight K blocks: weights, x, exponents) is issued before any of them is used.

The fp8 -> bf16 conversion goes through fp32: the direct fp16 -> bf16 conversion compiles to one
F2F.BF16.F16 per weight on the conversion pipe (16 per clock per SM), which alone cost ~4 us per
call at G=4 on the H200; fp16 -> fp32 is a full-rate HADD2.F32 and fp32 -> bf16 packs two per F2FP.

Gluon has no CPU interpreter: under TRITON_INTERPRET or without a capable GPU :func:`available` is
false and kernels.wo_a_w8 uses its Triton paths. CI compiles this kernel for sm_90 on the CPU and
checks the machine code (tests/kernels/test_wo_a_gluon.py); the GPU tests run it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

import torch

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2
except ImportError:  # pragma: no cover - Triton without Gluon (< 3.5): the Triton paths serve
    gluon = None

MAX_M = 8  # the dispatcher's range; an explicit GluonConfig(block_m=16) takes up to 16 rows (slower
#            than the mid path there on the H200: docs/kernels.md)
MIN_CAPABILITY = (8, 9)  # cvt e4m3x2 -> f16x2 (sm_89+); mma.sync bf16 (sm_80+)


@dataclass(frozen=True)
class GluonConfig:
    """Tiles of one launch: rows per program, token tile, warps (K split), K blocks per iteration."""

    block_r: int = 32
    block_m: int = 8
    num_warps: int = 8
    blocks: int = 8
    k_width: int = 8

    def fits(self, m: int, rows: int, cols: int) -> bool:
        return (1 <= m <= self.block_m and self.block_m in (8, 16) and self.block_r in (16, 32)
                and self.blocks in (4, 8) and self.num_warps in (1, 2, 4, 8, 16) and self.k_width in (4, 8)
                and rows % self.block_r == 0 and cols % (self.num_warps * 32 * self.blocks) == 0)


@lru_cache(maxsize=None)
def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


@lru_cache(maxsize=None)
def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def available(device: torch.device | str) -> bool:
    """Whether the gluon path can run on this device (CUDA sm_89+, Gluon present, not interpreting)."""
    device = torch.device(device)
    if gluon is None or device.type != "cuda" or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False
    if not torch.cuda.is_available():
        return False
    return _capability(device) >= MIN_CAPABILITY


def default_config(m: int, groups: int, rows: int, cols: int, sms: int) -> GluonConfig:
    """Measured on the H200 (docs/kernels.md, round 4): 8 warps, 8 K blocks per iteration, an 8-token
    tile for up to 8 rows; 32-row programs while they keep at least 7/8 of the SMs busy (G=4: 128
    programs on 132 SMs beat 256 16-row ones), else 16-row ones (G=2)."""
    block_r = 32 if 8 * (groups * rows // 32) >= 7 * sms and rows % 32 == 0 else 16
    cfg = GluonConfig(block_r=block_r, block_m=8 if m <= 8 else 16)
    for warps, blocks in ((8, 8), (8, 4), (4, 8), (4, 4), (2, 4), (1, 4)):
        cand = GluonConfig(block_r=cfg.block_r, block_m=cfg.block_m, num_warps=warps, blocks=blocks)
        if cand.fits(m, rows, cols):
            return cand
    raise ValueError(f"no gluon tiling for M={m}, R={rows}, D={cols}")


def config_for(m: int, groups: int, rows: int, cols: int, device: torch.device | str) -> GluonConfig:
    return default_config(m, groups, rows, cols, _sms(torch.device(device)))


if gluon is not None:

    @gluon.jit
    def _pow2(e):
        return (e.to(gl.int32) << 23).to(gl.float32, bitcast=True)

    @gluon.jit
    def _block(acc, w8, xt, e, zero):
        wb = w8.to(gl.float16).to(gl.float32).to(gl.bfloat16)  # see the module docstring
        return acc + mma_v2(wb, xt, zero) * _pow2(e)

    @gluon.jit
    def _load4(w_ptrs, x_ptrs, x_mask, e_ptrs, k0):
        """Weights, x and exponents of the four K blocks from column k0 of each warp's slice."""
        kb = k0 // 32
        return (gl.load(w_ptrs + k0), gl.load(w_ptrs + (k0 + 32)), gl.load(w_ptrs + (k0 + 64)),
                gl.load(w_ptrs + (k0 + 96)),
                gl.load(x_ptrs + k0, mask=x_mask, other=0.0), gl.load(x_ptrs + (k0 + 32), mask=x_mask, other=0.0),
                gl.load(x_ptrs + (k0 + 64), mask=x_mask, other=0.0),
                gl.load(x_ptrs + (k0 + 96), mask=x_mask, other=0.0),
                gl.load(e_ptrs + kb), gl.load(e_ptrs + (kb + 1)), gl.load(e_ptrs + (kb + 2)),
                gl.load(e_ptrs + (kb + 3)))

    @gluon.jit
    def _compute4(acc, zero, w0, w1, w2, w3, x0, x1, x2, x3, e0, e1, e2, e3):
        acc = _block(acc, w0, x0, e0, zero)
        acc = _block(acc, w1, x1, e1, zero)
        acc = _block(acc, w2, x2, e2, zero)
        return _block(acc, w3, x3, e3, zero)

    @gluon.jit
    def _wo_a_gluon_kernel(
        x_ptr, w_ptr, e_ptr, y_ptr,
        M, R,
        stride_xm, stride_xg, stride_ym, stride_yg,
        D: gl.constexpr, NW: gl.constexpr, KW: gl.constexpr, BLOCK_M: gl.constexpr, BLOCKS: gl.constexpr,
        BLOCK_R: gl.constexpr,
    ):
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[NW, 1, 1],
                                                      instr_shape=[1, 16, 8])
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=KW)
        b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=KW)
        KPW: gl.constexpr = D // NW

        pid = gl.program_id(0)
        n_rt = R // BLOCK_R
        g = pid // n_rt
        r_in = (pid % n_rt) * BLOCK_R
        row0 = g * R + r_in  # row in the [G * R, D] weight

        # weights [NW, BLOCK_R, 32]: warp slice, row, K within the block
        sa = gl.expand_dims(gl.expand_dims(gl.arange(0, NW, layout=gl.SliceLayout(1, gl.SliceLayout(2, a_l))), 1), 2)
        ra = gl.expand_dims(gl.expand_dims(gl.arange(0, BLOCK_R, layout=gl.SliceLayout(0, gl.SliceLayout(2, a_l))),
                                           0), 2)
        ka = gl.expand_dims(gl.expand_dims(gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, a_l))), 0), 1)
        w_ptrs = w_ptr + (row0 + ra).to(gl.int64) * D + sa * KPW + ka

        # x [NW, 32, BLOCK_M]: warp slice, K within the block, token
        sb = gl.expand_dims(gl.expand_dims(gl.arange(0, NW, layout=gl.SliceLayout(1, gl.SliceLayout(2, b_l))), 1), 2)
        kb = gl.expand_dims(gl.expand_dims(gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(2, b_l))), 0), 2)
        mb = gl.expand_dims(gl.expand_dims(gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, gl.SliceLayout(1, b_l))),
                                           0), 1)
        x_ptrs = x_ptr + mb.to(gl.int64) * stride_xm + g * stride_xg + sb * KPW + kb
        x_mask = mb < M

        # one exponent per (warp slice, K block): [NW, 1, 1] in the accumulator's layout
        se = gl.expand_dims(gl.expand_dims(gl.arange(0, NW, layout=gl.SliceLayout(1, gl.SliceLayout(2, mma))), 1), 2)
        e_ptrs = e_ptr + (row0 // 32) * (D // 32) + se * (KPW // 32)

        zero = gl.zeros([NW, BLOCK_R, BLOCK_M], gl.float32, layout=mma)
        acc = gl.zeros([NW, BLOCK_R, BLOCK_M], gl.float32, layout=mma)
        # Every load of an iteration is issued before any is used. (A loop-carried prefetch made
        # the compiler keep each fp8 byte in its own register and repack them: slower.)
        for k0 in range(0, KPW, 32 * BLOCKS):
            a0, a1, a2, a3, xa0, xa1, xa2, xa3, ea0, ea1, ea2, ea3 = _load4(w_ptrs, x_ptrs, x_mask, e_ptrs, k0)
            if BLOCKS == 8:
                b0, b1, b2, b3, xb0, xb1, xb2, xb3, eb0, eb1, eb2, eb3 = _load4(w_ptrs, x_ptrs, x_mask, e_ptrs,
                                                                                k0 + 128)
            acc = _compute4(acc, zero, a0, a1, a2, a3, xa0, xa1, xa2, xa3, ea0, ea1, ea2, ea3)
            if BLOCKS == 8:
                acc = _compute4(acc, zero, b0, b1, b2, b3, xb0, xb1, xb2, xb3, eb0, eb1, eb2, eb3)

        y = gl.sum(acc, axis=0)  # [BLOCK_R, BLOCK_M], fixed order over the warp slices
        out_l: gl.constexpr = gl.BlockedLayout([1, 1], [32 // BLOCK_M, BLOCK_M], [NW, 1], [1, 0])
        y = gl.convert_layout(y, out_l)
        ro = gl.expand_dims(gl.arange(0, BLOCK_R, layout=gl.SliceLayout(1, out_l)), 1)
        mo = gl.expand_dims(gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, out_l)), 0)
        y_ptrs = y_ptr + mo.to(gl.int64) * stride_ym + g * stride_yg + r_in + ro
        gl.store(y_ptrs, y.to(gl.bfloat16), mask=mo < M)


def launch(x: torch.Tensor, twin, y: torch.Tensor, cfg: GluonConfig | None = None) -> torch.Tensor:
    """y = wo_a(x) on the gluon path; x, twin and y are validated by kernels.wo_a_w8.wo_a."""
    m, g, d = x.shape
    r = twin.rows
    if not available(x.device):
        raise ValueError("the gluon path needs a CUDA GPU of compute capability 8.9 or newer and Triton with Gluon")
    cfg = cfg or config_for(m, g, r, d, x.device)
    if not cfg.fits(m, r, d):
        raise ValueError(f"{cfg} does not tile M={m}, R={r}, D={d}")
    _wo_a_gluon_kernel[(g * (r // cfg.block_r),)](
        x, twin.values, twin.exponents, y, m, r, x.stride(0), x.stride(1), y.stride(0), y.stride(1),
        D=d, NW=cfg.num_warps, KW=cfg.k_width, BLOCK_M=cfg.block_m, BLOCKS=cfg.blocks, BLOCK_R=cfg.block_r,
        num_warps=cfg.num_warps)
    return y
