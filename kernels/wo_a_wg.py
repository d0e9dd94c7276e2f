"""Issue 26, fifth session: a Gluon wgmma kernel for the 33..192-row range (experiment).

Swap-AB: the weight rows are wgmma's M (64 per warpgroup), the tokens its N (one token tile of up to
256), K in steps of BLOCK_K. Per K step the bulk tensor copy engine (TMA) brings the e4m3 weight tile
[BLOCK_R, BLOCK_K] and the x tile [BLOCK_N, BLOCK_K] into an S-deep ring of shared-memory slots that
complete on one mbarrier per slot; the warps read the e4m3 tile back 16 bytes per thread, decode it
exactly to bf16 with the ring kernel's integer decode (``wo_a_gluon.DECODE_ASM``: one block scale per
16-byte chunk), write it into one of three NVMMA-swizzled bf16 buffers, and issue an asynchronous
wgmma (A: decoded weights, B: x^T, both from shared memory; fp32 accumulators in registers), keeping
one wgmma in flight. Split-K is fixed-order (the same semaphore pattern as ``wo_a_tc.store_tile``:
every split parks its fp32 partial, the last to arrive sums them in split order), so results are
bitwise reproducible. With ``pdl`` the launch is a programmatic dependent launch: the first weight
tiles are requested before waiting for the previous kernel (x is its output).

Sixth session: the same tiles warp-specialised (``WgConfig.decoders`` > 0, :func:`_wg_ws_kernel`): a TMA
warp, decode warps and the wgmma warps hand the ring slots and decoded buffers over on mbarriers instead of a
CTA barrier per step; same sums in the same order, so the same bits.

Needs an sm_90 GPU (wgmma, TMA), Triton with Gluon, x whose groups are contiguous (group stride D, token
stride a multiple of 8 elements, 16-byte base) and block exponents up to ``wo_a_gluon.RING_EXP_MAX``
(:func:`wg_ok`). No CPU interpreter (Gluon has none).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from . import wo_a_gluon as _gl

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                   warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _barrier = getattr(gl, "barrier", None) or gl.thread_barrier
except ImportError:  # pragma: no cover - Triton without Gluon's Hopper module
    gluon = None

CAPABILITY = (9, 0)  # wgmma and the bulk tensor copy (sm_90; sm_100+ has no wgmma)
WS_DECODE_REGS = 128  # registers per decode-warp thread in the warp-specialised kernel (setmaxnreg)


@dataclass(frozen=True)
class WgConfig:
    """Weight rows per program, token tile, K step, split-K, warps (4 per 64 rows), ring stages, PDL, and
    ``decoders``: 0 for the one-partition kernel, 4 or 8 for the warp-specialised one (that many decode
    warps beside one TMA warp, or with ``tma_warp=False`` the decode warps issuing the copies too, which
    keeps 128-row, 256-token tiles under the register cap; ``num_warps`` are then the wgmma warps alone)."""

    block_r: int = 128
    block_n: int = 64
    block_k: int = 64
    split_k: int = 4
    num_warps: int = 4
    stages: int = 4
    pdl: bool = True
    decoders: int = 0
    tma_warp: bool = True

    WS_BUFFERS = 3  # decoded bf16 tiles in flight (both kernels)

    def smem_bytes(self) -> int:
        return (self.stages * (self.block_r * self.block_k + self.block_n * self.block_k * 2)
                + self.WS_BUFFERS * self.block_r * self.block_k * 2
                + (2 * self.stages + 2 * self.WS_BUFFERS if self.decoders else self.stages) * 8)  # mbarriers

    def fits(self, rows: int, cols: int) -> bool:
        ks = cols // self.split_k if self.split_k else 0
        wr = self.row_warps
        return (self.block_r in (64, 128, 256) and self.num_warps in (4, 8) and self.block_n in (16, 32, 64, 128, 256)
                and self.block_k in (64, 128) and self.stages >= 3
                and wr % 4 == 0 and self.num_warps % wr == 0 and self.block_n // (self.num_warps // wr) >= 16
                and self.block_r % (16 * wr) == 0 and rows % self.block_r == 0
                and cols % self.split_k == 0 and ks % self.block_k == 0 and ks >= self.block_k
                and self.decoders in (0, 4, 8) and (self.tma_warp or self.decoders > 0)
                and self.smem_bytes() <= 227 * 1024)

    @property
    def row_warps(self) -> int:
        """Warps along the weight rows (a warpgroup per 64 rows); the rest split the token tile."""
        return min(self.num_warps, self.block_r // 16)

    def grid(self, m: int, groups: int, rows: int) -> tuple[int, int, int]:
        return (groups * rows // self.block_r, -(-m // self.block_n), self.split_k)


def available(device: torch.device | str) -> bool:
    device = torch.device(device)
    if gluon is None or device.type != "cuda" or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False
    return torch.cuda.is_available() and _gl._capability(device) == CAPABILITY


def wg_ok(x: torch.Tensor, twin) -> bool:
    """x readable as one [M, G*D] descriptor, and block scales the integer decode covers."""
    _, g, d = x.shape
    return (x.data_ptr() % 16 == 0 and x.stride(2) == 1 and (g == 1 or x.stride(1) == d)
            and x.stride(0) % 8 == 0 and twin.max_exponent <= _gl.RING_EXP_MAX)


if gluon is not None:

    @gluon.jit
    def _tma_prologue(x_desc, w_desc, x_smem, w_smem, bars, row0, t0, k_base, xk_base, N: gl.constexpr,
                      NK: gl.constexpr, BLOCK_K: gl.constexpr, STAGE_BYTES: gl.constexpr, PDL: gl.constexpr):
        """Steps 0..N-1 into slots 0..N-1: the weight tiles first, then (with PDL) the wait for the previous
        kernel, then the x tiles, each slot's barrier expecting both."""
        for s in gl.static_range(N):
            if s < NK:
                mbarrier.expect(bars.index(s), STAGE_BYTES)
                _tma_load(w_desc, [row0, k_base + s * BLOCK_K], bars.index(s), w_smem.index(s))
        if PDL:
            gl.inline_asm_elementwise(_gl.GDC_ASM, "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        for s in gl.static_range(N):
            if s < NK:
                _tma_load(x_desc, [t0, xk_base + s * BLOCK_K], bars.index(s), x_smem.index(s))

    @gluon.jit
    def _exp_scale(words, k0, ce):
        """The bf16x2 scales 2**(e - 7) of the K step at k0 from the rows' exponent words (one byte per 32-wide
        block, four blocks a word), broadcastable over the tile's 16-code groups."""
        shift = (((k0 % 128) // 32) + ce // 2) * 8
        ex = (gl.expand_dims(words, 1) >> gl.expand_dims(shift, 0)) & 255
        return gl.expand_dims(ex * 0x00800080 + 0x3C003C00, 2)

    @gluon.jit
    def _tile_origin(R, D: gl.constexpr, BLOCK_R: gl.constexpr, BLOCK_N: gl.constexpr, SPLIT: gl.constexpr):
        """This program's tile: its group, its first weight row (in the group and overall), its first token and
        its first K column in the weight and in x (split-K slice pid_k of D // SPLIT columns)."""
        pid_r = gl.program_id(0)
        pid_k = gl.program_id(2)
        n_rt = R // BLOCK_R
        g = pid_r // n_rt
        r_in = (pid_r % n_rt) * BLOCK_R
        k_base = pid_k * (D // SPLIT)
        return pid_r, pid_k, g, r_in, g * R + r_in, gl.program_id(1) * BLOCK_N, k_base, g * D + k_base

    @gluon.jit
    def _wg_kernel(x_desc, w_desc, e_ptr, y_ptr, ws_ptr, sem_ptr, M, R, stride_ym, stride_yg,
                   D: gl.constexpr, BLOCK_R: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                   SPLIT: gl.constexpr, S: gl.constexpr, NW: gl.constexpr, PDL: gl.constexpr):
        pid_r, pid_k, g, r_in, row0, t0, k_base, xk_base = _tile_origin(R, D, BLOCK_R, BLOCK_N, SPLIT)
        NK: gl.constexpr = D // SPLIT // BLOCK_K

        # the e4m3 tile as read back: 16 bytes of one row per thread
        TK: gl.constexpr = BLOCK_K // 16
        l2: gl.constexpr = gl.BlockedLayout([1, 16], [32 // TK, TK], [NW, 1], [1, 0])
        l3: gl.constexpr = gl.BlockedLayout([1, 1, 16], [32 // TK, TK, 1], [NW, 1, 1], [2, 1, 0])
        le: gl.constexpr = gl.SliceLayout(2, l3)
        # warpgroups along the rows first (64 rows each), the others split the token tile
        WR: gl.constexpr = NW if NW * 16 <= BLOCK_R else BLOCK_R // 16
        acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WR, NW // WR],
                                                        instr_shape=[16, BLOCK_N // (NW // WR), 16])
        wb_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

        w_smem = gl.allocate_shared_memory(gl.uint8, [S, BLOCK_R, BLOCK_K], w_desc.layout)
        x_smem = gl.allocate_shared_memory(gl.bfloat16, [S, BLOCK_N, BLOCK_K], x_desc.layout)
        wb_smem = gl.allocate_shared_memory(gl.bfloat16, [3, BLOCK_R, BLOCK_K], wb_sl)
        bars = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(S):
            mbarrier.init(bars.index(s), count=1)
        fence_async_shared()

        STAGE_BYTES: gl.constexpr = BLOCK_R * BLOCK_K + BLOCK_N * BLOCK_K * 2
        # prologue: steps 0..S-3 (step i + S - 2 is requested at step i, into the slot step i - 2 freed)
        _tma_prologue(x_desc, w_desc, x_smem, w_smem, bars, row0, t0, k_base, xk_base, S - 2, NK, BLOCK_K,
                      STAGE_BYTES, PDL)

        # exponent words: one int32 per 32 rows and 128 K (four 32-wide blocks, one byte each)
        re = gl.arange(0, BLOCK_R, layout=gl.SliceLayout(1, le))
        ce = gl.arange(0, TK, layout=gl.SliceLayout(0, le))
        e_rows = e_ptr + ((row0 + re) // 32) * (D // 128)
        e_next = gl.load(e_rows + k_base // 128)

        acc = gl.zeros([BLOCK_R, BLOCK_N], gl.float32, acc_l)
        for i in range(NK):
            slot = i % S
            k0 = k_base + i * BLOCK_K
            words = e_next
            if i + 1 < NK:
                e_next = gl.load(e_rows + (k0 + BLOCK_K) // 128)
            scale = _exp_scale(words, k0, ce)
            mbarrier.wait(bars.index(slot), (i // S) & 1)
            codes = gl.convert_layout(gl.reshape(w_smem.index(slot).load(l2), [BLOCK_R, TK, 16]), l3)
            codes, scale = gl.broadcast(codes, scale)
            wd = gl.convert_layout(gl.reshape(_gl._decode(codes, scale), [BLOCK_R, BLOCK_K]), l2)
            wb = wb_smem.index(i % 3)
            wb.store(wd)
            fence_async_shared()
            _barrier()
            # every warpgroup is past step i - 1's wait: step i - 2's slot is free
            j = i + S - 2
            if j < NK:
                sj = j % S
                mbarrier.expect(bars.index(sj), STAGE_BYTES)
                _tma_load(w_desc, [row0, k_base + j * BLOCK_K], bars.index(sj), w_smem.index(sj))
                _tma_load(x_desc, [t0, xk_base + j * BLOCK_K], bars.index(sj), x_smem.index(sj))
            acc = warpgroup_mma(wb, x_smem.index(slot).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
        for q in gl.static_range(S):
            mbarrier.invalidate(bars.index(q))

        _wg_epilogue(acc, y_ptr, ws_ptr, sem_ptr, M, stride_ym, stride_yg, g, r_in, t0, pid_r, pid_k,
                     BLOCK_R, BLOCK_N, SPLIT, NW)

    @gluon.jit
    def _wg_epilogue(acc, y_ptr, ws_ptr, sem_ptr, M, stride_ym, stride_yg, g, r_in, t0, pid_r, pid_k,
                     BLOCK_R: gl.constexpr, BLOCK_N: gl.constexpr, SPLIT: gl.constexpr, NW: gl.constexpr):
        """y[t, g, r] = acc[r, t], rows fastest; split-K in fixed order (the last split to arrive sums)."""
        out_l: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [1, NW], [0, 1])
        acc = gl.convert_layout(acc, out_l)
        ro = gl.expand_dims(gl.arange(0, BLOCK_R, layout=gl.SliceLayout(1, out_l)), 1)
        to = gl.expand_dims(gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, out_l)), 0)
        y_ptrs = y_ptr + (t0 + to).to(gl.int64) * stride_ym + g * stride_yg + r_in + ro
        y_mask = (t0 + to < M) & (ro >= 0)
        if SPLIT > 1:
            tile = pid_r * gl.num_programs(1) + gl.program_id(1)
            TILE: gl.constexpr = BLOCK_R * BLOCK_N
            offs = to * BLOCK_R + ro
            ws_tile = ws_ptr + tile.to(gl.int64) * (SPLIT * TILE)
            gl.store(ws_tile + pid_k * TILE + offs, acc)
            _barrier()
            arrived = gl.atomic_add(sem_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT - 1:
                total = gl.zeros([BLOCK_R, BLOCK_N], gl.float32, out_l)
                for q in gl.static_range(SPLIT):
                    total += gl.load(ws_tile + q * TILE + offs, cache_modifier=".cg")
                gl.store(y_ptrs, total.to(gl.bfloat16), mask=y_mask)
                gl.atomic_xchg(sem_ptr + tile, 0, sem="relaxed", scope="gpu")
        else:
            gl.store(y_ptrs, acc.to(gl.bfloat16), mask=y_mask)

    @gluon.jit
    def _ws_load(x_desc, w_desc, w_smem, x_smem, full, empty, row0, t0, k_base, xk_base,
                 NK: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr, STAGE_BYTES: gl.constexpr,
                 PDL: gl.constexpr):
        """The TMA warp: step j's weight and x tiles into slot j % S once the decoder and the wgmma warps
        have released the slot (``empty``: two arrivals); the first S weight tiles before the PDL wait."""
        _tma_prologue(x_desc, w_desc, x_smem, w_smem, full, row0, t0, k_base, xk_base, S, NK, BLOCK_K,
                      STAGE_BYTES, PDL)
        for j in range(S, NK):
            sj = j % S
            mbarrier.wait(empty.index(sj), ((j // S) - 1) & 1)
            mbarrier.expect(full.index(sj), STAGE_BYTES)
            _tma_load(w_desc, [row0, k_base + j * BLOCK_K], full.index(sj), w_smem.index(sj))
            _tma_load(x_desc, [t0, xk_base + j * BLOCK_K], full.index(sj), x_smem.index(sj))

    @gluon.jit
    def _ws_decode(w_smem, wb_smem, full, empty, wb_full, wb_empty, e_ptr, row0, k_base,
                   x_desc, w_desc, x_smem, t0, xk_base,
                   D: gl.constexpr, NK: gl.constexpr, BLOCK_R: gl.constexpr, BLOCK_K: gl.constexpr,
                   S: gl.constexpr, NB: gl.constexpr, DW: gl.constexpr, LOAD: gl.constexpr,
                   STAGE_BYTES: gl.constexpr, PDL: gl.constexpr):
        """The decode warps: e4m3 tile of slot i % S -> exact bf16 into buffer i % NB (the one-partition
        kernel's decode), then release the slot and publish the buffer. With LOAD (no TMA warp) they also
        request step i + S - 2 into the slot of step i - 2 once the wgmma warps have released it."""
        if LOAD:
            _tma_prologue(x_desc, w_desc, x_smem, w_smem, full, row0, t0, k_base, xk_base, S - 2, NK, BLOCK_K,
                          STAGE_BYTES, PDL)
        TK: gl.constexpr = BLOCK_K // 16
        l2: gl.constexpr = gl.BlockedLayout([1, 16], [32 // TK, TK], [DW, 1], [1, 0])
        l3: gl.constexpr = gl.BlockedLayout([1, 1, 16], [32 // TK, TK, 1], [DW, 1, 1], [2, 1, 0])
        le: gl.constexpr = gl.SliceLayout(2, l3)
        re = gl.arange(0, BLOCK_R, layout=gl.SliceLayout(1, le))
        ce = gl.arange(0, TK, layout=gl.SliceLayout(0, le))
        e_rows = e_ptr + ((row0 + re) // 32) * (D // 128)
        e_next = gl.load(e_rows + k_base // 128)
        for i in range(NK):
            slot = i % S
            b = i % NB
            k0 = k_base + i * BLOCK_K
            words = e_next
            if i + 1 < NK:
                e_next = gl.load(e_rows + (k0 + BLOCK_K) // 128)
            scale = _exp_scale(words, k0, ce)
            mbarrier.wait(full.index(slot), (i // S) & 1)
            codes = gl.convert_layout(gl.reshape(w_smem.index(slot).load(l2), [BLOCK_R, TK, 16]), l3)
            mbarrier.arrive(empty.index(slot))
            codes, scale = gl.broadcast(codes, scale)
            wd = gl.convert_layout(gl.reshape(_gl._decode(codes, scale), [BLOCK_R, BLOCK_K]), l2)
            if i >= NB:
                mbarrier.wait(wb_empty.index(b), ((i // NB) - 1) & 1)
            wb_smem.index(b).store(wd)
            fence_async_shared()
            mbarrier.arrive(wb_full.index(b))
            if LOAD:
                j = i + S - 2
                if j < NK:
                    sj = j % S
                    if j >= S:
                        mbarrier.wait(empty.index(sj), ((j // S) - 1) & 1)
                    mbarrier.expect(full.index(sj), STAGE_BYTES)
                    _tma_load(w_desc, [row0, k_base + j * BLOCK_K], full.index(sj), w_smem.index(sj))
                    _tma_load(x_desc, [t0, xk_base + j * BLOCK_K], full.index(sj), x_smem.index(sj))

    @gluon.jit
    def _ws_mma(x_smem, wb_smem, full, empty, wb_full, wb_empty, NK: gl.constexpr, S: gl.constexpr,
                NB: gl.constexpr, BLOCK_R: gl.constexpr, BLOCK_N: gl.constexpr, NW: gl.constexpr):
        """The wgmma warps: one asynchronous wgmma per step (one in flight); a step's slot and buffer are
        released once its wgmma has completed."""
        WR: gl.constexpr = NW if NW * 16 <= BLOCK_R else BLOCK_R // 16
        acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WR, NW // WR],
                                                        instr_shape=[16, BLOCK_N // (NW // WR), 16])
        acc = gl.zeros([BLOCK_R, BLOCK_N], gl.float32, acc_l)
        for i in range(NK):
            slot = i % S
            b = i % NB
            mbarrier.wait(full.index(slot), (i // S) & 1)
            mbarrier.wait(wb_full.index(b), (i // NB) & 1)
            acc = warpgroup_mma(wb_smem.index(b), x_smem.index(slot).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])
            if i > 0:
                mbarrier.arrive(empty.index((i - 1) % S))
                mbarrier.arrive(wb_empty.index((i - 1) % NB))
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
        return (acc,)

    @gluon.jit
    def _wg_ws_kernel(x_desc, w_desc, e_ptr, y_ptr, ws_ptr, sem_ptr, M, R, stride_ym, stride_yg,
                      D: gl.constexpr, BLOCK_R: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                      SPLIT: gl.constexpr, S: gl.constexpr, NW: gl.constexpr, PDL: gl.constexpr,
                      DW: gl.constexpr, NB: gl.constexpr, DEC_REGS: gl.constexpr, TMA_WARP: gl.constexpr):
        """The wg kernel, warp-specialised (sixth session): one TMA warp fills the S-slot ring, DW decode
        warps turn each e4m3 tile into bf16 in one of NB buffers, the NW wgmma warps multiply; mbarriers
        between them instead of a CTA barrier per step. Same tiles, decode and sums (same bits) as
        :func:`_wg_kernel`."""
        pid_r, pid_k, g, r_in, row0, t0, k_base, xk_base = _tile_origin(R, D, BLOCK_R, BLOCK_N, SPLIT)
        NK: gl.constexpr = D // SPLIT // BLOCK_K
        wb_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        w_smem = gl.allocate_shared_memory(gl.uint8, [S, BLOCK_R, BLOCK_K], w_desc.layout)
        x_smem = gl.allocate_shared_memory(gl.bfloat16, [S, BLOCK_N, BLOCK_K], x_desc.layout)
        wb_smem = gl.allocate_shared_memory(gl.bfloat16, [NB, BLOCK_R, BLOCK_K], wb_sl)
        full = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
        wb_full = gl.allocate_shared_memory(gl.int64, [NB, 1], mbarrier.MBarrierLayout())
        wb_empty = gl.allocate_shared_memory(gl.int64, [NB, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(S):
            mbarrier.init(full.index(s), count=1)
            mbarrier.init(empty.index(s), count=2)  # the decoder and the wgmma warps
        for s in gl.static_range(NB):
            mbarrier.init(wb_full.index(s), count=1)
            mbarrier.init(wb_empty.index(s), count=1)
        fence_async_shared()
        STAGE_BYTES: gl.constexpr = BLOCK_R * BLOCK_K + BLOCK_N * BLOCK_K * 2
        if TMA_WARP:
            (acc,) = gl.warp_specialize([
                (_ws_mma, (x_smem, wb_smem, full, empty, wb_full, wb_empty, NK, S, NB, BLOCK_R, BLOCK_N, NW)),
                (_ws_load, (x_desc, w_desc, w_smem, x_smem, full, empty, row0, t0, k_base, xk_base, NK, BLOCK_K, S,
                            STAGE_BYTES, PDL)),
                (_ws_decode, (w_smem, wb_smem, full, empty, wb_full, wb_empty, e_ptr, row0, k_base, x_desc, w_desc,
                              x_smem, t0, xk_base, D, NK, BLOCK_R, BLOCK_K, S, NB, DW, False, STAGE_BYTES, PDL)),
            ], [1, DW], [24, DEC_REGS])
        else:
            (acc,) = gl.warp_specialize([
                (_ws_mma, (x_smem, wb_smem, full, empty, wb_full, wb_empty, NK, S, NB, BLOCK_R, BLOCK_N, NW)),
                (_ws_decode, (w_smem, wb_smem, full, empty, wb_full, wb_empty, e_ptr, row0, k_base, x_desc, w_desc,
                              x_smem, t0, xk_base, D, NK, BLOCK_R, BLOCK_K, S, NB, DW, True, STAGE_BYTES, PDL)),
            ], [DW], [DEC_REGS])
        if PDL:  # y, the partials and the counters after the previous kernel (the TMA warp waited for x)
            gl.inline_asm_elementwise(_gl.GDC_ASM, "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        _wg_epilogue(acc, y_ptr, ws_ptr, sem_ptr, M, stride_ym, stride_yg, g, r_in, t0, pid_r, pid_k,
                     BLOCK_R, BLOCK_N, SPLIT, NW)


def _nvmma(block_k: int, bits: int):
    return gl.NVMMASharedLayout(swizzle_byte_width=min(128, block_k * bits // 8), element_bitwidth=bits, rank=2)


def launch(x: torch.Tensor, twin, y: torch.Tensor, cfg: WgConfig) -> torch.Tensor:
    """y = wo_a(x) with one wg launch; x, y and the twin validated by the caller (kernels.wo_a_w8)."""
    m, groups, d = x.shape
    r = twin.rows
    if not available(x.device):
        raise ValueError("the wg kernel needs an sm_90 GPU and Triton with Gluon's Hopper module")
    if not cfg.fits(r, d):
        raise ValueError(f"{cfg} does not tile R={r}, D={d}")
    if not wg_ok(x, twin):
        raise ValueError("the wg kernel needs x 16-byte aligned, groups contiguous, token stride a multiple of 8 "
                         f"elements, and block exponents up to {_gl.RING_EXP_MAX}")
    grid = cfg.grid(m, groups, r)
    tiles = grid[0] * grid[1]
    if cfg.split_k > 1:
        if tiles > twin.semaphores.numel():
            raise ValueError(f"split-K over {tiles} tiles exceeds the twin's {twin.semaphores.numel()} counters")
        ws = torch.empty(tiles * cfg.split_k * cfg.block_r * cfg.block_n, dtype=torch.float32, device=x.device)
    else:
        ws = y
    w2 = twin.values.view(torch.uint8).view(groups * r, d)
    w_desc = TensorDescriptor(w2, [groups * r, d], [d, 1], [cfg.block_r, cfg.block_k], _nvmma(cfg.block_k, 8))
    x2 = x.as_strided((m, groups * d), (x.stride(0), 1))
    x_desc = TensorDescriptor(x2, [m, groups * d], [x.stride(0), 1], [cfg.block_n, cfg.block_k],
                              _nvmma(cfg.block_k, 16))
    args = (x_desc, w_desc, twin.exponents.view(torch.int32), y, ws, twin.semaphores, m, r, y.stride(0), y.stride(1))
    consts = dict(D=d, BLOCK_R=cfg.block_r, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT=cfg.split_k,
                  S=cfg.stages, NW=cfg.num_warps, PDL=cfg.pdl, num_warps=cfg.num_warps, launch_pdl=cfg.pdl)
    if cfg.decoders:
        _wg_ws_kernel[grid](*args, DW=cfg.decoders, NB=cfg.WS_BUFFERS, DEC_REGS=WS_DECODE_REGS,
                            TMA_WARP=cfg.tma_warp, **consts)
    else:
        _wg_kernel[grid](*args, **consts)
    return y
