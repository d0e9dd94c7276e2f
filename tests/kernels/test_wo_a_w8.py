"""wo_a fp8 twins: format (bit-exact or refused), kernels against a float64 reference, bad input.

On the CPU these run under TRITON_INTERPRET=1 on small shapes (plus one full-shape call); the full
shapes and the timings run on the GPU through benchmarks/wo_a_bench.py. Every input is fresh random
data (the seed is in each failure message); outputs are poisoned with NaN before each call."""
from __future__ import annotations

import logging
import os

import pytest

torch = pytest.importorskip("torch", reason="kernel tests need torch: pip install -r requirements-kernels.txt")
pytest.importorskip("triton", reason="kernel tests need triton: pip install -r requirements-kernels.txt")

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
if INTERPRET:
    pytest.importorskip("numpy", reason="TRITON_INTERPRET=1 needs numpy")

from kernels import wo_a_w8 as K  # noqa: E402

pytestmark = pytest.mark.kernels

GPU = torch.cuda.is_available() and not INTERPRET
DEVICE = "cuda" if GPU else "cpu"
CAN_RUN_KERNELS = GPU or INTERPRET
needs_kernels = pytest.mark.skipif(not CAN_RUN_KERNELS, reason="no CUDA device and TRITON_INTERPRET is not set")

R_SMALL, D_SMALL = 64, 1024  # two row blocks, 32 column blocks: split-K up to 8 with 128-wide K tiles


@pytest.fixture
def gen():
    seed = int.from_bytes(os.urandom(4), "little")
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return g


def random_twin(groups: int, rows: int, cols: int, gen, lo: int = 110, hi: int = 126) -> K.Twin:
    """Random e4m3 codes (every finite code may occur, subnormals and zeros included) and scales."""
    codes = torch.randint(0, 256, (groups, rows, cols), generator=gen, device=DEVICE, dtype=torch.int32)
    codes = torch.where((codes & 0x7F) == 0x7F, codes ^ 1, codes).to(torch.uint8)
    exps = torch.randint(lo, hi, (groups, rows // 32, cols // 32), generator=gen, device=DEVICE, dtype=torch.int32)
    return K.Twin(codes.view(torch.float8_e4m3fn).contiguous(), exps.to(torch.uint8).contiguous())


def odd_x(m: int, groups: int, cols: int, gen) -> torch.Tensor:
    """x as a view of a bigger activation: token and group strides not multiples of 16, last dim unit."""
    big = torch.randn((m, groups + 1, cols + 13), generator=gen, device=DEVICE, dtype=torch.float32)
    x = big.to(torch.bfloat16)[:, 1:, 5:5 + cols]
    assert x.stride() == ((groups + 1) * (cols + 13), cols + 13, 1)
    return x


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def assert_close_to_fp64(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, seed: int) -> float:
    ref = torch.einsum("tgd,grd->tgr", x.double(), w.double())
    assert bool(torch.isfinite(y).all()), f"unwritten or non-finite outputs (seed {seed})"
    err = (y.double() - ref).abs()
    rel = (err.norm() / ref.norm()).item()
    assert rel <= 1e-2, f"relative error {rel:.2e} (seed {seed})"
    # per element: bf16 rounding of the result (truncation under the interpreter) plus fp32 accumulation
    mag = torch.einsum("tgd,grd->tgr", x.double().abs(), w.double().abs())
    bound = 2.0**-7 * ref.abs() + 1e-5 * mag
    assert bool((err <= bound).all()), f"max element error {(err / bound).max().item():.2f}x the bound (seed {seed})"
    return rel


# ------------------------------------------------------------------------------------------ twin format


@pytest.mark.parametrize("groups", [2, 4])
def test_weight_made_from_a_twin_is_twinned_bit_exactly(groups, gen):
    source = random_twin(groups, R_SMALL, D_SMALL, gen)
    w = K.dequantize(source)
    w[0, :32, :32] = 0.0  # an all-zero block
    w[-1, 32:, 64:96] = -0.0  # negative zeros must come back as negative zeros
    w[0, 0, 33] = -448 * 2.0 ** (int(source.exponents[0, 0, 1]) - 127)  # largest magnitude its block allows
    twin = K.build_twin(w)
    assert twin.values.dtype == torch.float8_e4m3fn and twin.exponents.dtype == torch.uint8
    assert tuple(twin.exponents.shape) == (groups, R_SMALL // 32, D_SMALL // 32)
    assert torch.equal(bits(K.dequantize(twin)), bits(w)), f"seed {gen.initial_seed()}"


def test_full_shape_twin_round_trip(gen):
    w = K.dequantize(random_twin(4, 1024, 4096, gen))
    twin = K.build_twin(w)
    assert tuple(twin.exponents.shape) == (4, 32, 128)
    assert torch.equal(bits(K.dequantize(twin)), bits(w)), f"seed {gen.initial_seed()}"


def test_random_bf16_weight_is_not_twinnable(gen):
    w = torch.randn((2, R_SMALL, D_SMALL), generator=gen, device=DEVICE).to(torch.bfloat16)
    with pytest.raises(K.NotTwinnableError, match="not exactly representable"):
        K.build_twin(w)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weight_is_not_twinnable(bad, gen):
    w = K.dequantize(random_twin(2, R_SMALL, D_SMALL, gen))
    w[1, 3, 7] = bad
    with pytest.raises(K.NotTwinnableError, match="NaN or Inf"):
        K.build_twin(w)


def test_weight_needing_out_of_range_scales_is_not_twinnable(gen):
    w = K.dequantize(random_twin(2, R_SMALL, D_SMALL, gen))
    w[0, :32, :32] = 2.0**-130  # bf16 subnormal: its block would need a scale below 2**-117
    with pytest.raises(K.NotTwinnableError, match="exponents"):
        K.build_twin(w)


def test_twin_weights_reports_what_stays_on_bf16(gen, caplog):
    good = K.dequantize(random_twin(4, R_SMALL, D_SMALL, gen))
    bad = torch.randn((4, R_SMALL, D_SMALL), generator=gen, device=DEVICE).to(torch.bfloat16)
    with caplog.at_level(logging.INFO, logger="wo_a_w8"):
        twins, kept = K.twin_weights({"layers.0.wo_a": good, "layers.1.wo_a": bad})
    assert list(twins) == ["layers.0.wo_a"] and list(kept) == ["layers.1.wo_a"]
    assert "[wo_a_w8] fp8 twins for 1 wo_a weights, 1 left on bf16" in caplog.text


def test_twin_from_checkpoint_scale_encodings(gen):
    twin = random_twin(2, R_SMALL, D_SMALL, gen)
    want = bits(K.dequantize(twin))
    scales = [twin.exponents, (twin.exponents.to(torch.int32) << 23).view(torch.float32)]
    if hasattr(torch, "float8_e8m0fnu"):
        scales.append(twin.exponents.view(torch.float8_e8m0fnu))
    for scale in scales:
        got = K.twin_from_checkpoint(twin.values, scale)
        assert torch.equal(bits(K.dequantize(got)), want), scale.dtype
    flat = K.twin_from_checkpoint(twin.values.reshape(2 * R_SMALL, D_SMALL),
                                  twin.exponents.reshape(2 * R_SMALL // 32, D_SMALL // 32), groups=2)
    assert torch.equal(bits(K.dequantize(flat)), want)


def test_dequantize_is_exact_at_the_exponent_limits(gen):
    for e in (K.EXP_MIN, K.EXP_MAX):
        twin = random_twin(2, R_SMALL, D_SMALL, gen, lo=e, hi=e + 1)
        w = K.dequantize(twin)
        exact = twin.values.double() * 2.0 ** (e - 127)
        assert bool(torch.isfinite(w).all())
        assert torch.equal(w.double(), exact), f"exponent {e}"


@pytest.mark.parametrize("case", ["values_dtype", "exp_dtype", "exp_shape", "exp_low", "exp_high", "nan_code",
                                  "rows", "non_contiguous"])
def test_invalid_twins_raise_value_error(case, gen):
    twin = random_twin(2, R_SMALL, D_SMALL, gen)
    v, e = twin.values, twin.exponents
    if case == "values_dtype":
        v = K.dequantize(twin)
    elif case == "exp_dtype":
        e = e.to(torch.int32)
    elif case == "exp_shape":
        e = e[:, :, :-1].contiguous()
    elif case == "exp_low":
        e = e.clone()
        e[1, 1, 3] = K.EXP_MIN - 1
    elif case == "exp_high":
        e = e.clone()
        e[0, 0, 0] = K.EXP_MAX + 1
    elif case == "nan_code":
        raw = v.view(torch.uint8).clone()
        raw[1, 5, 9] = 0xFF
        v = raw.view(torch.float8_e4m3fn)
    elif case == "rows":
        v, e = v[:, :48].contiguous(), e[:, :1].contiguous()
    elif case == "non_contiguous":
        v = v.transpose(1, 2).contiguous().transpose(1, 2)
    with pytest.raises(ValueError):
        K.Twin(v, e)


@pytest.mark.parametrize("case", ["dtype", "negative", "not_pow2", "e8m0_nan", "count", "weight_dtype"])
def test_invalid_checkpoint_scales_raise_value_error(case, gen):
    twin = random_twin(2, R_SMALL, D_SMALL, gen)
    values, scale = twin.values, (twin.exponents.to(torch.int32) << 23).view(torch.float32)
    if case == "dtype":
        scale = twin.exponents.to(torch.int16)
    elif case == "negative":
        scale = -scale
    elif case == "not_pow2":
        scale = scale * 1.5
    elif case == "e8m0_nan":
        scale = twin.exponents.clone()
        scale[0, 0, 0] = 255
    elif case == "count":
        scale = scale[:, :, :-1]
    elif case == "weight_dtype":
        values = K.dequantize(twin)
    with pytest.raises(ValueError):
        K.twin_from_checkpoint(values, scale)


def test_build_twin_rejects_bad_weights(gen):
    w = K.dequantize(random_twin(2, R_SMALL, D_SMALL, gen))
    for bad in (w.float(), w[0], w[:, :40], "weight"):
        with pytest.raises(ValueError):
            K.build_twin(bad)


# ------------------------------------------------------------------------------------------ kernels


@needs_kernels
@pytest.mark.parametrize("groups", [2, 4])
@pytest.mark.parametrize("m", [1, 2, 5, 8, 9, 16, 33, 100, 192])
def test_dispatcher_matches_fp64_reference(groups, m, gen):
    twin = random_twin(groups, R_SMALL, D_SMALL, gen)
    w = K.dequantize(twin)
    x = odd_x(m, groups, D_SMALL, gen)
    out = torch.full((m, groups, R_SMALL), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    y = K.wo_a(x, twin, out=out)
    assert y is out
    gluon = K._gluon.available(DEVICE)
    wide = gluon and K._gluon.MAX_M < m <= K._wide_max_m(groups, torch.device(DEVICE))
    tc = K._tc_entry(m, groups) is not None
    wg = K._wg.available(DEVICE) and K._wg_entry(m, groups) is not None  # odd x: wg then runs the next path
    want = "gluon" if gluon and m <= K._gluon.MAX_M else "wide" if wide else "wg" if wg else "tc" if tc else \
        "small" if m <= 8 else "mid"
    assert K.select_path(m, groups, DEVICE) == want
    assert_close_to_fp64(y, x, w, gen.initial_seed())


@needs_kernels
@pytest.mark.parametrize("cfg", [
    K.KernelConfig(block_m=16, block_r=32, block_k=256, split_k=2),
    K.KernelConfig(block_m=16, block_r=32, block_k=128, split_k=8),
    K.KernelConfig(block_m=16, block_r=64, block_k=128, split_k=4, bf16_scale=True),
    K.KernelConfig(block_m=32, block_r=64, block_k=128, split_k=2),
    K.KernelConfig(block_m=64, block_r=64, block_k=256, split_k=1),
    K.KernelConfig(block_m=16, block_r=64, block_k=256, split_k=4, swap_ab=True),
    K.KernelConfig(block_m=64, block_r=64, block_k=128, split_k=2, swap_ab=True),
    K.KernelConfig(block_m=8, block_r=32, block_k=128, split_k=4, fma=True),
    K.KernelConfig(block_m=2, block_r=64, block_k=256, split_k=1, fma=True),
    K.KernelConfig(block_m=16, block_r=32, block_k=128, split_k=2, acc_scale=True),
    K.KernelConfig(block_m=16, block_r=64, block_k=256, split_k=4, acc_scale=True),
    K.KernelConfig(block_m=32, block_r=64, block_k=128, split_k=8, acc_scale=True),
    K.KernelConfig(block_m=16, block_r=64, block_k=128, split_k=1, swap_ab=True, acc_scale=True),
    K.KernelConfig(block_m=64, block_r=32, block_k=128, split_k=2, swap_ab=True, acc_scale=True),
], ids=lambda c: f"m{c.block_m}r{c.block_r}k{c.block_k}s{c.split_k}{'bf' if c.bf16_scale else ''}"
                f"{'sw' if c.swap_ab else ''}{'fma' if c.fma else ''}{'acc' if c.acc_scale else ''}")
@pytest.mark.parametrize("groups", [2, 4])
def test_configs_split_k_deterministic(cfg, groups, gen):
    twin = random_twin(groups, R_SMALL, D_SMALL, gen)
    w = K.dequantize(twin)
    m = {1: 1, 2: 2, 8: 7, 16: 6}.get(cfg.block_m, 40)
    x = odd_x(m, groups, D_SMALL, gen)
    runs = []
    for _ in range(3):
        out = torch.full((m, groups, R_SMALL), float("nan"), dtype=torch.bfloat16, device=DEVICE)
        runs.append(K.wo_a(x, twin, out=out, config=cfg))
        assert int(twin.semaphores.abs().sum()) == 0, "split-K counters must reset for the next launch"
    assert_close_to_fp64(runs[0], x, w, gen.initial_seed())
    assert all(torch.equal(bits(r), bits(runs[0])) for r in runs[1:]), "not bitwise deterministic"


@needs_kernels
@pytest.mark.parametrize("m", [3, 12])
def test_full_shape_g4(m, gen):
    twin = random_twin(4, 1024, 4096, gen)
    x = odd_x(m, 4, 4096, gen)
    out = torch.full((m, 4, 1024), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    y = K.wo_a(x, twin, out=out)
    assert_close_to_fp64(y, x, K.dequantize(twin), gen.initial_seed())


def test_einsum_path_for_prefill_and_without_gpu(monkeypatch, gen):
    monkeypatch.setattr(K._wg, "available", lambda device: False)  # the paths below wg (issue 26, fifth session)
    twin = random_twin(4, R_SMALL, D_SMALL, gen)
    w = K.dequantize(twin)
    m = K.MID_MAX_M + 1
    assert K.select_path(m, 4, DEVICE) == "einsum"
    x = odd_x(m, 4, D_SMALL, gen)
    want = torch.einsum("tgd,grd->tgr", x, w)
    assert torch.equal(bits(K.wo_a(x, twin, w)), bits(want))  # with the bf16 weight: the stock einsum
    # without it (DROP, issue 26): one group's bounded scratch at a time, close to float64, reproducible
    out = torch.full((m, 4, R_SMALL), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    y = K.wo_a(x, twin, out=out)
    assert y is out
    assert_close_to_fp64(y, x, w, gen.initial_seed())
    assert torch.equal(bits(K.wo_a(x, twin)), bits(y))


def test_select_path_boundaries(monkeypatch):
    monkeypatch.setattr(K._wg, "available", lambda device: False)  # the paths below wg (issue 26, fifth session)
    monkeypatch.setattr(K._gluon, "available", lambda device: False)  # the Triton paths' boundaries
    assert [K.select_path(m, 4, "cuda") for m in (1, 8, 9, 96, 192, 193, 4096)] == \
        ["small", "small", "mid", *("tc" if K._tc_entry(m, 4) else "mid" for m in (96, 192)), "einsum", "einsum"]
    assert K.select_path(4, 2, "cuda") == K.select_path(4, 4, "cuda") == "small"  # G=4 welcome
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert K.select_path(4, 4, "cpu") == "einsum"
    for m, g in ((0, 4), (4, 0)):
        with pytest.raises(ValueError):
            K.select_path(m, g)


def test_einsum_preference_by_device(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not any(K.einsum_is_faster(m, "cpu") for m in (1, 2, 8))
    monkeypatch.setattr(K, "_device_name", lambda device: "NVIDIA H200")
    # round 6: the gluon ring kernel beats the einsum up to 16 rows on the H200, at G=4 and G=2; issue 26:
    # the wide path up to 32 rows
    assert [K.einsum_is_faster(m, "cuda", 4) for m in (1, 8, 16, 17, 32, 33, 192, 193)] == \
        [False, False, False, False, False, True, True, False]
    assert [K.einsum_is_faster(m, "cuda", 2) for m in (8, 9, 16, 17, 32, 33)] == [False] * 5 + [True]
    monkeypatch.setattr(K, "_device_name", lambda device: "NVIDIA GB10")
    assert not any(K.einsum_is_faster(m, "cuda") for m in (1, 2, 8, 192))


@needs_kernels
def test_einsum_preferred_only_with_the_bf16_weight(monkeypatch, gen):
    twin = random_twin(4, R_SMALL, D_SMALL, gen)
    w = K.dequantize(twin)
    x = odd_x(6, 4, D_SMALL, gen)
    monkeypatch.setattr(K, "einsum_is_faster", lambda m, device, groups=None: True)
    monkeypatch.setattr(K._gluon, "available", lambda device: False)
    want = torch.einsum("tgd,grd->tgr", x, w)
    assert torch.equal(bits(K.wo_a(x, twin, w)), bits(want))
    out = torch.full((6, 4, R_SMALL), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    assert K.wo_a(x, twin, w, out=out) is out and torch.equal(bits(out), bits(want))
    with pytest.raises(ValueError):
        K.wo_a(x, twin, w.float())
    # without the weight (DROP) or with an explicit path the kernels still run
    assert_close_to_fp64(K.wo_a(x, twin), x, w, gen.initial_seed())
    assert_close_to_fp64(K.wo_a(x, twin, w, path="small"), x, w, gen.initial_seed())


@needs_kernels
def test_default_configs_tile_the_full_shape():
    for m in (1, 2, 4, 6, 8, 12, 16, 32, 64, 128, 192):
        for g in (2, 4):
            cfg = K.default_config(m, g, 1024, 4096, DEVICE)
            assert cfg.fits(1024, 4096), (m, g, cfg)


@needs_kernels
@pytest.mark.parametrize("case", ["fp16", "fp32", "2d", "groups", "cols", "last_dim", "m0", "twin", "out_shape",
                                  "out_dtype", "weight", "path", "config"])
def test_bad_inputs_raise_value_error(case, gen):
    twin = random_twin(4, R_SMALL, D_SMALL, gen)
    x = odd_x(4, 4, D_SMALL, gen)
    kw = {}
    if case == "fp16":
        x = x.half()
    elif case == "fp32":
        x = x.float()
    elif case == "2d":
        x = x[:, 0]
    elif case == "groups":
        x = odd_x(4, 2, D_SMALL, gen)
    elif case == "cols":
        x = odd_x(4, 4, D_SMALL - 32, gen)
    elif case == "last_dim":
        x = torch.randn((4, D_SMALL, 4), generator=gen, device=DEVICE).to(torch.bfloat16).transpose(1, 2)
    elif case == "m0":
        x = x[:0]
    elif case == "twin":
        twin = K.dequantize(twin)
    elif case == "out_shape":
        kw["out"] = torch.empty((4, 4, R_SMALL + 32), dtype=torch.bfloat16, device=DEVICE)
    elif case == "out_dtype":
        kw["out"] = torch.empty((4, 4, R_SMALL), dtype=torch.float32, device=DEVICE)
    elif case == "weight":
        kw.update(weight=K.dequantize(twin).float(), path="einsum")
    elif case == "path":
        kw["path"] = "fast"
    elif case == "config":
        kw["config"] = K.KernelConfig(block_m=16, block_r=32, block_k=512, split_k=4)
    with pytest.raises(ValueError):
        K.wo_a(x, twin, **kw)


# ------------------------------------------------------------------------------------------ issue 26


@needs_kernels
@pytest.mark.parametrize("groups", [2, 4])
def test_dequantize_group_is_exact(groups, gen):
    """The prefill path's scratch: each group's bf16 weight, bit for bit, over stale scratch contents."""
    twin = random_twin(groups, R_SMALL, D_SMALL, gen, lo=10, hi=247)  # the whole accepted exponent range
    w = K.dequantize(twin)
    scratch = torch.full((R_SMALL, D_SMALL), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    for g in range(groups):
        assert K.dequantize_group(twin, g, scratch) is scratch
        assert torch.equal(bits(scratch), bits(w[g])), f"group {g} (seed {gen.initial_seed()})"


@needs_kernels
@pytest.mark.parametrize("groups", [2, 4])
def test_prefill_without_weight_matches_fp64(groups, gen):
    m = K.MID_MAX_M + 7
    twin = random_twin(groups, R_SMALL, D_SMALL, gen)
    x = odd_x(m, groups, D_SMALL, gen)
    out = torch.full((m, groups, R_SMALL), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    y = K.wo_a(x, twin, out=out, path="einsum")
    assert y is out
    assert_close_to_fp64(y, x, K.dequantize(twin), gen.initial_seed())


@needs_kernels
def test_kernel_that_cannot_run_falls_back_once(monkeypatch, gen, caplog):
    """A kernel failing to compile or launch (a GPU that cannot be measured here) is logged once and the
    dispatcher uses the next path, with a correct result; an explicit path still raises."""
    monkeypatch.setattr(K, "_FAILED", {})
    monkeypatch.setattr(K._wg, "available", lambda device: False)  # the paths below wg (issue 26, fifth session)
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("PTX .version 9.9 does not support .target sm_121")

    monkeypatch.setattr(K, "_launch", broken)
    twin = random_twin(2, R_SMALL, D_SMALL, gen)
    w = K.dequantize(twin)
    x = odd_x(12, 2, D_SMALL, gen)
    with caplog.at_level(logging.WARNING, logger="wo_a_w8"):
        for _ in range(3):
            out = torch.full((12, 2, R_SMALL), float("nan"), dtype=torch.bfloat16, device=DEVICE)
            assert_close_to_fp64(K.wo_a(x, twin, out=out), x, w, gen.initial_seed())
    assert len(calls) == 1, "a failed kernel must not be retried on every call"
    warnings = [r for r in caplog.records if "cannot run" in r.getMessage()]
    assert len(warnings) == 1 and "sm_121" in warnings[0].getMessage()
    # with mid failed, rows that mid serves go to the einsum path; on a GPU with Gluon 12 rows still
    # select gluon (odd x then falls back past the failed mid straight to the einsum)
    assert K.select_path(12, 2, DEVICE) == ("gluon" if K._gluon.available(DEVICE) else "einsum")
    assert K.select_path(80, 2, DEVICE) == "einsum"  # a mid row (not in TC_TABLE)
    with pytest.raises(RuntimeError):
        K.wo_a(x, twin, path="mid", config=K.KernelConfig(block_m=16, block_r=32, block_k=128))


def test_wide_path_refused_where_it_cannot_run(gen):
    """The wide path needs a Gluon-capable GPU and aligned x; asked for explicitly it says so."""
    twin = random_twin(2, R_SMALL, D_SMALL, gen)
    x = odd_x(20, 2, D_SMALL, gen)
    if not K._gluon.available(DEVICE):
        with pytest.raises(ValueError, match="wide path needs"):
            K.wo_a(x, twin, path="wide")
    with pytest.raises(ValueError):
        K.wo_a(x, twin, config=K.KernelConfig(block_m=32, block_r=32, block_k=128), path="wide")


@needs_kernels
def test_wide_rows_fall_back_to_mid_where_the_ring_cannot_take_x(monkeypatch, gen):
    """17..WIDE_MAX_M rows whose x the ring cannot copy (odd strides) run mid with mid's tuned tiles: the
    configuration lookup maps the wide path to mid as it maps gluon (it raised KeyError 'wide' on the H200
    once the wide path was installed, in benchmarks/wo_a_bench.py and test_default_configs_tile_the_full_shape)."""
    monkeypatch.setattr(K._gluon, "available", lambda device: True)
    assert K.select_path(24, 4, DEVICE) == "wide"
    for m in (17, 24, 32):
        assert K.default_config(m, 4, 1024, 4096, DEVICE).block_m == 32  # mid's 17..32-row tiles
    twin = random_twin(4, R_SMALL, D_SMALL, gen)
    x = odd_x(24, 4, D_SMALL, gen)
    y = K.wo_a(x, twin, out=torch.full((24, 4, R_SMALL), float("nan"), dtype=torch.bfloat16, device=DEVICE))
    ref = torch.einsum("tgd,grd->tgr", x.double(), K.dequantize(twin).double())
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-2


@needs_kernels
@pytest.mark.parametrize("m", [12, 24])
def test_fallback_from_gluon_or_wide_stops_when_mid_failed(monkeypatch, gen, m):
    """On a Gluon-capable GPU, rows whose x the ring cannot copy go from the gluon (12) or wide (24) path to
    mid; once mid has failed they must go on to the einsum path, not back to gluon/wide and mid again (the
    dispatcher recursed without end there: test_kernel_that_cannot_run_falls_back_once hung on the H200)."""
    monkeypatch.setattr(K, "_FAILED", {})
    monkeypatch.setattr(K._gluon, "available", lambda device: True)
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        if len(calls) > 3:
            pytest.fail(f"the dispatcher retried the failed mid kernel {len(calls)} times")
        raise RuntimeError("PTX .version 9.9 does not support .target sm_121")

    monkeypatch.setattr(K, "_launch", broken)
    twin = random_twin(2, R_SMALL, D_SMALL, gen)
    w = K.dequantize(twin)
    x = odd_x(m, 2, D_SMALL, gen)
    for _ in range(2):
        out = torch.full((m, 2, R_SMALL), float("nan"), dtype=torch.bfloat16, device=DEVICE)
        assert_close_to_fp64(K.wo_a(x, twin, out=out), x, w, gen.initial_seed())
    assert len(calls) == 1
