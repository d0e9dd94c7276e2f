"""Gluon (explicit-layout Triton) ``wo_a`` kernels for 1..16 rows on sm_89+ GPUs (the ``gluon`` path).

Round 5 (docs/kernels.md): ``_wo_a_ring_kernel`` streams a tiled copy of the weights (:func:`pack_tiles`)
and x through a cp.async ring in shared memory, each thread copying exactly the bytes it reads back in
the mma operand layouts; :func:`launch` runs it when x's strides allow (:func:`ring_ok`) and a measured
tiling fits the device's shared memory (:func:`default_ring_config`), else the register kernel below.

Round 4 of issue 9: the register kernel. Plain Triton stages the fp8 weight tile through shared memory
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
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
    # cp.async global -> shared: async_load since Triton 3.7, async_copy_global_to_shared before
    _async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
except ImportError:  # pragma: no cover - Triton without Gluon (< 3.5): the Triton paths serve
    gluon = None

MAX_M = 16  # the dispatcher's range: the ring kernel for 1..16 rows; the register kernel serves 1..8
#             (and 9..16 with GluonConfig(block_m=16)) where the ring cannot run (docs/kernels.md)
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


@dataclass(frozen=True)
class RingConfig:
    """Tiles of one ring launch (round 5): rows per program, token tile, warps (K split), K blocks per
    stage, stages of the cp.async ring. Shared memory per program: stages * sb * warps * (block_r * 32
    fp8 bytes + 32 * block_m bf16 values)."""

    block_r: int = 16
    block_m: int = 8
    num_warps: int = 4
    sb: int = 2
    stages: int = 6

    def smem_bytes(self) -> int:
        return self.stages * self.sb * self.num_warps * (self.block_r * 32 + 32 * self.block_m * 2)

    def fits(self, m: int, rows: int, cols: int) -> bool:
        kpw = cols // self.num_warps if self.num_warps else 0
        return (1 <= m <= self.block_m and self.block_m in (8, 16) and self.block_r in (16, 32)
                and self.num_warps in (1, 2, 4, 8) and self.sb in (1, 2, 4, 8) and self.stages >= 2
                and rows % self.block_r == 0 and cols % self.num_warps == 0 and kpw % 128 == 0
                and kpw % (32 * self.sb) == 0)


@lru_cache(maxsize=None)
def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


@lru_cache(maxsize=None)
def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


@lru_cache(maxsize=None)
def _smem_per_block(device: torch.device) -> int:
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "shared_memory_per_block_optin", 0) or getattr(props, "shared_memory_per_block", 0))


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


# Measured on the H200 (docs/kernels.md, round 5): 4 warps on 16 rows, 2 K blocks per stage, 6 stages
# for up to 8 tokens (G=4: 7.3-7.9 us, G=2: 5.4-5.8 us); 4 warps on 32 rows, 4 blocks, 3 stages for 9..16.
RING_CANDIDATES = {8: (RingConfig(16, 8, 4, 2, 6), RingConfig(16, 8, 4, 4, 3), RingConfig(16, 8, 4, 2, 3),
                       RingConfig(16, 8, 2, 2, 4)),
                   16: (RingConfig(32, 16, 4, 4, 3), RingConfig(16, 16, 4, 2, 6), RingConfig(16, 16, 4, 2, 3),
                        RingConfig(16, 16, 4, 2, 2))}


def default_ring_config(m: int, rows: int, cols: int, smem_limit: int) -> RingConfig | None:
    """The measured ring tiling for m tokens that fits this shape and the device's shared memory per
    program (GB10-class parts allow ~99 KB), or None (then the register kernel runs)."""
    if not 1 <= m <= 16:
        return None
    for cfg in RING_CANDIDATES[8 if m <= 8 else 16]:
        if cfg.fits(m, rows, cols) and cfg.smem_bytes() + 1024 <= smem_limit:
            return cfg
    return None


def ring_ok(x: torch.Tensor) -> bool:
    """The ring copies x 16 bytes at a time: its token and group strides must be multiples of 16
    elements (what Triton specialises as aligned) and its data 16-byte aligned."""
    return x.data_ptr() % 16 == 0 and x.stride(0) % 16 == 0 and x.stride(1) % 16 == 0


def pack_tiles(values: torch.Tensor) -> torch.Tensor:
    """fp8 values [G, R, D] -> [G*R/16, D/32, 16, 32]: every 16x32 block 512 contiguous bytes, the K
    blocks of a 16-row tile in order (what the ring copies, 256 contiguous bytes per warp instruction)."""
    g, r, d = values.shape
    if r % 16 or d % 32:
        raise ValueError(f"tiles need R % 16 == 0 and D % 32 == 0, got {tuple(values.shape)}")
    return values.reshape(g * r // 16, 16, d // 32, 32).permute(0, 2, 1, 3).contiguous()


def unpack_tiles(tiles: torch.Tensor, groups: int) -> torch.Tensor:
    """The inverse of :func:`pack_tiles`: [G*R/16, D/32, 16, 32] -> [G, R, D]."""
    n, kb, _, _ = tiles.shape
    return tiles.permute(0, 2, 1, 3).reshape(groups, n * 16 // groups, kb * 32)


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

    @gluon.jit
    def _ring_issue(wsm, xsm, w_base, x_ptrs, x_mask, st: gl.constexpr, S: gl.constexpr, SB: gl.constexpr):
        """cp.async of stage st (SB K blocks of weights and x) into ring slot st % S; each thread
        copies exactly the bytes it will read back, in the mma operand layouts."""
        for j in gl.static_range(SB):
            _async_load(wsm.index((st % S) * SB + j), w_base + (st * SB + j) * 512)
            _async_load(xsm.index((st % S) * SB + j), x_ptrs + (st * SB + j) * 32, mask=x_mask)

    @gluon.jit
    def _wo_a_ring_kernel(
        x_ptr, w_ptr, e_ptr, y_ptr,
        M, R,
        stride_xm, stride_xg, stride_ym, stride_yg,
        D: gl.constexpr, NW: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_R: gl.constexpr, S: gl.constexpr,
        SB: gl.constexpr,
    ):
        """Round 5: weights from the tiled copy (pack_tiles) and x stream through an S-stage cp.async
        ring in shared memory; exponents (int32 words, 4 K blocks each) are copied once. Same math
        and reduction order as _wo_a_gluon_kernel."""
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[NW, 1, 1],
                                                      instr_shape=[1, 16, 8])
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=8)
        b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=8)
        KPW: gl.constexpr = D // NW
        NST: gl.constexpr = KPW // (32 * SB)
        NWORDS: gl.constexpr = KPW // 128

        pid = gl.program_id(0)
        n_rt = R // BLOCK_R
        g = pid // n_rt
        r_in = (pid % n_rt) * BLOCK_R
        row0 = g * R + r_in

        # weights [NW, BLOCK_R, 32] of K block 0; block b of a warp's slice is 512 * b bytes further
        sa = gl.expand_dims(gl.expand_dims(gl.arange(0, NW, layout=gl.SliceLayout(1, gl.SliceLayout(2, a_l))), 1), 2)
        ra = gl.expand_dims(gl.expand_dims(gl.arange(0, BLOCK_R, layout=gl.SliceLayout(0, gl.SliceLayout(2, a_l))),
                                           0), 2)
        ka = gl.expand_dims(gl.expand_dims(gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, a_l))), 0), 1)
        w_base = (w_ptr + row0.to(gl.int64) * D) + ((ra // 16) * (16 * D) + (ra % 16) * 32 + sa * (KPW * 16) + ka)

        sb = gl.expand_dims(gl.expand_dims(gl.arange(0, NW, layout=gl.SliceLayout(1, gl.SliceLayout(2, b_l))), 1), 2)
        kb = gl.expand_dims(gl.expand_dims(gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(2, b_l))), 0), 2)
        mb = gl.expand_dims(gl.expand_dims(gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, gl.SliceLayout(1, b_l))),
                                           0), 1)
        x_ptrs = x_ptr + mb.to(gl.int64) * stride_xm + g * stride_xg + sb * KPW + kb
        x_mask = (mb < M) & (kb >= 0) & (sb >= 0)  # full shape: padding tokens are zero-filled

        se = gl.expand_dims(gl.expand_dims(gl.arange(0, NW, layout=gl.SliceLayout(1, gl.SliceLayout(2, mma))), 1), 2)
        e_base = e_ptr + (row0 // 32) * (D // 128) + se * NWORDS

        flat: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[2, 1, 0])
        k_fast: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 2, 0])
        wsm = gl.allocate_shared_memory(gl.float8e4nv, [S * SB, NW, BLOCK_R, 32], flat)
        xsm = gl.allocate_shared_memory(gl.bfloat16, [S * SB, NW, 32, BLOCK_M], k_fast)
        esm = gl.allocate_shared_memory(gl.int32, [NWORDS, NW, 1, 1], flat)
        for q in gl.static_range(NWORDS):
            _async_load(esm.index(q), e_base + q)
        for st in gl.static_range(S - 1):
            if st < NST:
                _ring_issue(wsm, xsm, w_base, x_ptrs, x_mask, st, S, SB)
            async_copy.commit_group()

        zero = gl.zeros([NW, BLOCK_R, BLOCK_M], gl.float32, layout=mma)
        acc = gl.zeros([NW, BLOCK_R, BLOCK_M], gl.float32, layout=mma)
        for i in gl.static_range(NST):
            if i + S - 1 < NST:
                _ring_issue(wsm, xsm, w_base, x_ptrs, x_mask, i + S - 1, S, SB)
            async_copy.commit_group()
            async_copy.wait_group(S - 1)  # stage i has landed
            for j in gl.static_range(SB):
                w8 = wsm.index((i % S) * SB + j).load(a_l)
                xt = xsm.index((i % S) * SB + j).load(b_l)
                word = esm.index((i * SB + j) // 4).load(mma)
                acc = _block(acc, w8, xt, (word >> (8 * ((i * SB + j) % 4))) & 255, zero)

        y = gl.sum(acc, axis=0)  # [BLOCK_R, BLOCK_M], fixed order over the warp slices
        out_l: gl.constexpr = gl.BlockedLayout([1, 1], [32 // BLOCK_M, BLOCK_M], [NW, 1], [1, 0])
        y = gl.convert_layout(y, out_l)
        ro = gl.expand_dims(gl.arange(0, BLOCK_R, layout=gl.SliceLayout(1, out_l)), 1)
        mo = gl.expand_dims(gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, out_l)), 0)
        y_ptrs = y_ptr + mo.to(gl.int64) * stride_ym + g * stride_yg + r_in + ro
        gl.store(y_ptrs, y.to(gl.bfloat16), mask=mo < M)


def launch(x: torch.Tensor, twin, y: torch.Tensor, cfg: GluonConfig | RingConfig | None = None) -> torch.Tensor:
    """y = wo_a(x) on the gluon path; x, twin and y are validated by kernels.wo_a_w8.wo_a.

    Without ``cfg``: the ring kernel when x's strides allow it and a measured tiling fits the
    device's shared memory, else the register kernel (up to 16 rows)."""
    m, g, d = x.shape
    r = twin.rows
    if not available(x.device):
        raise ValueError("the gluon path needs a CUDA GPU of compute capability 8.9 or newer and Triton with Gluon")
    if cfg is None and ring_ok(x):
        cfg = default_ring_config(m, r, d, _smem_per_block(x.device))
    if isinstance(cfg, RingConfig):
        if not cfg.fits(m, r, d):
            raise ValueError(f"{cfg} does not tile M={m}, R={r}, D={d}")
        if not ring_ok(x):
            raise ValueError("the ring kernel needs x 16-byte aligned with token and group strides that are "
                             "multiples of 16 elements")
        _wo_a_ring_kernel[(g * (r // cfg.block_r),)](
            x, twin.tiles(), twin.exponents.view(torch.int32), y, m, r, x.stride(0), x.stride(1), y.stride(0),
            y.stride(1), D=d, NW=cfg.num_warps, BLOCK_M=cfg.block_m, BLOCK_R=cfg.block_r, S=cfg.stages, SB=cfg.sb,
            num_warps=cfg.num_warps)
        return y
    cfg = cfg or config_for(m, g, r, d, x.device)
    if not cfg.fits(m, r, d):
        raise ValueError(f"{cfg} does not tile M={m}, R={r}, D={d}")
    _wo_a_gluon_kernel[(g * (r // cfg.block_r),)](
        x, twin.values, twin.exponents, y, m, r, x.stride(0), x.stride(1), y.stride(0), y.stride(1),
        D=d, NW=cfg.num_warps, KW=cfg.k_width, BLOCK_M=cfg.block_m, BLOCKS=cfg.blocks, BLOCK_R=cfg.block_r,
        num_warps=cfg.num_warps)
    return y
