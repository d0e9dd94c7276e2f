# Over 600 lines on purpose: the twin format, the dispatcher and its measured tables are one public API; the ring
# and tensor-core kernels are in wo_a_gluon.py and wo_a_tc.py.
"""fp8 "twins" of the ``wo_a`` weights and the Triton kernels that read them.

``wo_a`` computes, per layer and rank, ``y[t, g, :] = W[g] @ x[t, g, :]``
(``torch.einsum("tgd,grd->tgr", x, W)``) with W bf16 ``[G, 1024, 4096]``, x bf16 ``[M, G, 4096]``
and y bf16 ``[M, G, 1024]``. Decode reads all of W for a handful of rows, so the call is bound by
the bytes of W. A twin holds W as e4m3 values plus one power-of-two scale per 32x32 block (stored as
the uint8 exponent ``e + 127``); it is only built when it reproduces the bf16 weight bit for bit, so
the kernels compute the same products as the einsum from half the bytes.

Public API: :class:`Twin`, :func:`build_twin`, :func:`twin_from_checkpoint`, :func:`twin_weights`,
:func:`dequantize`, :func:`wo_a`, :func:`select_path`, :func:`einsum_is_faster`, :class:`KernelConfig`.

Paths (see :func:`select_path`): ``gluon`` for 1..16 rows on sm_89+ GPUs (kernels/wo_a_gluon.py: a
cp.async ring streams lane-ordered tiles of the weights and x through shared memory into mma.sync;
where x's strides or block scales above 2**7 do not allow it, 1..8 rows load the weights straight into
the operand registers and 9..16 run ``mid``), ``small`` for 1..8 rows elsewhere and
under the CPU interpreter (split-K with a deterministic two-level reduction; one row uses a CUDA-core
variant, more rows the tensor cores with the block scales applied to fp32 partial sums), ``mid`` for
9..192 rows (per-M tile configurations), ``einsum`` otherwise (prefill, or no GPU). Issue 26: on
sm_89+ GPUs 17..:data:`WIDE_MAX_M` rows run ``wide`` (the same ring kernel with 32/64-token tiles, one
launch per tile, :data:`WIDE_TABLE`; 17..32 rows on the H200), and the einsum path without the bf16
weight (DROP) dequantises one group at a time into a bounded scratch and multiplies with cuBLAS
(:func:`dequantize_group`); a kernel that cannot compile or launch on a GPU is logged once and the
next path serves. On GPUs where the bf16 einsum measured faster (:data:`EINSUM_FASTER`) a caller that
passes the bf16 weight gets the einsum for those rows. Every path accumulates in fp32 in a fixed
order: results are bitwise reproducible run to run. Issue 26, fifth session: on sm_90 GPUs the rows of
:data:`WG_TABLE` run ``wg`` (kernels/wo_a_wg.py: a Gluon wgmma kernel fed by a TMA/mbarrier ring), also
prefill rows without the bf16 weight. Measurements: docs/kernels.md.

This package imports nothing from the project: it ships as a plain package in the engine image.
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Mapping

import torch
import triton
import triton.language as tl

from . import wo_a_gluon as _gluon
from . import wo_a_tc as _tc
from . import wo_a_wg as _wg
from .wo_a_gluon import GluonConfig, RingConfig
from .wo_a_wg import WgConfig
from .wo_a_tc import TcConfig, exponent_words, mma_step, store_tile, tile_origin, token_ptrs, weight_ptrs

__all__ = [
    "BLOCK",
    "GluonConfig",
    "EXP_MAX",
    "EXP_MIN",
    "KernelConfig",
    "MID_MAX_M",
    "NotTwinnableError",
    "PREFILL_BATCHED",
    "SMALL_MAX_M",
    "TC_TABLE",
    "TcConfig",
    "Twin",
    "build_twin",
    "dequantize",
    "default_config",
    "dequantize_group",
    "einsum_is_faster",
    "prefill",
    "select_path",
    "tc_config",
    "twin_from_checkpoint",
    "twin_weights",
    "WG_TABLE",
    "WgConfig",
    "WIDE_MAX_M",
    "wg_config",
    "wide_config",
    "wo_a",
]

LOG = logging.getLogger("wo_a_w8")

BLOCK = 32
"""Edge of the square weight block that shares one power-of-two scale."""

EXP_MIN = 10
EXP_MAX = 246
"""Accepted stored exponents (``e + 127``). Inside this range every e4m3 value times its scale is a
finite, normal bf16 number (448 * 2**119 < bf16 max; 2**-9 * 2**-117 = 2**-126), so a dequantised
twin is exact and no kernel intermediate can overflow or flush to zero where the einsum would not."""

SMALL_MAX_M = 8
MID_MAX_M = 192

_E4M3_MAX = 448.0
_E4M3_NAN_BITS = 0x7F  # e4m3fn has no infinities; S.1111.111 is NaN


class NotTwinnableError(ValueError):
    """The bf16 weight has no bit-exact fp8 twin; it stays on bf16."""


# --------------------------------------------------------------------------------------------
# Twin format
# --------------------------------------------------------------------------------------------


def _semaphore_count(groups: int, rows: int) -> int:
    # One counter per output tile of a split-K launch: at most G * (R / 32) * ceil(1024 / 16) (the tc
    # path's split-K tilings stop at 1024 rows; 32 KB per twin at G=4)
    return groups * (rows // BLOCK) * (1024 // 16)


@dataclass(frozen=True, eq=False)
class Twin:
    """fp8 twin of one ``wo_a`` weight.

    ``values``: float8_e4m3fn ``[G, R, D]``; ``exponents``: uint8 ``[G, R/32, D/32]``;
    weight = values * 2**(exponents - 127), block-wise. Construction validates everything a kernel
    relies on and raises ``ValueError`` otherwise. ``semaphores`` are the split-K counters of this
    weight; they reset themselves after every launch, so one twin must not run on two streams at once.
    """

    values: torch.Tensor
    exponents: torch.Tensor
    semaphores: torch.Tensor = field(init=False, repr=False, compare=False)
    max_exponent: int = field(init=False, repr=False, compare=False)
    _tiles: torch.Tensor | None = field(init=False, default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        v, e = self.values, self.exponents
        if not isinstance(v, torch.Tensor) or not isinstance(e, torch.Tensor):
            raise ValueError("Twin needs torch tensors for values and exponents")
        if v.dtype != torch.float8_e4m3fn:
            raise ValueError(f"twin values must be torch.float8_e4m3fn, got {v.dtype}")
        if e.dtype != torch.uint8:
            raise ValueError(f"twin exponents must be torch.uint8 (e + 127), got {e.dtype}")
        if v.dim() != 3 or v.shape[1] % BLOCK or v.shape[2] % BLOCK or v.numel() == 0:
            raise ValueError(f"twin values must be [G, R, D] with R and D multiples of {BLOCK}, got {tuple(v.shape)}")
        g, r, d = v.shape
        if tuple(e.shape) != (g, r // BLOCK, d // BLOCK):
            raise ValueError(f"twin exponents must be {(g, r // BLOCK, d // BLOCK)} for values {tuple(v.shape)}, "
                             f"got {tuple(e.shape)}")
        if v.device != e.device:
            raise ValueError(f"twin values on {v.device} but exponents on {e.device}")
        if not v.is_contiguous() or not e.is_contiguous():
            raise ValueError("twin values and exponents must be contiguous")
        # the kernels read 16-byte vectors of values and int32 words of exponents
        if v.data_ptr() % 16:
            object.__setattr__(self, "values", v := v.clone())
        if e.data_ptr() % 16:
            object.__setattr__(self, "exponents", e := e.clone())
        lo, hi = int(e.min()), int(e.max())
        if lo < EXP_MIN or hi > EXP_MAX:
            raise ValueError(f"twin exponents span [{lo}, {hi}], outside the supported [{EXP_MIN}, {EXP_MAX}] "
                             f"(scales 2**{EXP_MIN - 127} .. 2**{EXP_MAX - 127}); keep this weight on bf16")
        object.__setattr__(self, "max_exponent", hi)
        nan_codes = int(((v.view(torch.uint8) & 0x7F) == _E4M3_NAN_BITS).sum())
        if nan_codes:
            raise ValueError(f"twin values hold {nan_codes} NaN codes; keep this weight on bf16")
        object.__setattr__(self, "semaphores", torch.zeros(_semaphore_count(g, r), dtype=torch.int32, device=v.device))

    def tiles(self) -> torch.Tensor:
        """The value bytes in the ring kernel's lane order (:func:`kernels.wo_a_gluon.pack_tiles`), built
        on first use and kept: one more byte per weight on the device, read instead of ``values``."""
        if self._tiles is None:
            object.__setattr__(self, "_tiles", _gluon.pack_tiles(self.values.view(torch.uint8)))
        return self._tiles

    @property
    def groups(self) -> int:
        return self.values.shape[0]

    @property
    def rows(self) -> int:
        return self.values.shape[1]

    @property
    def cols(self) -> int:
        return self.values.shape[2]

    @property
    def device(self) -> torch.device:
        return self.values.device

    @property
    def nbytes(self) -> int:
        return self.values.numel() + self.exponents.numel()


def _pow2(exponents: torch.Tensor) -> torch.Tensor:
    """2**(e - 127) as float32, built from the bits (exact for 1 <= e <= 254)."""
    return (exponents.to(torch.int32) << 23).view(torch.float32)


def _expand_blocks(t: torch.Tensor) -> torch.Tensor:
    """[G, R/32, D/32] -> [G, R/32, 1, D/32, 1], to broadcast over [G, R/32, 32, D/32, 32]."""
    return t[:, :, None, :, None]


def _blocked(w: torch.Tensor) -> torch.Tensor:
    g, r, d = w.shape
    return w.view(g, r // BLOCK, BLOCK, d // BLOCK, BLOCK)


def dequantize(twin: Twin) -> torch.Tensor:
    """The bf16 weight ``[G, R, D]`` a twin stands for (exact)."""
    w = _blocked(twin.values).to(torch.float32) * _expand_blocks(_pow2(twin.exponents))
    return w.reshape(twin.values.shape).to(torch.bfloat16)


def _check_weight(weight: torch.Tensor) -> None:
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    if weight.dtype != torch.bfloat16:
        raise ValueError(f"weight must be torch.bfloat16, got {weight.dtype}")
    if weight.dim() != 3 or weight.shape[1] % BLOCK or weight.shape[2] % BLOCK or weight.numel() == 0:
        raise ValueError(f"weight must be [G, R, D] with R and D multiples of {BLOCK}, got {tuple(weight.shape)}")


def build_twin(weight: torch.Tensor) -> Twin:
    """Build the fp8 twin of a bf16 ``[G, R, D]`` weight, or raise :class:`NotTwinnableError`.

    Per 32x32 block the scale is the smallest power of two 2**k with amax <= 448 * 2**k; any other
    exact choice would need a larger k for the same block, so this one is exact whenever one is.
    The result is dequantised and compared with the weight bit for bit before it is returned.
    """
    _check_weight(weight)
    w = weight.contiguous()
    blocks = _blocked(w).to(torch.float32)
    amax = blocks.abs().amax(dim=(2, 4))
    if not bool(torch.isfinite(amax).all()):
        raise NotTwinnableError("weight holds NaN or Inf values")
    mant, expo = torch.frexp(amax)  # amax = mant * 2**expo, 0.5 <= mant < 1
    # amax <= 0.875 * 2**(9 + k)  <=>  k >= expo - 9 (+1 when mant > 0.875)
    k = expo - 9 + (mant > 0.875).to(expo.dtype)
    k = torch.where(amax == 0, torch.zeros_like(k), k)
    stored = k + 127
    lo, hi = int(stored.min()), int(stored.max())
    if lo < EXP_MIN or hi > EXP_MAX:
        raise NotTwinnableError(f"block scales need exponents [{lo}, {hi}], outside [{EXP_MIN}, {EXP_MAX}]")
    exponents = stored.to(torch.uint8)
    inv = _pow2(254 - stored)  # 2**-k
    values = (blocks * _expand_blocks(inv)).reshape(w.shape).to(torch.float8_e4m3fn)
    back = (_blocked(values).to(torch.float32) * _expand_blocks(_pow2(exponents))).reshape(w.shape)
    mismatch = back.to(torch.bfloat16).view(torch.int16) != w.view(torch.int16)
    bad = int(mismatch.sum())
    if bad:
        bad_blocks = int(_blocked(mismatch).any(dim=4).any(dim=2).sum())
        raise NotTwinnableError(f"{bad} of {w.numel()} values ({bad_blocks} of {amax.numel()} 32x32 blocks) "
                                f"are not exactly representable as e4m3 times a power-of-two block scale")
    return Twin(values.contiguous(), exponents.contiguous())


def twin_from_checkpoint(weight_fp8: torch.Tensor, block_scale: torch.Tensor, groups: int | None = None) -> Twin:
    """Twin from a checkpoint's fp8 weight and its per-32x32-block scales.

    ``weight_fp8``: float8_e4m3fn ``[G, R, D]`` (or ``[G*R, D]`` with ``groups``). ``block_scale``:
    ``[G, R/32, D/32]`` (or the matching 2-D form) as uint8 stored exponents (e + 127), float8_e8m0fnu,
    or float32/bfloat16/float16 exact powers of two.
    """
    if not isinstance(weight_fp8, torch.Tensor) or not isinstance(block_scale, torch.Tensor):
        raise ValueError("weight_fp8 and block_scale must be torch tensors")
    if weight_fp8.dtype != torch.float8_e4m3fn:
        raise ValueError(f"weight_fp8 must be torch.float8_e4m3fn, got {weight_fp8.dtype}")
    if weight_fp8.dim() == 2:
        if not groups or weight_fp8.shape[0] % groups:
            raise ValueError(f"a 2-D weight {tuple(weight_fp8.shape)} needs groups= dividing its rows")
        weight_fp8 = weight_fp8.reshape(groups, weight_fp8.shape[0] // groups, weight_fp8.shape[1])
    if weight_fp8.dim() != 3 or weight_fp8.shape[1] % BLOCK or weight_fp8.shape[2] % BLOCK:
        raise ValueError(f"weight_fp8 must be [G, R, D] with R, D multiples of {BLOCK}, got {tuple(weight_fp8.shape)}")
    g, r, d = weight_fp8.shape
    want = (g, r // BLOCK, d // BLOCK)
    if block_scale.numel() != math.prod(want):
        raise ValueError(f"block_scale must hold {want} scales for weight {tuple(weight_fp8.shape)}, "
                         f"got {tuple(block_scale.shape)}")
    scale = block_scale.reshape(want)
    if scale.dtype == torch.uint8:
        exponents = scale
    elif scale.dtype == getattr(torch, "float8_e8m0fnu", None):
        exponents = scale.view(torch.uint8)  # e8m0 is the biased exponent itself (0xFF = NaN)
    elif scale.dtype in (torch.float32, torch.bfloat16, torch.float16):
        s = scale.to(torch.float32)
        if not bool((torch.isfinite(s) & (s > 0)).all()):
            raise ValueError("block_scale holds non-positive or non-finite scales")
        mant, expo = torch.frexp(s)
        if not bool((mant == 0.5).all()):
            raise ValueError("block_scale holds scales that are not powers of two")
        stored = expo - 1 + 127
        if int(stored.min()) < 0 or int(stored.max()) > 255:
            raise ValueError("block_scale exponents do not fit in a uint8")
        exponents = stored.to(torch.uint8)
    else:
        raise ValueError(f"block_scale dtype {scale.dtype} is not supported (uint8 exponents, float8_e8m0fnu, "
                         f"or float powers of two)")
    return Twin(weight_fp8.contiguous(), exponents.to(weight_fp8.device).contiguous())


def twin_weights(weights: Mapping[str, torch.Tensor]) -> tuple[dict[str, Twin], dict[str, str]]:
    """Twin every weight that allows it; return ``(twins, kept_on_bf16)`` (name -> reason) and log the
    adapter's marker line."""
    twins: dict[str, Twin] = {}
    kept: dict[str, str] = {}
    for name, weight in weights.items():
        try:
            twins[name] = build_twin(weight)
        except NotTwinnableError as exc:
            kept[name] = str(exc)
    LOG.info("[wo_a_w8] fp8 twins for %d wo_a weights, %d left on bf16", len(twins), len(kept))
    for name, reason in kept.items():
        LOG.info("[wo_a_w8] %s stays on bf16: %s", name, reason)
    return twins, kept


# --------------------------------------------------------------------------------------------
# Kernel
# --------------------------------------------------------------------------------------------


@triton.jit
def _wo_a_kernel(
    x_ptr, w_ptr, e_ptr, y_ptr, ws_ptr, sem_ptr,
    M, R, D, k_per_split, split_k,
    stride_xm, stride_xg, stride_ym, stride_yg,
    BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_SPLIT: tl.constexpr, BF16_SCALE: tl.constexpr, SWAP_AB: tl.constexpr, FMA: tl.constexpr,
    INTERPRET: tl.constexpr, SPLIT: tl.constexpr,
):
    """One program: rows [r0, r0 + BLOCK_R) of group g, tokens [m0, m0 + BLOCK_M), and one K range.

    The weight tile is read as [NSUB, 32, NKB, 32] so each 32x32 block meets its own scale through a
    broadcast; dequantisation is exact, so the dot sees the original bf16 weight. SWAP_AB computes
    x @ W^T instead of W @ x^T: the weight then goes to shared memory as the B operand (wgmma, many
    rows) instead of being reshuffled in registers as the A operand (mma.sync, few rows). FMA skips
    the tensor cores: a broadcast multiply and an in-register reduction, cheap when M is 1..4."""
    NSUB: tl.constexpr = BLOCK_R // 32
    NKB: tl.constexpr = BLOCK_K // 32
    pid_m = tl.program_id(0)
    pid_gr = tl.program_id(1)
    pid_k = tl.program_id(2)
    g, r0, k0 = tile_origin(pid_gr, pid_k, R, BLOCK_R, k_per_split)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    j4 = tl.arange(0, NSUB)[:, None, None, None]
    i4 = tl.arange(0, 32)[None, :, None, None]
    b4 = tl.arange(0, NKB)[None, None, :, None]
    c4 = tl.arange(0, 32)[None, None, None, :]

    w_ptrs = weight_ptrs(w_ptr, g, r0 + j4 * 32 + i4, R, D, k0, b4 * 32 + c4)
    # Scales are read as int32 words (four exponents each): byte loads are not pipelined by Triton and
    # would stall every iteration for a full memory latency; words ride the cp.async pipeline.
    NW: tl.constexpr = NKB // 4
    j3 = tl.arange(0, NSUB)[:, None, None]
    w3 = tl.arange(0, NW)[None, :, None]
    sh3 = tl.arange(0, 4)[None, None, :] * 8
    e_ptrs = exponent_words(e_ptr, g, r0 + j3 * 32, R, D, k0) + w3
    m_mask = offs_m[:, None] < M
    x_ptrs = token_ptrs(x_ptr, offs_m, stride_xm, g, stride_xg, k0, offs_k)

    if SWAP_AB and not FMA:
        acc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_R, BLOCK_M], dtype=tl.float32)
    for _ in range(0, k_per_split, BLOCK_K):
        w8 = tl.load(w_ptrs)
        ex = (tl.load(e_ptrs) >> sh3) & 0xFF
        xt = tl.load(x_ptrs, mask=m_mask, other=0.0)
        scale = (ex << 23).to(tl.float32, bitcast=True)
        scale = tl.reshape(scale, [NSUB, 1, NKB, 1])
        if BF16_SCALE and not INTERPRET:
            # the interpreter's bf16 arithmetic is unreliable; on the GPU this saves a conversion
            wd = w8.to(tl.bfloat16) * scale.to(tl.bfloat16)
        else:
            wd = w8.to(tl.float32) * scale
        wd = tl.reshape(wd, [BLOCK_R, BLOCK_K])
        if FMA:
            prod = tl.reshape(wd, [BLOCK_R, 1, BLOCK_K]) * tl.reshape(xt.to(tl.float32), [1, BLOCK_M, BLOCK_K])
            acc += tl.sum(prod, axis=2)
        else:
            # the decoded tile is exact in bf16 (e4m3 times a power of two); mma_step holds the dot
            # and the CPU interpreter's fp32 variant, shared with the tc kernels
            acc = mma_step(acc, wd.to(tl.bfloat16), xt, not SWAP_AB, INTERPRET)
        w_ptrs += BLOCK_K
        e_ptrs += NW
        x_ptrs += BLOCK_K

    if SWAP_AB and not FMA:
        acc = tl.trans(acc)
    store_tile(acc, y_ptr, ws_ptr, sem_ptr, M, split_k, stride_ym, stride_yg, g, r0, offs_m, pid_gr, pid_m, pid_k,
                BLOCK_M, BLOCK_R, USE_SPLIT, SPLIT)


@triton.jit
def _wo_a_acc_kernel(
    x_ptr, w_ptr, e_ptr, y_ptr, ws_ptr, sem_ptr,
    M, R, D, k_per_split, split_k,
    stride_xm, stride_xg, stride_ym, stride_yg,
    BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_SPLIT: tl.constexpr, SWAP_AB: tl.constexpr, INTERPRET: tl.constexpr, SPLIT: tl.constexpr,
):
    """Round-2 kernel: the block scale is applied to the fp32 partial sums, not to the weights.

    For every 32-wide K block the dot sees the raw e4m3 values (converted to bf16, exact) and the
    program multiplies that block's fp32 partial [BLOCK_R, BLOCK_M] by the power-of-two scale of its
    32-row block before adding it to the accumulator (one FMA per partial element). Scaling by a power
    of two is exact (short of a partial underflowing fp32), so the products are those of the einsum on
    the dequantised weight; only the fixed summation grouping differs. The weight tile goes global -> shared (cp.async) -> dot-operand registers with no reshape,
    no fp32 round trip and no bf16 store to shared memory."""
    NKB: tl.constexpr = BLOCK_K // 32
    NW: tl.constexpr = NKB // 4
    pid_m = tl.program_id(0)
    pid_gr = tl.program_id(1)
    pid_k = tl.program_id(2)
    g, r0, k0 = tile_origin(pid_gr, pid_k, R, BLOCK_R, k_per_split)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_r = tl.arange(0, BLOCK_R)
    offs_c = tl.arange(0, 32)
    w_ptrs = weight_ptrs(w_ptr, g, (r0 + offs_r)[:, None], R, D, k0, offs_c[None, :])
    x_ptrs = token_ptrs(x_ptr, offs_m, stride_xm, g, stride_xg, k0, offs_c)
    m_mask = offs_m[:, None] < M
    # one int32 word holds the exponents of four consecutive K blocks of one 32-row block
    e_ptrs = exponent_words(e_ptr, g, r0 + offs_r, R, D, k0)

    if SWAP_AB:
        acc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_R, BLOCK_M], dtype=tl.float32)
    for _ in range(0, k_per_split, BLOCK_K):
        for wi in tl.static_range(NW):
            word = tl.load(e_ptrs + wi)
            for b in tl.static_range(4):
                j = wi * 4 + b
                w8 = tl.load(w_ptrs + j * 32, eviction_policy="evict_first")
                xt = tl.load(x_ptrs + j * 32, mask=m_mask, other=0.0)
                scale = (((word >> (8 * b)) & 0xFF) << 23).to(tl.float32, bitcast=True)
                if INTERPRET:
                    # the CPU interpreter's bf16 dot is unreliable; these operands are exact in fp32
                    if SWAP_AB:
                        part = tl.dot(xt.to(tl.float32), tl.trans(w8.to(tl.float32)), input_precision="ieee")
                    else:
                        part = tl.dot(w8.to(tl.float32), tl.trans(xt.to(tl.float32)), input_precision="ieee")
                elif SWAP_AB:
                    part = tl.dot(xt, tl.trans(w8.to(tl.bfloat16)))
                else:
                    part = tl.dot(w8.to(tl.bfloat16), tl.trans(xt))
                if SWAP_AB:
                    acc += part * scale[None, :]
                else:
                    acc += part * scale[:, None]
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
        e_ptrs += NW

    if SWAP_AB:
        acc = tl.trans(acc)
    store_tile(acc, y_ptr, ws_ptr, sem_ptr, M, split_k, stride_ym, stride_yg, g, r0, offs_m, pid_gr, pid_m, pid_k,
                BLOCK_M, BLOCK_R, USE_SPLIT, SPLIT)


# --------------------------------------------------------------------------------------------
# Configurations and dispatch
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelConfig:
    """Tile shape and launch parameters of one kernel launch."""

    block_m: int
    block_r: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    bf16_scale: bool = False
    swap_ab: bool = False
    fma: bool = False
    acc_scale: bool = False  # round-2 kernel: block scales applied to fp32 partials (_wo_a_acc_kernel)

    def fits(self, rows: int, cols: int) -> bool:
        """Whether these tiles divide an R x D weight exactly (the kernel has no R/K masks)."""
        if self.block_m < 1 or self.block_m & (self.block_m - 1) or self.block_k % _K_WORD:
            return False
        if self.block_r % BLOCK or self.split_k < 1:
            return False
        if self.block_m < (1 if self.fma else 16):
            return False  # tl.dot needs 16 rows; the FMA variant takes any power of two
        if self.acc_scale and (self.fma or self.bf16_scale):
            return False  # the round-2 kernel has neither variant
        return rows % self.block_r == 0 and cols % (self.block_k * self.split_k) == 0


# Tuned on an NVIDIA H200 (docs/kernels.md, benchmarks/wo_a_bench.py --sweep; round 2): per bucket of
# M, (largest M, tiles, programs per SM). split_k is derived from the SM count: the largest power of two
# that keeps G * (R / block_r) * ceil(M / block_m) * split_k <= programs_per_sm * SMs and stays at or
# below the table's split_k when that is above 1 (else 16), so the same table sizes the launch for
# G=2 (TP4), G=4 (TP3) and for a GPU with fewer SMs (GB10: 48). On the H200 this gives the measured
# configurations: 2..16 rows split 16 at both G (1024 / 512 programs), 32 rows split 4 (G=4) / 8 (G=2).
_ACC16 = KernelConfig(block_m=16, block_r=64, block_k=128, split_k=16, num_warps=4, num_stages=2, acc_scale=True)
_TABLES: dict[str, tuple[tuple[int, KernelConfig, float], ...]] = {
    "small": (
        (1, KernelConfig(block_m=1, block_r=32, block_k=128, num_warps=8, num_stages=1, fma=True), 8.0),
        (SMALL_MAX_M, _ACC16, 8.0),
    ),
    "mid": (
        (16, _ACC16, 8.0),
        (32, KernelConfig(block_m=32, block_r=64, block_k=128, num_warps=4, num_stages=3, swap_ab=True,
                          acc_scale=True), 2.0),
        (64, KernelConfig(block_m=64, block_r=64, block_k=128, num_warps=4, num_stages=3), 2.0),
        (128, KernelConfig(block_m=128, block_r=64, block_k=128, num_warps=8, num_stages=4, swap_ab=True), 1.0),
        (MID_MAX_M, KernelConfig(block_m=128, block_r=64, block_k=128, num_warps=8, num_stages=4), 1.0),
    ),
}
_K_WORD = 4 * BLOCK  # the kernel reads the exponents as int32 words: K tiles are multiples of 128


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8  # interpreter: small grids keep CPU tests quick


def select_path(m: int, groups: int, device: torch.device | str = "cuda") -> str:
    """``"gluon"`` (1..16 rows on an sm_89+ GPU), ``"wide"`` (17..WIDE_MAX_M rows there: the ring kernel
    with 32/64-token tiles), ``"tc"`` (the rows of :data:`TC_TABLE`: tensor-core tiles, one launch),
    ``"wg"`` (the rows of :data:`WG_TABLE` on sm_90: the Gluon wgmma kernel; above MID_MAX_M only
    without the bf16 weight), ``"small"`` (1..8 rows), ``"mid"`` (9..192 rows) or ``"einsum"`` (prefill, or no GPU; without the
    bf16 weight it dequantises into a scratch freed with the call: :func:`prefill`).

    Any group count is accepted: TP3 runs G=4 (the stock guard only took G=2)."""
    device = torch.device(device)
    if m < 1 or groups < 1:
        raise ValueError(f"wo_a needs at least one row and one group, got M={m}, G={groups}")
    if device.type != "cuda" and not _interpreting():
        return "einsum"
    if m <= _gluon.MAX_M and _gluon.available(device) and not _failed("gluon", device):
        return "gluon"
    if m <= _wide_max_m(groups, device) and _gluon.available(device) and not _failed("wide", device):
        return "wide"
    if _wg_entry(m, groups) is not None and _wg.available(device) and not _failed("wg", device):
        return "wg"
    return _after_wg(m, groups, device)


def _after_wg(m: int, groups: int, device: torch.device) -> str:
    """The path below ``wg`` (tc, mid, small or einsum): where wg cannot run or take this x."""
    if _tc_entry(m, groups) is not None and not _failed("tc", device):
        return "tc"
    if _failed("mid", device):
        return "einsum"
    if m <= SMALL_MAX_M:
        return "small"
    if m <= MID_MAX_M:
        return "mid"
    return "einsum"


# Where the bf16 einsum measured faster than the fp8 path the dispatcher runs (docs/kernels.md, rounds 2,
# 4 and issue 26, CUDA-graph replay, rotated weight sets): device-name substring -> inclusive M range, for
# G=2 and G=4. On these GPUs wo_a() runs the einsum when the caller still holds the bf16 weight (it reads
# twice the bytes, but the H200 has 5.6x GB10's bandwidth per SM-cycle and the kernels are latency-bound
# there). Not applied without the weight (DROP: then the fp8 path runs, slower from 33 rows on), nor
# elsewhere (GB10 is byte-bound: the twin's half-size read is the point). 1..16 rows run the gluon ring
# kernel (round 6) and 17..32 the wide path (issue 26), faster than the einsum there for G=2 and G=4;
# above MID_MAX_M the einsum path runs anyway. Issue 26, fifth session: the wg path beat the einsum by 1-6%
# at 48/64 rows (G=2; G=4 64 rows) across three H200 runs and lost at 96..192 (0.67-0.90x), so the range
# stays. Entries: (first M, last M, groups or None for any).
EINSUM_FASTER: dict[str, tuple[tuple[int, int, int | None], ...]] = {"H200": ((33, MID_MAX_M, None),)}


@lru_cache(maxsize=None)
def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def einsum_is_faster(m: int, device: torch.device | str = "cuda", groups: int | None = None) -> bool:
    """Whether, on this device, the bf16 einsum measured faster than the fp8 kernels for M rows (and
    this group count: some ranges hold for one G only)."""
    device = torch.device(device)
    if device.type != "cuda" or _interpreting():
        return False
    name = _device_name(device)
    return any(key in name and lo <= m <= hi and (g is None or g == groups)
               for key, ranges in EINSUM_FASTER.items() for lo, hi, g in ranges)


# Issue 26 (docs/kernels.md, Design): the ring kernel of 1..16 rows, unchanged, with 32- and 64-token
# tiles serves 17..WIDE_MAX_M rows as ceil(M / tile) launches (each reads the weights; from the second
# launch on they are mostly in L2). Per group count (other G: the G=4 table), per bucket of M: (largest M,
# ring tiling). Measured on the H200 (benchmarks/wo_a_wide_sweep.py, 8 rotated weight sets:
# docs/measurements/wo_a_issue26_wide_sweep.json): one 32-token launch, 6 stages, PDL; G=2 16-row programs
# (24 rows 7.95 us, 32 rows 8.30 us; einsum 10.76 / 9.16), G=4 32-row programs whose row halves share x
# (11.12 / 11.55 us; einsum 11.82 / 12.08).
WIDE_TABLE: dict[int, tuple[tuple[int, RingConfig], ...]] = {
    2: ((24, RingConfig(16, 32, 4, 2, 6, pdl=True, row_warps=1)),
        (32, RingConfig(16, 32, 4, 2, 6, pdl=True, row_warps=1))),
    4: ((24, RingConfig(32, 32, 4, 2, 6, pdl=True, row_warps=2)),
        (32, RingConfig(32, 32, 4, 2, 6, pdl=True, row_warps=2))),
}
WIDE_MAX_M: dict[int, int] = {2: 32, 4: 32}
"""Largest M (per group count; other G: the G=4 entry) that the dispatcher runs on the wide path: 32 at
G=2 and G=4 on the H200. From 48 rows on the mid kernels are faster than the best wide tiling (and at
G=2 48 rows within the sweep's noise), so mid serves 33..192 rows. Chosen by
``benchmarks/wo_a_wide_sweep.py --table-out`` (its ``wide_max_m``)."""


# Issue 26, the tc path (kernels/wo_a_tc.py): per group count (other G: the G=4 entry), inclusive M ranges
# served by one tensor-core tile launch, and its tiling. Chosen by benchmarks/wo_a_tc_sweep.py --big
# (choose_tables, from docs/measurements/wo_a_issue26_tc_sweep_big.json; H200, 8 rotated weight sets): a
# range leaves mid for tc only where its best tiling beat mid by more than 5%; a range already on tc keeps
# its tiling (timed in the same run) unless a new one beats it by more than 5% (none did). The incumbent
# tilings came from the --tma sweep (wo_a_issue26_tc_sweep_tma.json). The scale multiply runs in fp32
# (e4m3 -> fp32 -> bf16; round 4: e4m3 -> bf16 goes through f16 on the conversion pipe). ``tma``: the
# weight and x tiles come through tensor descriptors (the bulk tensor copy engine); x that a descriptor
# cannot read (strides not multiples of 8 elements, base not 16-byte aligned) runs the same tiling without
# them. G=2: 33..64 rows 11.1 us, 97..128 14.9, 129..192 18.3, 65..96 stays on mid (15.3; best tc 15.7);
# G=4: 33..64 15.1-15.2, 65..96 20.9 (mid 22.3; the --big sweep's first run: 21.0 vs 22.3), 97..128 21.3,
# 129..192 29.4.
TC_TABLE: dict[int, tuple[tuple[int, int, TcConfig], ...]] = {
    2: ((33, 64, TcConfig(64, 32, 128, 4, 4, 4, w_as_a=False, bf16_scale=False, tma=True)),
        (97, 128, TcConfig(64, 64, 128, 4, 4, 3, w_as_a=False, bf16_scale=False)),
        (129, 192, TcConfig(64, 64, 128, 4, 4, 3, w_as_a=True, bf16_scale=False))),
    4: ((33, 64, TcConfig(64, 64, 128, 4, 4, 3, w_as_a=False, bf16_scale=False)),
        (65, 96, TcConfig(128, 64, 128, 4, 4, 3, w_as_a=False, bf16_scale=False, tma=True)),
        (97, 128, TcConfig(128, 64, 128, 4, 8, 3, w_as_a=False, bf16_scale=False, tma=True)),
        (129, 192, TcConfig(64, 64, 128, 2, 4, 3, w_as_a=True, bf16_scale=False))),
}
# Prefill without the bf16 weight (the einsum path, weight=None): inclusive M ranges (None: no upper end)
# where all groups are dequantised in one launch into a [G, R, D] scratch freed with the call and one
# batched GEMM runs, instead of one group at a time (same sweep; H200): G=2 193..512 rows (26.08 us vs
# 32.00), G=4 from 193 rows on (512: 44.40 vs 60.78; 1024: 67.91 vs 73.80). G=2 at 1024 rows: within 1%.
PREFILL_BATCHED: dict[int, tuple[tuple[int, int | None], ...]] = {2: ((193, 512),), 4: ((193, None),)}


# Issue 26, fifth session: the wg path (kernels/wo_a_wg.py, sm_90 only): per group count (other G: the G=4
# entry), inclusive M ranges (None: no upper end) and the tiling. Chosen by benchmarks/wo_a_wg_sweep.py
# (choose_wg_table, from docs/measurements/wo_a_issue26_wg_sweep.json; H200, 8 rotated weight sets, CUDA-graph
# replay): a range runs wg where its best tiling beat the installed path by more than 5% in the same run. Above
# MID_MAX_M rows it serves only callers without the bf16 weight (prefill after DROP; with the weight the
# einsum is faster there). G=2: 33..64 rows 9.2 us (tc 11.0), 65..128 11.4 (mid/tc 14.8-15.2), 129..192
# 15.8 (tc 18.2), 193..512 22.6 (prefill 25.8); 1024 rows stay on the prefill (38.0 vs 39.2, within 5%).
# G=4: 33..64 12.8 (tc 15.0-15.2), 65..128 15.9-16.1 (tc 20.9-21.3), 129..192 23.1 (tc 29.4), 193..512 38.2
# (prefill 46.8), 513.. 58.0 without PDL (prefill 73.6; the PDL launch 59.8).
# Sixth session: the warp-specialised kernel (``decoders`` > 0) swept against this table in the same run
# (docs/measurements/wo_a_issue26_ws_sweep.json, laid over the fifth session's by overlay_wg_table): it
# replaces G=4 193..512 rows (34.2 us vs 37.9) and G=2 513+ (33.1 vs the prefill's 36.9); 3-10% slower at
# 48..192 rows, where the table keeps the one-partition kernel.
WG_TABLE: dict[int, tuple[tuple[int, int | None, WgConfig], ...]] = {
    2: ((33, 64, WgConfig(64, 64, 128, 4, 4, 6)),
        (65, 128, WgConfig(64, 128, 128, 4, 4, 4)),
        (129, 192, WgConfig(64, 128, 128, 2, 4, 4)),
        (193, 512, WgConfig(64, 128, 128, 1, 4, 4)),
        (513, None, WgConfig(64, 256, 64, 1, 4, 4, decoders=4))),
    4: ((33, 64, WgConfig(64, 64, 128, 2, 4, 6)),
        (65, 128, WgConfig(64, 128, 128, 2, 4, 4)),
        (129, 192, WgConfig(64, 128, 128, 1, 4, 4)),
        (193, 512, WgConfig(64, 256, 64, 1, 4, 4, decoders=4)),
        (513, None, WgConfig(128, 256, 64, 1, 8, 4, pdl=False))),
}


def _wg_entry(m: int, groups: int) -> WgConfig | None:
    table = WG_TABLE.get(groups, WG_TABLE.get(4, ()))
    return next((c for lo, hi, c in table if lo <= m and (hi is None or m <= hi)), None)


def wg_config(m: int, groups: int, rows: int, cols: int) -> WgConfig:
    """The wg path's tiling for M rows (:data:`WG_TABLE`); ValueError where none tiles R x D."""
    cfg = _wg_entry(m, groups)
    if cfg is None or not cfg.fits(rows, cols):
        raise ValueError(f"no wg tiling for M={m}, G={groups}, R={rows}, D={cols}")
    return cfg


def _tc_entry(m: int, groups: int) -> TcConfig | None:
    table = TC_TABLE.get(groups, TC_TABLE.get(4, ()))
    return next((c for lo, hi, c in table if lo <= m <= hi), None)


def _prefill_batched(m: int, groups: int) -> bool:
    ranges = PREFILL_BATCHED.get(groups, PREFILL_BATCHED.get(4, ()))
    return any(lo <= m and (hi is None or m <= hi) for lo, hi in ranges)


def tc_config(m: int, groups: int, rows: int, cols: int) -> TcConfig:
    """The tc path's tiling for M rows (:data:`TC_TABLE`; outside it, the G=4 / nearest entry), shrunk to
    divide smaller test shapes; ValueError where no tiling divides R x D."""
    cfg = _tc_entry(m, groups)
    if cfg is None:
        table = TC_TABLE.get(groups) or TC_TABLE.get(4) or TC_TABLE.get(2, ())
        if not table:
            raise ValueError(f"no tc tiling for M={m}, G={groups}")
        cfg = min(table, key=lambda e: min(abs(m - e[0]), abs(m - e[1])))[2]
    br, s = cfg.block_r, cfg.split_k
    while br > BLOCK and rows % br:
        br //= 2
    while s > 1 and cols % (cfg.block_k * s):
        s //= 2
    out = replace(cfg, block_r=br, split_k=s)
    if not out.fits(rows, cols):
        raise ValueError(f"no tc tiling for R={rows}, D={cols}")
    return out


def _wide_max_m(groups: int, device: torch.device) -> int:
    return WIDE_MAX_M.get(groups, WIDE_MAX_M.get(4, 0))


def wide_config(m: int, groups: int, rows: int, cols: int, device: torch.device | str = "cuda") -> RingConfig:
    """The ring tiling of the wide path for M rows (the token tile is the tile of one launch)."""
    device = torch.device(device)
    table = WIDE_TABLE.get(groups, WIDE_TABLE[4])
    base = next((c for top, c in table if m <= top), table[-1][1])
    if base.pdl and not _gluon.pdl_enabled(device):
        base = replace(base, pdl=False)
    cfg = base
    if not cfg.fits(min(m, cfg.block_m), rows, cols) or cfg.smem_footprint() > _gluon._smem_per_block(device):
        raise ValueError(f"no wide ring tiling for M={m}, R={rows}, D={cols} on this device")
    return cfg


# Kernels that failed to compile or launch on a device: (path, device name) -> reason. Logged once; the
# dispatcher then uses the next path (gluon/wide -> mid/small -> einsum; wg_ws, the warp-specialised wg
# kernel, -> the one-partition wg kernel with the same tiling -> tc ...), so a GPU that cannot run a
# kernel (the fleet's GB10, sm_121, cannot be measured here) still gets correct results.
_FAILED: dict[tuple[str, str], str] = {}


def _failed(path: str, device: torch.device) -> bool:
    return bool(_FAILED) and (path, _device_name(device)) in _FAILED


def _mark_failed(path: str, device: torch.device, exc: BaseException) -> None:
    key = (path, _device_name(device))
    if key not in _FAILED:
        _FAILED[key] = f"{type(exc).__name__}: {str(exc)[:300]}"
        LOG.warning("[wo_a_w8] the %s kernel cannot run on %s (%s); using the next path from now on",
                    path, key[1], _FAILED[key])


def _fit(cfg: KernelConfig, rows: int, cols: int) -> KernelConfig:
    """Shrink tiles (powers of two) until they divide R x D; the GPU shapes never need it, the small
    CPU test shapes do."""
    br, bk, s = cfg.block_r, cfg.block_k, max(1, cfg.split_k)
    while br > BLOCK and rows % br:
        br //= 2
    while s > 1 and cols % (bk * s):
        s //= 2
    while bk > _K_WORD and cols % (bk * s):
        bk //= 2
    out = replace(cfg, block_r=br, block_k=bk, split_k=s)
    if not out.fits(rows, cols):
        raise ValueError(f"no kernel tiling for R={rows}, D={cols}")
    return out


def default_config(m: int, groups: int, rows: int, cols: int, device: torch.device | str = "cuda") -> KernelConfig:
    """The tuned configuration for this shape (raises ValueError when the einsum path applies)."""
    device = torch.device(device)
    path = select_path(m, groups, device)
    if path == "einsum":
        raise ValueError(f"M={m} runs on the einsum path, no kernel configuration")
    if path in ("gluon", "wide", "wg", "tc"):  # the Triton configuration of the same rows (their fallback)
        if m > MID_MAX_M:
            raise ValueError(f"M={m} falls back to the einsum path, no kernel configuration")
        path = "small" if m <= SMALL_MAX_M else "mid"
    base, per_sm = next((c, p) for top, c, p in _TABLES[path] if m <= top)
    cap = base.split_k if base.split_k > 1 else 16
    cfg = _fit(base, rows, cols)
    tiles = groups * (rows // cfg.block_r) * -(-m // cfg.block_m)
    budget = per_sm * _sm_count(device)
    split = 1
    while tiles * split * 2 <= budget and cols % (cfg.block_k * split * 2) == 0 and split < cap:
        split *= 2
    return replace(cfg, split_k=split)


def _check_x(x: torch.Tensor, twin: Twin) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not isinstance(twin, Twin):
        raise ValueError(f"twin must be a Twin, got {type(twin).__name__}")
    if x.dtype != torch.bfloat16:
        raise ValueError(f"x must be torch.bfloat16, got {x.dtype}")
    if x.dim() != 3:
        raise ValueError(f"x must be [M, G, D], got shape {tuple(x.shape)}")
    m, g, d = x.shape
    if m == 0:
        raise ValueError("x has M=0 rows; wo_a needs at least one")
    if g != twin.groups:
        raise ValueError(f"x has G={g} groups but the twin has {twin.groups}")
    if d != twin.cols:
        raise ValueError(f"x has D={d} but the twin expects {twin.cols}")
    if x.stride(2) != 1:
        raise ValueError(f"x must be contiguous in its last dimension, got strides {tuple(x.stride())}")
    if x.device != twin.device:
        raise ValueError(f"x is on {x.device} but the twin is on {twin.device}")


def _einsum(x: torch.Tensor, twin: Twin, weight: torch.Tensor | None) -> torch.Tensor:
    if weight is None:
        return prefill(x, twin, batched=_prefill_batched(x.shape[0], x.shape[1]))
    if weight.dtype != torch.bfloat16 or tuple(weight.shape) != tuple(twin.values.shape):
        raise ValueError(f"weight must be bf16 {tuple(twin.values.shape)}, got {weight.dtype} {tuple(weight.shape)}")
    return torch.einsum("tgd,grd->tgr", x, weight).contiguous()


def _check_out(out: torch.Tensor, x: torch.Tensor, twin: Twin) -> None:
    want = (x.shape[0], x.shape[1], twin.rows)
    if not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16 or tuple(out.shape) != want:
        raise ValueError(f"out must be a bf16 tensor of shape {want}")
    if out.stride(2) != 1 or out.device != x.device:
        raise ValueError("out must be contiguous in its last dimension and on x's device")


@triton.jit
def _dequant_kernel(w_ptr, e_ptr, out_ptr, D, BLOCK_K: tl.constexpr):
    """One group's twin -> bf16 [R, D]: program (32-row block, BLOCK_K columns), exact."""
    rb = tl.program_id(0)
    kt = tl.program_id(1)
    NKB: tl.constexpr = BLOCK_K // 32
    offs = (rb * 32 + tl.arange(0, 32))[:, None, None].to(tl.int64) * D + kt * BLOCK_K \
        + tl.arange(0, NKB)[None, :, None] * 32 + tl.arange(0, 32)[None, None, :]
    ex = tl.load(e_ptr + rb * (D // 32) + kt * NKB + tl.arange(0, NKB)).to(tl.int32)
    scale = (ex << 23).to(tl.float32, bitcast=True)
    w = tl.load(w_ptr + offs).to(tl.float32) * scale[None, :, None]
    tl.store(out_ptr + offs, w.to(tl.bfloat16))


def dequantize_group(twin: Twin, g: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """The bf16 weight of group g ``[R, D]`` (exact), written into ``out`` (a contiguous scratch) if
    given: the prefill path's bounded scratch, one group at a time."""
    r, d = twin.rows, twin.cols
    if out is None:
        out = torch.empty((r, d), dtype=torch.bfloat16, device=twin.device)
    if twin.device.type != "cuda" and not _interpreting():
        out.copy_(dequantize(Twin(twin.values[g:g + 1].contiguous(), twin.exponents[g:g + 1].contiguous()))[0])
        return out
    _dequantize_rows(twin.values[g], twin.exponents[g], out)
    return out


def _dequantize_rows(values: torch.Tensor, exponents: torch.Tensor, out: torch.Tensor, block_k: int = 128) -> None:
    r, d = values.shape
    bk = block_k if d % block_k == 0 else 32
    _dequant_kernel[(r // BLOCK, d // bk)](values, exponents, out, d, BLOCK_K=bk, num_warps=4)


def prefill(x: torch.Tensor, twin: Twin, out: torch.Tensor | None = None, *, batched: bool = False,
            block_k: int = 128) -> torch.Tensor:
    """y from the twin alone through a bf16 scratch and cuBLAS (never a bf16 copy kept past the call).

    ``batched=False``: per group, dequantise into one ``[R, D]`` scratch and multiply straight into
    ``y[:, g, :]``. ``batched=True``: all groups in one dequantise launch into a ``[G, R, D]`` scratch
    freed with the call, then one batched GEMM (the einsum's own), copied into ``out`` if given."""
    m, g, _ = x.shape
    if batched and x.device.type == "cuda":
        scratch = torch.empty((g, twin.rows, twin.cols), dtype=torch.bfloat16, device=x.device)
        _dequantize_rows(twin.values.view(g * twin.rows, twin.cols), twin.exponents.view(-1, twin.cols // BLOCK),
                         scratch.view(g * twin.rows, twin.cols), block_k)
        y = torch.einsum("tgd,grd->tgr", x, scratch)
        return y if out is None else out.copy_(y)
    y = out if out is not None else torch.empty((m, g, twin.rows), dtype=torch.bfloat16, device=x.device)
    scratch = torch.empty((twin.rows, twin.cols), dtype=torch.bfloat16, device=x.device)
    for gi in range(g):
        dequantize_group(twin, gi, scratch)
        if x.device.type == "cuda":
            torch.mm(x[:, gi, :], scratch.t(), out=y[:, gi, :])
        else:  # the CPU has no bf16 GEMM worth the name: float64 products, one bf16 rounding
            y[:, gi, :] = (x[:, gi, :].double() @ scratch.double().t()).to(torch.bfloat16)
    return y


def _launch_wide(x: torch.Tensor, twin: Twin, out: torch.Tensor, cfg: RingConfig) -> torch.Tensor:
    """M rows as ceil(M / tile) ring launches of cfg.block_m tokens each (views of x and out)."""
    m = x.shape[0]
    for m0 in range(0, m, cfg.block_m):
        _gluon._launch_ring(x[m0:m0 + cfg.block_m], twin, out[m0:m0 + cfg.block_m], cfg, min(cfg.block_m, m - m0))
    return out


def wo_a(x: torch.Tensor, twin: Twin, weight: torch.Tensor | None = None, *, out: torch.Tensor | None = None,
         config: KernelConfig | GluonConfig | None = None, path: str | None = None) -> torch.Tensor:
    """``y[t, g, :] = W[g] @ x[t, g, :]`` from the twin; x bf16 ``[M, G, D]`` (last dim contiguous,
    other strides free), returns bf16 ``[M, G, R]`` (``out`` if given, else a new contiguous tensor).

    ``weight`` (the bf16 copy, if still held) serves the einsum path; without it that path
    dequantises the twin. With ``weight`` and no ``path``, M rows where :func:`einsum_is_faster` holds
    on this device run ``torch.einsum`` on the weight, exactly as the stock code does (its result is
    returned as is, so it may be a permuted view; with ``out`` it is copied there). ``path``/``config``
    override the dispatcher (tests, benchmarks); a :class:`KernelConfig` selects the Triton paths, a
    :class:`GluonConfig` the gluon path."""
    _check_x(x, twin)
    if out is not None:
        _check_out(out, x, twin)
    m, g, d = x.shape
    chosen = path or select_path(m, g, x.device)
    if chosen not in ("gluon", "wide", "wg", "tc", "small", "mid", "einsum"):
        raise ValueError(f"unknown path {chosen!r}")
    wg_cfg, explicit_wg = None, False
    if chosen == "wg" and path is None and config is not None and not isinstance(config, WgConfig):
        chosen = _after_wg(m, g, x.device)  # another path's configuration for the wg rows
    if isinstance(config, WgConfig) or chosen == "wg":
        if config is not None and not isinstance(config, WgConfig):
            raise ValueError("the wg path takes a WgConfig")
        if path not in (None, "wg"):
            raise ValueError(f"a WgConfig runs on the wg path, not {chosen!r}")
        explicit = explicit_wg = path is not None or config is not None
        if explicit and not _wg.available(x.device):
            raise ValueError("the wg path needs an sm_90 GPU (wgmma, TMA) and Triton with Gluon's Hopper module")
        if not explicit and m > MID_MAX_M and weight is not None:
            chosen = "einsum"  # prefill with the bf16 weight held: the stock einsum is faster
        else:
            try:
                wg_cfg = config or wg_config(m, g, twin.rows, d)
                if not explicit and wg_cfg.decoders and _failed("wg_ws", x.device):
                    wg_cfg = replace(wg_cfg, decoders=0)  # the same tiling on the one-partition kernel
                if not wg_cfg.fits(twin.rows, d):
                    raise ValueError(f"{wg_cfg} does not tile R={twin.rows}, D={d}")
                if not _wg.wg_ok(x, twin):
                    raise ValueError("the wg path needs x 16-byte aligned with contiguous groups and a token stride "
                                     f"that is a multiple of 8 elements, and block exponents up to "
                                     f"{_gluon.RING_EXP_MAX}")
                chosen = "wg"
            except ValueError:
                if explicit:
                    raise
                chosen = _after_wg(m, g, x.device)
                wg_cfg = None
        config = None if isinstance(config, WgConfig) else config
    if isinstance(config, TcConfig):
        if path not in (None, "tc"):
            raise ValueError(f"a TcConfig runs on the tc path, not {chosen!r}")
        chosen = "tc"
    elif chosen == "tc" and (path is not None or isinstance(config, GluonConfig)) and config is not None:
        raise ValueError("the tc path takes a TcConfig")
    elif chosen == "tc" and isinstance(config, KernelConfig):
        chosen = "small" if m <= SMALL_MAX_M else "mid"  # a Triton configuration for the tc path's rows
    elif isinstance(config, RingConfig) and (config.block_m > _gluon.MAX_M or chosen == "wide"):
        if path not in (None, "wide"):
            raise ValueError(f"a RingConfig of {config.block_m} tokens runs on the wide path, not {chosen!r}")
        chosen = "wide"
    elif chosen == "wide" and config is not None:
        raise ValueError("the wide path takes a RingConfig")
    elif isinstance(config, (GluonConfig, RingConfig)):
        if chosen not in ("gluon",) and path is not None:
            raise ValueError(f"a GluonConfig runs on the gluon path, not {chosen!r}")
        chosen = "gluon"
    elif config is not None and chosen == "gluon":
        if path is not None:
            raise ValueError("a KernelConfig runs on the small or mid path, not 'gluon'")
        chosen = "small" if m <= SMALL_MAX_M else "mid"
    gluon_cfg = config if isinstance(config, (GluonConfig, RingConfig)) else None
    if chosen == "gluon" and not _gluon.available(x.device):
        raise ValueError("the gluon path needs a CUDA GPU of compute capability 8.9 or newer and Triton with Gluon")
    if chosen == "gluon" and gluon_cfg is None:
        try:
            gluon_cfg = _gluon.ring_config_for(m, g, twin.rows, d, x.device) if _gluon.ring_ok(x, twin) else None
            if gluon_cfg is None and m > SMALL_MAX_M and path is None:
                raise ValueError("9..16 rows without the ring: the mid path (or the einsum) is faster")
            gluon_cfg = gluon_cfg or _gluon.config_for(m, g, twin.rows, d, x.device)
        except ValueError:
            if path is not None:
                raise
            chosen = "small" if m <= SMALL_MAX_M else "mid"  # a shape the gluon tiles do not divide
    if chosen == "wide":
        if not _gluon.available(x.device):
            raise ValueError("the wide path needs a CUDA GPU of compute capability 8.9 or newer and Triton with Gluon")
        try:
            if not _gluon.ring_ok(x, twin):
                raise ValueError("the wide path needs x 16-byte aligned with token and group strides that are "
                                 f"multiples of 16 elements, and block exponents up to {_gluon.RING_EXP_MAX}")
            wide_cfg = config or wide_config(m, g, twin.rows, d, x.device)
            if not wide_cfg.fits(min(m, wide_cfg.block_m), twin.rows, d):
                raise ValueError(f"{wide_cfg} does not tile R={twin.rows}, D={d}")
        except ValueError:
            if path is not None or config is not None:
                raise
            chosen = "mid" if m <= MID_MAX_M else "einsum"
    tc_cfg = None
    if chosen == "tc":
        if x.device.type != "cuda" and not _interpreting():
            raise ValueError("the tc path needs a CUDA device (or TRITON_INTERPRET=1)")
        try:
            tc_cfg = config or tc_config(m, g, twin.rows, d)
            if tc_cfg.tma and config is None and not _tc.tma_ok(x):
                tc_cfg = replace(tc_cfg, tma=False)  # the same tiling without descriptors
            if not tc_cfg.fits(twin.rows, d):
                raise ValueError(f"{tc_cfg} does not tile R={twin.rows}, D={d}")
        except ValueError:
            if path is not None or config is not None:
                raise
            chosen = "mid" if m <= MID_MAX_M else "einsum"
    if path is None and chosen in ("small", "mid") and _failed("mid", x.device):
        chosen = "einsum"  # gluon/wide fell back to a Triton kernel that already failed here
    if path is None and chosen not in ("gluon", "wide", "wg") and d % _K_WORD:
        chosen = "einsum"  # the kernels tile K by 128 (exponents read as int32 words)
    if path is None and weight is not None and chosen != "einsum" and config is None and not explicit_wg \
            and einsum_is_faster(m, x.device, g):
        if weight.dtype != torch.bfloat16 or tuple(weight.shape) != tuple(twin.values.shape):
            raise ValueError(f"weight must be bf16 {tuple(twin.values.shape)}, "
                             f"got {weight.dtype} {tuple(weight.shape)}")
        y = torch.einsum("tgd,grd->tgr", x, weight)
        return y if out is None else out.copy_(y)
    if chosen == "einsum":
        if weight is None:
            return prefill(x, twin, out, batched=_prefill_batched(m, g))
        y = _einsum(x, twin, weight)
        return y if out is None else out.copy_(y)
    if out is None:
        out = torch.empty((m, g, twin.rows), dtype=torch.bfloat16, device=x.device)
    if chosen in ("small", "mid"):
        if x.device.type != "cuda" and not _interpreting():
            raise ValueError("the Triton paths need a CUDA device (or TRITON_INTERPRET=1)")
        cfg = config or default_config(m, g, twin.rows, d, x.device)
        if not cfg.fits(twin.rows, d):
            raise ValueError(f"{cfg} does not tile R={twin.rows}, D={d}")
    try:
        if chosen == "gluon":
            return _gluon.launch(x, twin, out, gluon_cfg)
        if chosen == "wide":
            return _launch_wide(x, twin, out, wide_cfg)
        if chosen == "wg":
            return _wg.launch(x, twin, out, wg_cfg)
        if chosen == "tc":
            return _tc.launch(x, twin.values, twin.exponents, twin.semaphores, out, tc_cfg)
        return _launch(x, twin, cfg, out)
    except ValueError:
        raise
    except Exception as exc:  # a kernel that does not compile or launch here: log once, next path
        if path is not None or config is not None or explicit_wg:
            raise
        if chosen == "wg" and wg_cfg.decoders:  # warp-specialised: the one-partition wg kernel next
            _mark_failed("wg_ws", x.device, exc)
        else:
            _mark_failed("mid" if chosen == "small" else chosen, x.device, exc)
        return wo_a(x, twin, weight, out=out)


def _launch(x: torch.Tensor, twin: Twin, cfg: KernelConfig, y: torch.Tensor) -> torch.Tensor:
    m, g, d = x.shape
    r = twin.rows
    m_tiles = -(-m // cfg.block_m)
    grid = (m_tiles, g * (r // cfg.block_r), cfg.split_k)
    use_split = cfg.split_k > 1
    if use_split:
        tiles = grid[0] * grid[1]
        if tiles > twin.semaphores.numel():
            raise ValueError(f"split-K over {tiles} tiles exceeds the twin's {twin.semaphores.numel()} counters")
        ws = torch.empty(tiles * cfg.split_k * cfg.block_r * cfg.block_m, dtype=torch.float32, device=x.device)
    else:
        ws = y  # unused
    if cfg.acc_scale:
        _wo_a_acc_kernel[grid](
            x, twin.values, twin.exponents, y, ws, twin.semaphores,
            m, r, d, d // cfg.split_k, cfg.split_k,
            x.stride(0), x.stride(1), y.stride(0), y.stride(1),
            BLOCK_M=cfg.block_m, BLOCK_R=cfg.block_r, BLOCK_K=cfg.block_k,
            USE_SPLIT=use_split, SWAP_AB=cfg.swap_ab, INTERPRET=_interpreting(), SPLIT=cfg.split_k,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        return y
    _wo_a_kernel[grid](
        x, twin.values, twin.exponents, y, ws, twin.semaphores,
        m, r, d, d // cfg.split_k, cfg.split_k,
        x.stride(0), x.stride(1), y.stride(0), y.stride(1),
        BLOCK_M=cfg.block_m, BLOCK_R=cfg.block_r, BLOCK_K=cfg.block_k,
        USE_SPLIT=use_split, BF16_SCALE=cfg.bf16_scale, SWAP_AB=cfg.swap_ab, FMA=cfg.fma,
        INTERPRET=_interpreting(), SPLIT=cfg.split_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return y
