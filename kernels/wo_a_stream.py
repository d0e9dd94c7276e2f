"""Streaming ``wo_a`` kernels: one program per row tile over all of K, no split-K pass.

Round 3 of issue 9 (docs/kernels.md). The round-1/2 kernels split K over programs and summed the
fp32 partials in a second, serial step; that fixed cost (publish, acquire, the last program reading
every partial) was about half their time at G=4. These kernels keep each output row inside one
program and split K *inside* it instead:

* ``_stream_dot_kernel`` (tensor cores, any M): each K tile is S consecutive 32-wide K blocks and a
  batched dot ``[S, R, 32] @ [S, 32, M]`` computes the S block products side by side (the warps share
  the batch axis). Each block product (raw e4m3 values, exact in bf16, times bf16 x, fp32 sums) is
  scaled by its block's power of two (exact) and added to its own accumulator slice; the S slices
  are summed once at the end, in a fixed order.
* ``_stream_fma_kernel`` (CUDA cores, few rows): the weight is dequantised to fp32 (exact) and each
  thread keeps fp32 products per (token, row, K lane) for the whole K loop, reducing once at the end.

Both are deterministic: fixed tiles, a fixed in-program reduction order, no atomics. ``PDL``
programs call ``gdc_launch_dependents`` at entry and ``gdc_wait`` before the first read of x (the
weights never change, so the first weight tile streams while the producer of x finishes).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

try:  # Triton >= 3.3 (programmatic dependent launch on sm_90+)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton: PDL configurations are refused
    gdc_launch_dependents = gdc_wait = None

def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _pow2(e):
    """2**(e - 127) as fp32 from the stored exponent byte (exact for 1 <= e <= 254)."""
    return (e.to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _block_dot(w8, xt, INTERPRET: tl.constexpr):
    """Raw e4m3 values (exact in bf16) times x, fp32 result."""
    if INTERPRET:
        # the CPU interpreter's bf16 dot is unreliable; these operands are exact in fp32
        return tl.dot(w8.to(tl.float32), xt.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(w8.to(tl.bfloat16), xt)


@triton.jit
def _stream_dot_kernel(
    x_ptr, w_ptr, e_ptr, y_ptr,
    M, R, D,
    stride_xm, stride_xg, stride_ym, stride_yg,
    BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, S: tl.constexpr,
    NUM_STAGES: tl.constexpr, PDL: tl.constexpr, INTERPRET: tl.constexpr,
):
    """Program (row tile, token tile): y[m, g, r0:r0+BLOCK_R] over all of K.

    Each K tile is S consecutive 32-wide K blocks; a batched dot computes the S block products
    [S, BLOCK_R, 32] @ [S, 32, BLOCK_M] side by side (S warps share one tile), each is scaled by its
    block's power of two and added to its own accumulator slice; the S slices are summed at the end."""
    pid = tl.program_id(0)
    pid_m = tl.program_id(1)
    n_rt = R // BLOCK_R
    g = pid // n_rt
    row0 = g * R + (pid % n_rt) * BLOCK_R  # row in the [G * R, D] weight
    BK: tl.constexpr = S * 32

    s3 = tl.arange(0, S)[:, None, None]
    r3 = tl.arange(0, BLOCK_R)[None, :, None]
    kw = tl.arange(0, 32)[None, None, :]
    kx = tl.arange(0, 32)[None, :, None]
    m3 = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)[None, None, :]

    w_ptrs = w_ptr + (row0 + r3).to(tl.int64) * D + s3 * 32 + kw  # [S, BLOCK_R, 32]
    x_ptrs = x_ptr + m3.to(tl.int64) * stride_xm + g * stride_xg + s3 * 32 + kx  # [S, 32, BLOCK_M]
    x_mask = m3 < M
    # exponents as int32 words (four K blocks each): word loads ride the cp.async pipeline, byte
    # loads would stall every iteration (round 2); a K tile starts on a word boundary (S % 4 == 0)
    e_words = e_ptr.to(tl.pointer_type(tl.int32))
    e_ptrs = e_words + ((row0 + r3) // 32) * (D // 128) + s3 // 4  # [S, BLOCK_R, 1]
    e_shift = (s3 % 4) * 8

    if PDL:
        gdc_launch_dependents()
    acc = tl.zeros([S, BLOCK_R, BLOCK_M], dtype=tl.float32)
    # first tile peeled: its weights stream before the wait for x
    w8 = tl.load(w_ptrs)
    e = (tl.load(e_ptrs) >> e_shift) & 0xFF
    if PDL:
        gdc_wait()
    xt = tl.load(x_ptrs, mask=x_mask, other=0.0)
    acc += _block_dot(w8, xt, INTERPRET) * _pow2(e)
    for k0 in tl.range(BK, D, BK, num_stages=NUM_STAGES):
        w8 = tl.load(w_ptrs + k0)
        e = (tl.load(e_ptrs + k0 // 128) >> e_shift) & 0xFF
        xt = tl.load(x_ptrs + k0, mask=x_mask, other=0.0)
        acc += _block_dot(w8, xt, INTERPRET) * _pow2(e)

    y = tl.sum(acc, axis=0)  # [BLOCK_R, BLOCK_M], fixed order over the S slices
    offs_r = (pid % n_rt) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    y_ptrs = y_ptr + offs_m[None, :].to(tl.int64) * stride_ym + g * stride_yg + offs_r[:, None]
    tl.store(y_ptrs, y.to(tl.bfloat16), mask=offs_m[None, :] < M)


@triton.jit
def _stream_fma_kernel(
    x_ptr, w_ptr, e_ptr, y_ptr,
    M, R, D,
    stride_xm, stride_xg, stride_ym, stride_yg,
    BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr, PDL: tl.constexpr,
):
    """Program (row tile): fp32 products kept per (token, row, K lane); one reduction at the end.

    Tiles are read as [.., BLOCK_K/32, 32] so each 32-wide K block meets its scale by broadcast."""
    NKB: tl.constexpr = BLOCK_K // 32
    pid = tl.program_id(0)
    n_rt = R // BLOCK_R
    g = pid // n_rt
    row0 = g * R + (pid % n_rt) * BLOCK_R

    m4 = tl.arange(0, BLOCK_M)[:, None, None, None]
    r4 = tl.arange(0, BLOCK_R)[None, :, None, None]
    b4 = tl.arange(0, NKB)[None, None, :, None]
    c4 = tl.arange(0, 32)[None, None, None, :]
    w_ptrs = w_ptr + (row0 + r4).to(tl.int64) * D + b4 * 32 + c4  # [1, BLOCK_R, NKB, 32]
    x_ptrs = x_ptr + m4.to(tl.int64) * stride_xm + g * stride_xg + b4 * 32 + c4  # [BLOCK_M, 1, NKB, 32]
    x_mask = m4 < M
    e_words = e_ptr.to(tl.pointer_type(tl.int32))
    e_ptrs = e_words + ((row0 + r4) // 32) * (D // 128) + b4 // 4  # [1, BLOCK_R, NKB, 1]
    e_shift = (b4 % 4) * 8

    if PDL:
        gdc_launch_dependents()
    w8 = tl.load(w_ptrs)
    e = (tl.load(e_ptrs) >> e_shift) & 0xFF
    if PDL:
        gdc_wait()
    acc = (w8.to(tl.float32) * _pow2(e)) * tl.load(x_ptrs, mask=x_mask, other=0.0).to(tl.float32)
    for k0 in tl.range(BLOCK_K, D, BLOCK_K, num_stages=NUM_STAGES):
        w8 = tl.load(w_ptrs + k0)
        e = (tl.load(e_ptrs + k0 // 128) >> e_shift) & 0xFF
        acc += (w8.to(tl.float32) * _pow2(e)) * tl.load(x_ptrs + k0, mask=x_mask, other=0.0).to(tl.float32)

    y = tl.sum(tl.sum(acc, axis=3), axis=2)  # [BLOCK_M, BLOCK_R]
    offs_r = (pid % n_rt) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_m = tl.arange(0, BLOCK_M)
    y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + g * stride_yg + offs_r[None, :]
    tl.store(y_ptrs, y.to(tl.bfloat16), mask=offs_m[:, None] < M)


@dataclass(frozen=True)
class StreamConfig:
    """Tiles of one streaming launch. ``kind``: "dot" (tensor cores) or "fma" (CUDA cores).

    dot: a K tile is ``split`` 32-wide K blocks; fma: a K tile is ``block_k`` columns."""

    kind: str
    block_m: int
    block_r: int
    split: int = 4
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 3
    pdl: bool = False

    @property
    def k_tile(self) -> int:
        return 32 * self.split if self.kind == "dot" else self.block_k

    def fits(self, rows: int, cols: int) -> bool:
        """Whether these tiles divide an R x D weight exactly (the kernels have no R/K masks)."""
        pow2 = all(v > 0 and v & (v - 1) == 0 for v in (self.block_m, self.block_r, self.split, self.block_k))
        if not pow2 or self.kind not in ("dot", "fma"):
            return False
        if self.kind == "dot" and (self.block_m < 16 or self.block_r < 16 or self.split < 4):
            return False  # tl.dot needs 16 x 16 tiles; a K tile holds whole exponent words
        if self.kind == "fma" and (self.block_m > 8 or self.block_k < 128):
            return False
        return rows % self.block_r == 0 and cols % self.k_tile == 0


def launch_stream(x: torch.Tensor, twin, cfg: StreamConfig, y: torch.Tensor) -> torch.Tensor:
    """Run one streaming kernel; inputs are validated by the caller (kernels.wo_a_w8.wo_a)."""
    m, g, d = x.shape
    r = twin.rows
    if not cfg.fits(r, d):
        raise ValueError(f"{cfg} does not tile R={r}, D={d}")
    if cfg.pdl and (gdc_wait is None or _interpreting()):
        raise ValueError("programmatic dependent launch needs Triton >= 3.3 on a GPU")
    extra = {"launch_pdl": True} if cfg.pdl else {}
    args = (x, twin.values, twin.exponents, y, m, r, d, x.stride(0), x.stride(1), y.stride(0), y.stride(1))
    if cfg.kind == "dot":
        grid = (g * (r // cfg.block_r), -(-m // cfg.block_m))
        _stream_dot_kernel[grid](*args, BLOCK_M=cfg.block_m, BLOCK_R=cfg.block_r, S=cfg.split,
                                 NUM_STAGES=cfg.num_stages, PDL=cfg.pdl, INTERPRET=_interpreting(),
                                 num_warps=cfg.num_warps, **extra)
    else:
        if m > cfg.block_m:
            raise ValueError(f"the fma kernel takes at most {cfg.block_m} rows, got {m}")
        grid = (g * (r // cfg.block_r),)
        _stream_fma_kernel[grid](*args, BLOCK_M=cfg.block_m, BLOCK_R=cfg.block_r, BLOCK_K=cfg.block_k,
                                 NUM_STAGES=cfg.num_stages, PDL=cfg.pdl, num_warps=cfg.num_warps, **extra)
    return y
