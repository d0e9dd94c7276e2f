"""Gluon (explicit-layout Triton) ``wo_a`` kernels for 1..16 rows on sm_89+ GPUs (the ``gluon`` path).

The ring kernel (rounds 5 and 6, docs/kernels.md): ``_wo_a_ring_kernel`` streams lane-ordered tiles of
the weights (:func:`pack_tiles`) and x through a cp.async ring in shared memory, each thread copying
exactly the 16-byte pieces it reads back in the mma operand layouts, and decodes e4m3 -> bf16 with
integer and bf16 fma instructions (``DECODE_ASM``); :func:`launch` runs it when x's strides and the
twin's exponents allow (:func:`ring_ok`) and a measured tiling fits the device's shared memory
(:func:`default_ring_config`), else the register kernel below.

Round 7: on sm_90+ GPUs the ring is a programmatic dependent launch (PDL; ``WO_A_PDL=0`` turns it
off). A decode step runs its kernels back to back in one CUDA graph; with PDL this kernel's programs
start while the previous kernel's still run, request their first S - 1 stages of weights (constants),
and only then wait for the previous kernel's writes (``griddepcontrol.wait``) before they copy x; each
lets the next kernel launch at once (``griddepcontrol.launch_dependents``). The tilings then keep at
most two programs per SM (:data:`PDL_CANDIDATES`). A following kernel that is itself a PDL launch must
wait (``griddepcontrol.wait``) before it reads y, as the PDL contract requires; plain launches are
unaffected.

Round 8: for 6..16 rows where 32-row programs keep the SMs busy (G=4 on the H200) the PDL tilings are
:data:`PDL_WIDE`, programs of two warps along the rows that share each K slice's copy of x
(``RingConfig(row_warps=2)``); they give the 16-row programs' bits.

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
    # CTA barrier: gl.barrier since Triton 3.7, gl.thread_barrier before
    _barrier = getattr(gl, "barrier", None) or gl.thread_barrier
except ImportError:  # pragma: no cover - Triton without Gluon (< 3.5): the Triton paths serve
    gluon = None

MAX_M = 16  # the dispatcher's range: the ring kernel for 1..16 rows; the register kernel serves 1..8
#             (and 9..16 with GluonConfig(block_m=16)) where the ring cannot run (docs/kernels.md)
RING_TOKEN_TILES = (8, 16, 32, 64)  # 8 and 16 for 1..16 rows; 32 and 64 for the mid rows (issue 26: the
#                                   dispatcher runs M > 16 rows as ceil(M / tile) launches of one tile each)
MIN_CAPABILITY = (8, 9)  # cvt e4m3x2 -> f16x2 (sm_89+); mma.sync bf16 (sm_80+)
PDL_CAPABILITY = (9, 0)  # griddepcontrol (programmatic dependent launch)
PDL_ENV = "WO_A_PDL"  # "0" turns programmatic dependent launches off (default on where supported)
SMEM_RESERVED = 1024  # shared memory the driver reserves per program (sm_80+)


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
    stage, stages of the cp.async ring, and whether it is a programmatic dependent launch. Shared memory
    per program: stages * sb * warps * (block_r * 32 fp8 bytes + 32 * block_m bf16 values)."""

    block_r: int = 16
    block_m: int = 8
    num_warps: int = 4
    sb: int = 2
    stages: int = 6
    pdl: bool = False  # a programmatic dependent launch (sm_90+, round 7): see PDL_CANDIDATES
    row_warps: int = 1  # warps along the rows (1 or 2): 2 share each K slice's x copy (num_warps * 2 warps)

    def smem_bytes(self) -> int:
        return self.stages * self.sb * self.num_warps * (self.block_r * 32 + 32 * self.block_m * 2)

    def smem_footprint(self) -> int:
        """What a program of this tiling takes from its SM: its buffers and the driver's reservation."""
        return self.smem_bytes() + SMEM_RESERVED

    def fits(self, m: int, rows: int, cols: int) -> bool:
        kpw = cols // self.num_warps if self.num_warps else 0
        return (1 <= m <= self.block_m and self.block_m in RING_TOKEN_TILES and self.block_r in (16, 32)
                and self.num_warps in (1, 2, 4, 8) and self.sb in (1, 2, 4, 8) and self.stages >= 2
                and self.row_warps in (1, 2) and (self.block_r // 16) % self.row_warps == 0
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


@lru_cache(maxsize=None)
def _smem_per_sm(device: torch.device) -> int:
    return int(getattr(torch.cuda.get_device_properties(device), "shared_memory_per_multiprocessor", 0) or 0)


def pdl_enabled(device: torch.device | str) -> bool:
    """Whether ring launches on this device are programmatic dependent launches: an sm_90+ GPU, and
    the environment variable WO_A_PDL is not "0"."""
    device = torch.device(device)
    return (available(device) and _capability(device) >= PDL_CAPABILITY
            and os.environ.get(PDL_ENV, "1").strip() != "0")


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


# Measured on the H200 (docs/kernels.md, round 6, docs/measurements/wo_a_round6_compare.json): 4 warps
# per program, 2 K blocks per stage; 16-row programs with 8 stages, or 32-row ones with 6 (x is read once
# per 32 rows) where they still give 7/8 of the SMs a program and the token tile is wide enough to pay:
# G=4 from 6 tokens (M=8: 7.69 vs 7.94 us; M=4: 16 rows 7.32 us), G=4 9..16 (8.43-8.75 vs 8.8-9.1 us);
# G=2 keeps 16 rows (64 wide programs would idle half the H200). Later entries fit smaller shared memory.
RING_CANDIDATES = {16: ((2, 8), (2, 6), (4, 3), (2, 3), (2, 2)), 32: ((2, 6), (4, 3), (2, 3))}  # (sb, stages)


# Programmatic dependent launch (round 7, docs/kernels.md; docs/measurements/wo_a_round7_final.json and
# wo_a_round7_pdl_tilings.json): the next
# kernel's programs take SM slots as soon as this one lets them, so PDL pays most where at most two
# programs fit an SM (the running kernel's and the next one's): at 1..8 rows 1.3-1.7 us faster with
# 80 KB programs (G=4), 0.1-0.8 us with round 6's 64-74 KB ones (three per SM; at 9..16 rows those were
# up to 0.9 us slower). Measured on the H200 (G=4, same run, docs/measurements/wo_a_round7_final.json): 16-row
# programs with 10 stages 5.80-6.55 us for 1..8 rows against 6.88-8.02 us for round 6's plain launch.
PDL_CANDIDATES = {8: (10, 12, 8, 6, 5, 4, 3, 2), 16: (8, 6, 5, 4, 3, 2)}  # stages of 16-row programs, sb 2
# 6..16 rows where 32-row programs keep 7/8 of the SMs busy (G=4 on the H200): one program per SM of 8 warps,
# 4 along K and 2 along the rows, the two row halves sharing one copy of x (row_warps=2: x comes from L2
# once per 32 rows); 10 stages with an 8-token tile (123 KB), 8 with 16 tokens (131 KB): the fewest that
# still keep a second program off the SM. Round 8, same process each (docs/measurements/wo_a_round8_compare.json,
# wo_a_round8_wide_stages.json,
# wo_a_round7_row_warps.json), G=4 with PDL: 6.18-6.28 vs 6.32-6.37 us for 16-row programs at 6 rows,
# 6.27-6.35 vs 6.53-6.60 at 8; 7.19 vs 7.50 (10 stages) and 7.57 (round 7's 32-row programs, one warp per
# K slice) at 12 rows, 7.68 vs 7.88 and 8.01 at 16; 1..4 rows and G=2 stay faster with 16-row programs.
PDL_WIDE = {8: RingConfig(32, 8, 4, 2, 10, pdl=True, row_warps=2),
            16: RingConfig(32, 16, 4, 2, 8, pdl=True, row_warps=2)}


def default_ring_config(m: int, groups: int, rows: int, cols: int, sms: int, smem_limit: int, pdl: bool = False,
                        smem_per_sm: int = 0) -> RingConfig | None:
    """The measured ring tiling for m tokens that fits this shape and the device's shared memory per
    program (GB10-class parts allow ~99 KB), or None (then the register kernel runs). With ``pdl``:
    :data:`PDL_WIDE` for 6..16 rows where 32-row programs keep the SMs busy and it fits, else 16-row
    programs with the first of PDL_CANDIDATES' stage counts that lets exactly two programs share an SM
    of ``smem_per_sm`` bytes (the first that fits, if none does)."""
    if not 1 <= m <= 16:
        return None
    block_m = 8 if m <= 8 else 16
    wide = rows % 32 == 0 and 8 * (groups * rows // 32) >= 7 * sms and (m >= 6 or block_m == 16)
    if pdl:
        big = PDL_WIDE[block_m]
        if wide and big.fits(m, rows, cols) and big.smem_footprint() <= smem_limit:
            return big
        fitting = [c for c in (RingConfig(16, block_m, 4, 2, st, pdl=True) for st in PDL_CANDIDATES[block_m])
                   if c.fits(m, rows, cols) and c.smem_footprint() <= smem_limit]
        two = [c for c in fitting if smem_per_sm // c.smem_footprint() == 2]
        if two or fitting:
            return (two or fitting)[0]
    for block_r in ((32, 16) if wide else (16,)):
        for sb, stages in RING_CANDIDATES[block_r]:
            cfg = RingConfig(block_r, block_m, 4, sb, stages)
            if cfg.fits(m, rows, cols) and cfg.smem_footprint() <= smem_limit:
                return cfg
    return None


def ring_config_for(m: int, groups: int, rows: int, cols: int, device: torch.device | str,
                    pdl: bool | None = None) -> RingConfig | None:
    """default_ring_config for this device; ``pdl`` None: :func:`pdl_enabled`."""
    device = torch.device(device)
    pdl = pdl_enabled(device) if pdl is None else pdl
    return default_ring_config(m, groups, rows, cols, _sms(device), _smem_per_block(device), pdl, _smem_per_sm(device))


# The ring's decode multiplies by 2**(e - 7) in bf16: exponents up to 134 (blocks with scales up to 2**7;
# real weights sit near 2**-4); a twin with larger ones runs the register kernel or mid.
RING_EXP_MAX = 134


def ring_ok(x: torch.Tensor, twin=None) -> bool:
    """The ring copies x 16 bytes at a time: its token and group strides must be multiples of 16
    elements (what Triton specialises as aligned) and its data 16-byte aligned; and the twin's block
    exponents must be within what its bf16 decode scales (:data:`RING_EXP_MAX`)."""
    return (x.data_ptr() % 16 == 0 and x.stride(0) % 16 == 0 and x.stride(1) % 16 == 0
            and (twin is None or twin.max_exponent <= RING_EXP_MAX))


def pack_tiles(values: torch.Tensor) -> torch.Tensor:
    """fp8 values [G, R, D] -> lane-ordered tiles [G*R/16, D/32, 512]: every 16x32 block is 512
    contiguous bytes, 16 per lane of the warp that reads it (lane 4*i + t: rows i and i + 8, columns
    8t..8t+7, the mma.sync operand), the K blocks of a 16-row tile in order. One 16-byte cp.async and
    one 16-byte shared load per thread and block; a warp's copy reads 512 contiguous bytes."""
    g, r, d = values.shape
    if r % 16 or d % 32:
        raise ValueError(f"tiles need R % 16 == 0 and D % 32 == 0, got {tuple(values.shape)}")
    n, kb = g * r // 16, d // 32
    # [tile, half, i, kb, t, byte] -> [tile, kb, i, t, half, byte]
    return values.reshape(n, 2, 8, kb, 4, 8).permute(0, 3, 2, 4, 1, 5).reshape(n, kb, 512).contiguous()


def unpack_tiles(tiles: torch.Tensor, groups: int) -> torch.Tensor:
    """The inverse of :func:`pack_tiles`: [G*R/16, D/32, 512] -> [G, R, D]."""
    n, kb, _ = tiles.shape
    return tiles.reshape(n, kb, 8, 4, 2, 8).permute(0, 4, 2, 1, 3, 5).reshape(groups, n * 16 // groups, kb * 32)


if gluon is not None:

    @gluon.jit
    def _pow2(e):
        return (e.to(gl.int32) << 23).to(gl.float32, bitcast=True)

    @gluon.jit
    def _block(acc, w8, xt, e, zero):
        wb = w8.to(gl.float16).to(gl.float32).to(gl.bfloat16)  # see the module docstring
        return acc + mma_v2(wb, xt, zero) * _pow2(e)

    @gluon.jit
    def _program_rows(R, BLOCK_R: gl.constexpr):
        """This program's group, its first row within the group, and that row in the [G * R, D] weight."""
        pid = gl.program_id(0)
        n_rt = R // BLOCK_R
        g = pid // n_rt
        r_in = (pid % n_rt) * BLOCK_R
        return g, r_in, g * R + r_in

    @gluon.jit
    def _x_block(x_ptr, M, g, stride_xm, stride_xg, b_l: gl.constexpr, NW: gl.constexpr, KPW: gl.constexpr,
                 BLOCK_M: gl.constexpr):
        """Pointers to x of K block 0 of each warp's slice, [NW, 32, BLOCK_M] (warp slice, K within the
        block, token) in the mma B-operand layout, and the mask of real tokens at full shape (the
        ring's cp.async zero-fills padding tokens)."""
        sb = gl.expand_dims(gl.expand_dims(gl.arange(0, NW, layout=gl.SliceLayout(1, gl.SliceLayout(2, b_l))), 1), 2)
        kb = gl.expand_dims(gl.expand_dims(gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(2, b_l))), 0), 2)
        mb = gl.expand_dims(gl.expand_dims(gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, gl.SliceLayout(1, b_l))),
                                           0), 1)
        x_ptrs = x_ptr + mb.to(gl.int64) * stride_xm + g * stride_xg + sb * KPW + kb
        return x_ptrs, (mb < M) & (kb >= 0) & (sb >= 0)

    @gluon.jit
    def _store_rows(acc, y_ptr, M, g, r_in, stride_ym, stride_yg, NW: gl.constexpr, BLOCK_R: gl.constexpr,
                    BLOCK_M: gl.constexpr):
        """Sum the NW warp accumulators [NW, BLOCK_R, BLOCK_M] in a fixed order and store the real
        tokens' rows as bf16."""
        y = gl.sum(acc, axis=0)
        TM: gl.constexpr = BLOCK_M if BLOCK_M < 32 else 32  # threads along the tokens (wider tiles: issue 26)
        out_l: gl.constexpr = gl.BlockedLayout([1, 1], [32 // TM, TM], [NW, 1], [1, 0])
        y = gl.convert_layout(y, out_l)
        ro = gl.expand_dims(gl.arange(0, BLOCK_R, layout=gl.SliceLayout(1, out_l)), 1)
        mo = gl.expand_dims(gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, out_l)), 0)
        y_ptrs = y_ptr + mo.to(gl.int64) * stride_ym + g * stride_yg + r_in + ro
        gl.store(y_ptrs, y.to(gl.bfloat16), mask=mo < M)

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

        g, r_in, row0 = _program_rows(R, BLOCK_R)

        # weights [NW, BLOCK_R, 32]: warp slice, row, K within the block
        sa = gl.expand_dims(gl.expand_dims(gl.arange(0, NW, layout=gl.SliceLayout(1, gl.SliceLayout(2, a_l))), 1), 2)
        ra = gl.expand_dims(gl.expand_dims(gl.arange(0, BLOCK_R, layout=gl.SliceLayout(0, gl.SliceLayout(2, a_l))),
                                           0), 2)
        ka = gl.expand_dims(gl.expand_dims(gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, a_l))), 0), 1)
        w_ptrs = w_ptr + (row0 + ra).to(gl.int64) * D + sa * KPW + ka

        x_ptrs, x_mask = _x_block(x_ptr, M, g, stride_xm, stride_xg, b_l, NW, KPW, BLOCK_M)

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

        _store_rows(acc, y_ptr, M, g, r_in, stride_ym, stride_yg, NW, BLOCK_R, BLOCK_M)

    # The ring kernel's weight decode (round 6), four codes per call: a PRMT spreads two e4m3 bytes into
    # the two halves of a register with their sign bytes, a shift and a mask put sign, exponent and
    # mantissa where bf16 keeps them (the value is then the e4m3 value times 2**-120, a bf16 subnormal
    # for e4m3 subnormals and exactly zero for zero), and one bf16x2 multiply by 2**(e - 7) (the block
    # scale times 2**120, exact) gives the weight. Integer and fma pipes only: the cvt path it replaces
    # (e4m3 -> f16 -> f32 -> bf16) ran two conversion-pipe instructions per weight pair at 16 per clock
    # per SM, about 4 us per call at G=4 on the H200, as long as the read itself.
    DECODE_ASM = gl.constexpr("""{
    .reg .b32 p, q, z;
    mov.b32 z, 0x80008000;
    prmt.b32 p, $2, 0, 0x9180;
    shl.b32 p, p, 4;
    and.b32 p, p, 0x87F087F0;
    fma.rn.bf16x2 $0, p, $3, z;
    prmt.b32 q, $2, 0, 0xB3A2;
    shl.b32 q, q, 4;
    and.b32 q, q, 0x87F087F0;
    fma.rn.bf16x2 $1, q, $3, z;
    }""")

    @gluon.jit
    def _decode(codes, scale):
        """e4m3 codes (uint8) and bf16x2 words of 2**(e - 7) -> the bf16 weights, exactly."""
        return gl.inline_asm_elementwise(DECODE_ASM, "=r,=r,r,r,r,r,r", [codes, scale], dtype=gl.bfloat16,
                                         is_pure=True, pack=4)

    # Programmatic dependent launch (sm_90+): let the next kernel's programs start now, and wait for the
    # previous kernel's writes (x) to be visible. Both are no-ops when the launch is not a PDL launch.
    GDC_ASM = gl.constexpr("griddepcontrol.launch_dependents; griddepcontrol.wait; mov.u32 $0, 0;")

    @gluon.jit
    def _ring_issue_w(wsm, w_ptrs, st: gl.constexpr, S: gl.constexpr, SB: gl.constexpr):
        """cp.async of stage st's weights (SB K blocks) into its ring slots; each thread copies exactly
        the 16-byte pieces it will read back."""
        for j in gl.static_range(SB):
            _async_load(wsm[(st % S) * SB + j], w_ptrs + (st * SB + j) * 512)

    @gluon.jit
    def _ring_issue_x(xsm, x_ptrs, x_mask, st: gl.constexpr, S: gl.constexpr, SB: gl.constexpr):
        """cp.async of stage st's x (SB K blocks) into its ring slots, padding tokens zero-filled."""
        for j in gl.static_range(SB):
            _async_load(xsm[(st % S) * SB + j], x_ptrs + (st * SB + j) * 32, mask=x_mask)

    @gluon.jit
    def _ring_issue(wsm, xsm, w_ptrs, x_ptrs, x_mask, st: gl.constexpr, S: gl.constexpr, SB: gl.constexpr):
        _ring_issue_w(wsm, w_ptrs, st, S, SB)
        _ring_issue_x(xsm, x_ptrs, x_mask, st, S, SB)

    @gluon.jit
    def _wo_a_ring_kernel(
        x_ptr, w_ptr, e_ptr, y_ptr,
        M, R,
        stride_xm, stride_xg, stride_ym, stride_yg,
        D: gl.constexpr, NW: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_R: gl.constexpr, S: gl.constexpr,
        SB: gl.constexpr, PDL: gl.constexpr = False, RH: gl.constexpr = 1,
    ):
        """Weights from the lane-ordered tiles (:func:`pack_tiles`) and x stream through an S-stage
        cp.async ring in shared memory, one allocation per slot (so Triton's barrier analysis needs one
        barrier per stage, not three); exponents (int32 words, 4 K blocks each) are copied once.
        Each K block: one 16-byte LDS of weights and one of x per thread, the integer decode above,
        two mma.sync accumulating into one of two fp32 accumulators (even and odd blocks); the
        accumulators and the NW warps are summed once, in a fixed order: bitwise reproducible.
        With PDL (a programmatic dependent launch, round 7) the weights of the first S - 1 stages are
        requested before the wait for the previous kernel, x after it; the results are the same bits."""
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[NW, RH, 1],
                                                      instr_shape=[1, 16, 8])
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=8)
        b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=8)
        # weights as stored: [warp slice, 16-row tile * 32 + lane, the lane's 16 bytes]
        lane_l: gl.constexpr = gl.BlockedLayout([1, 1, 16], [1, 32, 1], [NW, RH, 1], [2, 1, 0])
        RT: gl.constexpr = BLOCK_R // 16
        KPW: gl.constexpr = D // NW
        NST: gl.constexpr = KPW // (32 * SB)
        NWORDS: gl.constexpr = KPW // 128

        g, r_in, row0 = _program_rows(R, BLOCK_R)

        sw = gl.expand_dims(gl.expand_dims(gl.arange(0, NW, layout=gl.SliceLayout(1, gl.SliceLayout(2, lane_l))), 1), 2)
        qw = gl.expand_dims(gl.expand_dims(gl.arange(0, RT * 32, layout=gl.SliceLayout(0, gl.SliceLayout(2, lane_l))),
                                           0), 2)
        bw = gl.expand_dims(gl.expand_dims(gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, lane_l))), 0), 1)
        w_ptrs = (w_ptr + row0.to(gl.int64) * D) + ((qw // 32) * (16 * D) + sw * (KPW * 16) + (qw % 32) * 16 + bw)

        x_ptrs, x_mask = _x_block(x_ptr, M, g, stride_xm, stride_xg, b_l, NW, KPW, BLOCK_M)

        e_base = e_ptr + (row0 // 32) * (D // 128) + sw * NWORDS

        flat: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[2, 1, 0])
        k_fast: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 2, 0])
        wsm = ()
        xsm = ()
        for q in gl.static_range(S * SB):
            wsm = wsm + (gl.allocate_shared_memory(gl.uint8, [NW, RT * 32, 16], flat),)
            xsm = xsm + (gl.allocate_shared_memory(gl.bfloat16, [NW, 32, BLOCK_M], k_fast),)
        esm = gl.allocate_shared_memory(gl.int32, [NWORDS, NW, 1, 1], flat)
        for q in gl.static_range(NWORDS):
            _async_load(esm.index(q), e_base + q)
        if PDL:
            # weights and exponents are constants: the first S - 1 stages of weights are requested before
            # waiting for the previous kernel, whose programs may still run (x is its output). Groups
            # W0..W(S-2), X0..X(S-2), then one per loop iteration: stage i's x still has S - 2 groups
            # after it at iteration i, so the loop's wait_group(S - 2) holds as in the plain order.
            for st in gl.static_range(S - 1):
                if st < NST:
                    _ring_issue_w(wsm, w_ptrs, st, S, SB)
                async_copy.commit_group()
            gl.inline_asm_elementwise(GDC_ASM, "=r", [], dtype=gl.int32, is_pure=False, pack=1)
            for st in gl.static_range(S - 1):
                if st < NST:
                    _ring_issue_x(xsm, x_ptrs, x_mask, st, S, SB)
                async_copy.commit_group()
        else:
            for st in gl.static_range(S - 1):
                if st < NST:
                    _ring_issue(wsm, xsm, w_ptrs, x_ptrs, x_mask, st, S, SB)
                async_copy.commit_group()

        acc0 = gl.zeros([NW, BLOCK_R, BLOCK_M], gl.float32, layout=mma)
        acc1 = gl.zeros([NW, BLOCK_R, BLOCK_M], gl.float32, layout=mma)
        for i in gl.static_range(NST):
            # stage i has landed, and every warp is done with the slots stage i + S - 1 overwrites
            async_copy.wait_group(S - 2)
            _barrier()
            if i + S - 1 < NST:
                _ring_issue(wsm, xsm, w_ptrs, x_ptrs, x_mask, i + S - 1, S, SB)
            async_copy.commit_group()
            for j in gl.static_range(SB):
                if (i * SB + j) % 4 == 0:  # one int32 word holds the exponents of 4 K blocks
                    word = esm.index((i * SB + j) // 4).load(lane_l)
                scale = ((word >> (8 * ((i * SB + j) % 4))) & 255) * 0x00800080 + 0x3C003C00  # bf16x2 2**(e-7)
                wb = _decode(wsm[(i % S) * SB + j].load(lane_l), scale)
                # lane (g, t) holds rows g and g + 8 of each 16-row tile, K 8t..8t+7: the mma operand
                wb = gl.reshape(gl.permute(gl.reshape(wb, [NW, RT, 8, 4, 2, 8]), [0, 1, 4, 2, 3, 5]),
                                [NW, BLOCK_R, 32])
                wb = gl.convert_layout(wb, a_l, assert_trivial=True)
                xt = xsm[(i % S) * SB + j].load(b_l)
                if (i * SB + j) % 2 == 0:
                    acc0 = mma_v2(wb, xt, acc0)
                else:
                    acc1 = mma_v2(wb, xt, acc1)

        _store_rows(acc0 + acc1, y_ptr, M, g, r_in, stride_ym, stride_yg, NW * RH, BLOCK_R, BLOCK_M)


def launch(x: torch.Tensor, twin, y: torch.Tensor, cfg: GluonConfig | RingConfig | None = None) -> torch.Tensor:
    """y = wo_a(x) on the gluon path; x, twin and y are validated by kernels.wo_a_w8.wo_a.

    Without ``cfg``: the ring kernel when x's strides allow it and a measured tiling fits the
    device's shared memory, else the register kernel (up to 16 rows)."""
    m, g, d = x.shape
    r = twin.rows
    if not available(x.device):
        raise ValueError("the gluon path needs a CUDA GPU of compute capability 8.9 or newer and Triton with Gluon")
    if cfg is None and ring_ok(x, twin):
        cfg = ring_config_for(m, g, r, d, x.device)
    if isinstance(cfg, RingConfig):
        if not cfg.fits(m, r, d):
            raise ValueError(f"{cfg} does not tile M={m}, R={r}, D={d}")
        if not ring_ok(x, twin):
            raise ValueError("the ring kernel needs x 16-byte aligned with token and group strides that are "
                             f"multiples of 16 elements, and block exponents up to {RING_EXP_MAX}")
        if cfg.pdl and _capability(x.device) < PDL_CAPABILITY:
            raise ValueError(f"a programmatic dependent launch needs compute capability {PDL_CAPABILITY} or newer")
        _launch_ring(x, twin, y, cfg, m)
        return y
    cfg = cfg or config_for(m, g, r, d, x.device)
    if not cfg.fits(m, r, d):
        raise ValueError(f"{cfg} does not tile M={m}, R={r}, D={d}")
    _wo_a_gluon_kernel[(g * (r // cfg.block_r),)](
        x, twin.values, twin.exponents, y, m, r, x.stride(0), x.stride(1), y.stride(0), y.stride(1),
        D=d, NW=cfg.num_warps, KW=cfg.k_width, BLOCK_M=cfg.block_m, BLOCKS=cfg.blocks, BLOCK_R=cfg.block_r,
        num_warps=cfg.num_warps)
    return y


def _launch_ring(x: torch.Tensor, twin, y: torch.Tensor, cfg: RingConfig, m: int) -> None:
    """The ring kernel's launch, validated by :func:`launch`; tokens m.. of the tile are zero-filled
    and not stored (benchmarks/wo_a_x_traffic.py launches it with a smaller m than x has)."""
    _, g, d = x.shape
    r = twin.rows
    _wo_a_ring_kernel[(g * (r // cfg.block_r),)](
        x, twin.tiles(), twin.exponents.view(torch.int32), y, m, r, x.stride(0), x.stride(1), y.stride(0),
        y.stride(1), D=d, NW=cfg.num_warps, BLOCK_M=cfg.block_m, BLOCK_R=cfg.block_r, S=cfg.stages, SB=cfg.sb,
        PDL=cfg.pdl, RH=cfg.row_warps, num_warps=cfg.num_warps * cfg.row_warps, launch_pdl=cfg.pdl)
