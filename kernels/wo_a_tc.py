"""The ``tc`` path of ``wo_a`` (issue 26): tensor-core tiles from the fp8 twin alone, 17..1024 rows.

One launch covers all M tokens (the weights are read once per token tile, not once per 32 tokens as
on the ``wide`` ring path). A program owns ``block_r`` weight rows of one group, ``block_t`` tokens
and one K range; per K step it loads an e4m3 weight tile ``[block_r, block_k]`` and the int32 words
holding its block exponents (one word = four 32-wide K blocks of one 32-row block), dequantises the
tile to bf16 in registers (e4m3 -> bf16 is exact, and so is the multiply by the power-of-two block
scale: docs/reference.md section 5) and feeds it to ``tl.dot`` with fp32 accumulation. With
``w_as_a`` the weight tile is the dot's register A operand (``acc[R, T] = W @ x^T``: weight rows as
the MMA's M, tokens as N, so few tokens waste nothing); otherwise ``acc[T, R] = x @ W^T`` and Triton
stages the decoded tile in shared memory as the B operand (wgmma with 64+ tokens).

Split-K is deterministic: every split parks its fp32 partial and the last program to arrive sums the
partials in split order 0..S-1 (never arrival order), then resets the tile's counter (the shared
epilogue :func:`store_tile`, also used by the round 1-3 kernels of :mod:`kernels.wo_a_w8`).

This module imports nothing from the project (it ships in the engine image with the package).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

K_WORD = 128
"""K tiles are multiples of 128: the block exponents are read as int32 words of four."""


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def tile_origin(pid_gr, pid_k, R, BLOCK_R: tl.constexpr, k_per_split):
    """(group, first weight row, first K column) of program (pid_gr, pid_k): axis 1 of every Triton
    kernel's grid walks G * (R / BLOCK_R) row tiles, axis 2 the K splits."""
    n_rt = R // BLOCK_R
    return pid_gr // n_rt, (pid_gr % n_rt) * BLOCK_R, pid_k * k_per_split


@triton.jit
def exponent_words(e_ptr, g, offs_r, R, D, k0):
    """Pointers to the int32 words holding the block exponents of weight rows ``offs_r`` (any shape)
    from K column ``k0`` (a multiple of 128) on: one word = four 32-wide K blocks of one 32-row block.
    Words, not bytes: byte loads are not pipelined by Triton (round 1: 20.9 -> 14.4 us)."""
    e_words = e_ptr.to(tl.pointer_type(tl.int32))
    return e_words + (g * (R // 32) + offs_r // 32) * (D // 128) + k0 // 128


@triton.jit
def weight_ptrs(w_ptr, g, rows, R, D, k0, cols):
    """Pointers to the e4m3 weight values of group g at rows ``rows`` and K columns ``k0 + cols``
    (broadcast shapes: ``rows`` carries the row axes, ``cols`` the K axes)."""
    return w_ptr + g * R * D + rows * D + k0 + cols


@triton.jit
def token_ptrs(x_ptr, offs_t, stride_xm, g, stride_xg, k0, offs_k):
    """[tokens, K] pointers into x (any token and group strides, unit last stride; 64-bit token offsets)."""
    return x_ptr + offs_t[:, None].to(tl.int64) * stride_xm + g * stride_xg + k0 + offs_k[None, :]


@triton.jit
def store_tile(acc, y_ptr, ws_ptr, sem_ptr, M, split_k, stride_ym, stride_yg, g, r0, offs_m, pid_gr, pid_m, pid_k,
               BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, USE_SPLIT: tl.constexpr, SPLIT: tl.constexpr):
    """Write the [BLOCK_R, BLOCK_M] fp32 tile as bf16 y; with split-K, only after every split's partial.

    Deterministic split-K: every split parks its fp32 partial; the last to arrive sums them in split
    order 0..S-1 (not arrival order) and resets the tile's counter for the next launch."""
    offs_r = r0 + tl.arange(0, BLOCK_R)
    y_ptrs = y_ptr + offs_m[None, :].to(tl.int64) * stride_ym + g * stride_yg + offs_r[:, None]
    y_mask = offs_m[None, :] < M
    if USE_SPLIT:
        tile = pid_gr * tl.num_programs(0) + pid_m
        tile_elems = BLOCK_R * BLOCK_M
        offs_t = tl.arange(0, BLOCK_R)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
        ws_tile = ws_ptr + tile.to(tl.int64) * split_k * tile_elems
        tl.store(ws_tile + pid_k * tile_elems + offs_t, acc)
        # CTA barrier, then one GPU-scope release: the same publication pattern as CUTLASS's
        # split-K semaphore (release is cumulative over the writes the barrier ordered before it)
        tl.debug_barrier()
        arrived = tl.atomic_add(sem_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == split_k - 1:
            # unrolled over the compile-time split count: every partial load is in flight at once
            total = tl.zeros([BLOCK_R, BLOCK_M], dtype=tl.float32)
            for s in tl.static_range(SPLIT):
                total += tl.load(ws_tile + s * tile_elems + offs_t, cache_modifier=".cg")
            tl.store(y_ptrs, total.to(tl.bfloat16), mask=y_mask)
            tl.atomic_xchg(sem_ptr + tile, 0, sem="relaxed", scope="gpu")
    else:
        tl.store(y_ptrs, acc.to(tl.bfloat16), mask=y_mask)


@triton.jit
def decode_tile(w8, words, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BF16_SCALE: tl.constexpr,
                INTERPRET: tl.constexpr):
    """The bf16 weight tile [BLOCK_R, BLOCK_K] from its e4m3 values and its exponent words [BLOCK_R,
    BLOCK_K / 128]: the tile is viewed as [BLOCK_R, BLOCK_K / 32, 32] so each 32-wide K block meets its
    power-of-two scale by broadcast (exact either way: docs/reference.md section 5)."""
    NKB: tl.constexpr = BLOCK_K // 32
    shifts = tl.arange(0, 4)[None, None, :] * 8
    ex = tl.reshape((words[:, :, None] >> shifts) & 0xFF, [BLOCK_R, NKB])
    if BF16_SCALE and not INTERPRET:
        # 2**(e - 127) as bf16 bits (e << 7): one bf16 multiply per weight, exact
        scale = (ex << 7).to(tl.int16).to(tl.bfloat16, bitcast=True)
        wd = tl.reshape(tl.reshape(w8.to(tl.bfloat16), [BLOCK_R, NKB, 32]) * scale[:, :, None],
                        [BLOCK_R, BLOCK_K])
    else:
        # e4m3 -> fp32 -> bf16 (not the conversion pipe's e4m3 -> f16 -> bf16); the interpreter's bf16
        # arithmetic is unreliable, and fp32 holds every product exactly
        scale = (ex << 23).to(tl.float32, bitcast=True)
        wd = tl.reshape(tl.reshape(w8.to(tl.float32), [BLOCK_R, NKB, 32]) * scale[:, :, None],
                        [BLOCK_R, BLOCK_K]).to(tl.bfloat16)
    return wd


@triton.jit
def mma_step(acc, wd, xt, W_AS_A: tl.constexpr, INTERPRET: tl.constexpr):
    """acc += wd @ xt^T (``W_AS_A``: acc is [R, T]) or xt @ wd^T (acc is [T, R]), fp32 accumulation."""
    if INTERPRET:
        # the CPU interpreter's dot is wrong on bf16 operands; these values are exact in fp32
        if W_AS_A:
            acc += tl.dot(wd.to(tl.float32), tl.trans(xt.to(tl.float32)), input_precision="ieee")
        else:
            acc += tl.dot(xt.to(tl.float32), tl.trans(wd.to(tl.float32)), input_precision="ieee")
    elif W_AS_A:
        acc = tl.dot(wd, tl.trans(xt), acc)
    else:
        acc = tl.dot(xt, tl.trans(wd), acc)
    return acc


@triton.jit
def zero_acc(BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, W_AS_A: tl.constexpr):
    if W_AS_A:
        acc = tl.zeros([BLOCK_R, BLOCK_T], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
    return acc


@triton.jit
def finish_tile(acc, y_ptr, ws_ptr, sem_ptr, M, split_k, stride_ym, stride_yg, g, r0, offs_t, pid_gr, pid_t, pid_k,
                BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, W_AS_A: tl.constexpr, USE_SPLIT: tl.constexpr,
                SPLIT: tl.constexpr):
    """The tc kernels' epilogue: the accumulator as [R, T], then :func:`store_tile`."""
    if not W_AS_A:
        acc = tl.trans(acc)
    store_tile(acc, y_ptr, ws_ptr, sem_ptr, M, split_k, stride_ym, stride_yg, g, r0, offs_t, pid_gr, pid_t, pid_k,
               BLOCK_T, BLOCK_R, USE_SPLIT, SPLIT)


@triton.jit(do_not_specialize=["M"])
def _tc_kernel(
    x_ptr, w_ptr, e_ptr, y_ptr, ws_ptr, sem_ptr,
    M, R, D, k_per_split, split_k,
    stride_xm, stride_xg, stride_ym, stride_yg,
    BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
    W_AS_A: tl.constexpr, BF16_SCALE: tl.constexpr, USE_SPLIT: tl.constexpr, SPLIT: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    NW: tl.constexpr = BLOCK_K // 128
    pid_t = tl.program_id(0)
    pid_gr = tl.program_id(1)
    pid_k = tl.program_id(2)
    g, r0, k0 = tile_origin(pid_gr, pid_k, R, BLOCK_R, k_per_split)

    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_r = r0 + tl.arange(0, BLOCK_R)
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = weight_ptrs(w_ptr, g, offs_r[:, None], R, D, k0, offs_k[None, :])
    x_ptrs = token_ptrs(x_ptr, offs_t, stride_xm, g, stride_xg, k0, offs_k)
    t_mask = offs_t[:, None] < M
    # the exponent words of each row's 32-row block: [BLOCK_R, NW], four K blocks per word
    e_ptrs = exponent_words(e_ptr, g, offs_r, R, D, k0)[:, None] + tl.arange(0, NW)[None, :]

    acc = zero_acc(BLOCK_T, BLOCK_R, W_AS_A)
    for _ in range(0, k_per_split, BLOCK_K):
        w8 = tl.load(w_ptrs)
        words = tl.load(e_ptrs)
        xt = tl.load(x_ptrs, mask=t_mask, other=0.0)
        acc = mma_step(acc, decode_tile(w8, words, BLOCK_R, BLOCK_K, BF16_SCALE, INTERPRET), xt, W_AS_A, INTERPRET)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
        e_ptrs += NW
    finish_tile(acc, y_ptr, ws_ptr, sem_ptr, M, split_k, stride_ym, stride_yg, g, r0, offs_t, pid_gr, pid_t, pid_k,
                BLOCK_T, BLOCK_R, W_AS_A, USE_SPLIT, SPLIT)


@triton.jit(do_not_specialize=["M"])
def _tc_tma_kernel(
    x_desc, w_desc, e_ptr, y_ptr, ws_ptr, sem_ptr,
    M, R, D, k_per_split, split_k,
    stride_ym, stride_yg,
    BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
    W_AS_A: tl.constexpr, USE_SPLIT: tl.constexpr, SPLIT: tl.constexpr, INTERPRET: tl.constexpr,
):
    """:func:`_tc_kernel` (fp32 scale multiply) with the weight tile and the x tile loaded by the bulk
    tensor copy engine (host tensor descriptors: w as [G*R, D], x as [M, G, D]; tokens past M read as
    zeros) instead of per-thread cp.async addresses; the decode, the dot and the epilogue are shared."""
    NW: tl.constexpr = BLOCK_K // 128
    pid_t = tl.program_id(0)
    pid_gr = tl.program_id(1)
    pid_k = tl.program_id(2)
    g, r0, k0 = tile_origin(pid_gr, pid_k, R, BLOCK_R, k_per_split)
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_r = r0 + tl.arange(0, BLOCK_R)
    e_ptrs = exponent_words(e_ptr, g, offs_r, R, D, k0)[:, None] + tl.arange(0, NW)[None, :]

    acc = zero_acc(BLOCK_T, BLOCK_R, W_AS_A)
    for kk in range(0, k_per_split, BLOCK_K):
        w8 = w_desc.load([g * R + r0, k0 + kk])
        xt = tl.reshape(x_desc.load([pid_t * BLOCK_T, g, k0 + kk]), [BLOCK_T, BLOCK_K])
        words = tl.load(e_ptrs)
        acc = mma_step(acc, decode_tile(w8, words, BLOCK_R, BLOCK_K, False, INTERPRET), xt, W_AS_A, INTERPRET)
        e_ptrs += NW
    finish_tile(acc, y_ptr, ws_ptr, sem_ptr, M, split_k, stride_ym, stride_yg, g, r0, offs_t, pid_gr, pid_t, pid_k,
                BLOCK_T, BLOCK_R, W_AS_A, USE_SPLIT, SPLIT)


@triton.jit(do_not_specialize=["M"])
def _tc_sub_kernel(
    x_ptr, w_ptr, e_ptr, y_ptr, ws_ptr, sem_ptr,
    M, R, D, k_per_split, split_k,
    stride_xm, stride_xg, stride_ym, stride_yg,
    BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
    W_AS_A: tl.constexpr, BF16_SCALE: tl.constexpr, USE_SPLIT: tl.constexpr, SPLIT: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """The same product, one 32-wide K block per dot: every row of a [BLOCK_R, 32] weight tile has one
    block scale, a [BLOCK_R, 1] column broadcast in the tile's own layout (no reshape of the tile)."""
    NW: tl.constexpr = BLOCK_K // 128
    pid_t = tl.program_id(0)
    pid_gr = tl.program_id(1)
    pid_k = tl.program_id(2)
    g, r0, k0 = tile_origin(pid_gr, pid_k, R, BLOCK_R, k_per_split)

    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_r = r0 + tl.arange(0, BLOCK_R)
    offs_c = tl.arange(0, 32)
    w_ptrs = weight_ptrs(w_ptr, g, offs_r[:, None], R, D, k0, offs_c[None, :])
    x_ptrs = token_ptrs(x_ptr, offs_t, stride_xm, g, stride_xg, k0, offs_c)
    t_mask = offs_t[:, None] < M
    e_ptrs = exponent_words(e_ptr, g, offs_r, R, D, k0)[:, None]

    acc = zero_acc(BLOCK_T, BLOCK_R, W_AS_A)
    for _ in range(0, k_per_split, BLOCK_K):
        for wi in tl.static_range(NW):
            word = tl.load(e_ptrs + wi)
            for b in tl.static_range(4):
                j = wi * 4 + b
                w8 = tl.load(w_ptrs + j * 32)
                xt = tl.load(x_ptrs + j * 32, mask=t_mask, other=0.0)
                ex = (word >> (8 * b)) & 0xFF
                if BF16_SCALE and not INTERPRET:
                    wd = w8.to(tl.bfloat16) * (ex << 7).to(tl.int16).to(tl.bfloat16, bitcast=True)
                else:
                    wd = (w8.to(tl.float32) * (ex << 23).to(tl.float32, bitcast=True)).to(tl.bfloat16)
                acc = mma_step(acc, wd, xt, W_AS_A, INTERPRET)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
        e_ptrs += NW
    finish_tile(acc, y_ptr, ws_ptr, sem_ptr, M, split_k, stride_ym, stride_yg, g, r0, offs_t, pid_gr, pid_t, pid_k,
                BLOCK_T, BLOCK_R, W_AS_A, USE_SPLIT, SPLIT)


@dataclass(frozen=True)
class TcConfig:
    """Tiles and launch parameters of one ``tc`` launch (see the module docstring)."""

    block_t: int
    block_r: int
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    w_as_a: bool = True
    bf16_scale: bool = True
    sub_blocks: bool = False  # one dot per 32-wide K block (_tc_sub_kernel) instead of per block_k
    tma: bool = False  # weight and x tiles by tensor descriptors (_tc_tma_kernel; fp32 scale multiply)

    def fits(self, rows: int, cols: int) -> bool:
        """Whether these tiles divide an R x D weight exactly (the kernel masks tokens, not R or K)."""
        pow2 = all(v >= 1 and v & (v - 1) == 0 for v in (self.block_t, self.block_r, self.block_k, self.split_k))
        if not pow2 or self.block_t < 16 or self.block_r < 32 or self.block_k % K_WORD:
            return False
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1:
            return False
        if self.tma and (self.sub_blocks or self.bf16_scale):
            return False  # the descriptor kernel is the reshaping kernel with the fp32 scale multiply
        return rows % self.block_r == 0 and cols % (self.block_k * self.split_k) == 0

    def grid(self, m: int, groups: int, rows: int) -> tuple[int, int, int]:
        return (-(-m // self.block_t), groups * (rows // self.block_r), self.split_k)


def tma_ok(x: torch.Tensor) -> bool:
    """Whether x can be read through a tensor descriptor (16-byte base and strides, unit last stride)."""
    return x.data_ptr() % 16 == 0 and x.stride(2) == 1 and x.stride(0) % 8 == 0 and x.stride(1) % 8 == 0


def launch(x: torch.Tensor, values: torch.Tensor, exponents: torch.Tensor, semaphores: torch.Tensor,
           y: torch.Tensor, cfg: TcConfig) -> torch.Tensor:
    """y[t, g, :] = W[g] @ x[t, g, :] for the twin (values, exponents) with one ``tc`` launch. The caller
    has validated x, y and the twin; a tiling that does not divide the weight or whose split-K would
    need more counters than the twin holds is a ``ValueError``."""
    m, groups, d = x.shape
    r = values.shape[1]
    if not cfg.fits(r, d):
        raise ValueError(f"{cfg} does not tile R={r}, D={d}")
    grid = cfg.grid(m, groups, r)
    use_split = cfg.split_k > 1
    if use_split:
        tiles = grid[0] * grid[1]
        if tiles > semaphores.numel():
            raise ValueError(f"split-K over {tiles} tiles exceeds the twin's {semaphores.numel()} counters")
        ws = torch.empty(tiles * cfg.split_k * cfg.block_r * cfg.block_t, dtype=torch.float32, device=x.device)
    else:
        ws = y  # unused
    if cfg.tma:
        if not tma_ok(x):
            raise ValueError("the tc descriptor kernel needs x 16-byte aligned with token and group strides that "
                             "are multiples of 8 elements")
        w_desc = TensorDescriptor.from_tensor(values.view(groups * r, d), [cfg.block_r, cfg.block_k])
        x_desc = TensorDescriptor(x, list(x.shape), list(x.stride()), [cfg.block_t, 1, cfg.block_k])
        _tc_tma_kernel[grid](
            x_desc, w_desc, exponents, y, ws, semaphores,
            m, r, d, d // cfg.split_k, cfg.split_k,
            y.stride(0), y.stride(1),
            BLOCK_T=cfg.block_t, BLOCK_R=cfg.block_r, BLOCK_K=cfg.block_k, W_AS_A=cfg.w_as_a,
            USE_SPLIT=use_split, SPLIT=cfg.split_k, INTERPRET=interpreting(),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        return y
    kernel = _tc_sub_kernel if cfg.sub_blocks else _tc_kernel
    kernel[grid](
        x, values, exponents, y, ws, semaphores,
        m, r, d, d // cfg.split_k, cfg.split_k,
        x.stride(0), x.stride(1), y.stride(0), y.stride(1),
        BLOCK_T=cfg.block_t, BLOCK_R=cfg.block_r, BLOCK_K=cfg.block_k, W_AS_A=cfg.w_as_a,
        BF16_SCALE=cfg.bf16_scale, USE_SPLIT=use_split, SPLIT=cfg.split_k, INTERPRET=interpreting(),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return y
