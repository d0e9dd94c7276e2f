"""Issue 26, the tc path (kernels/wo_a_tc.py): tensor-core tiles from the fp8 twin alone, and the batched
prefill. On the CPU the kernels run under TRITON_INTERPRET=1 at small shapes (float64 reference, fresh
random inputs, NaN-poisoned outputs, odd strides); on a GPU the same tests plus the full shapes of the
dispatcher's table. The table itself is rebuilt from the stored H200 sweep (pure Python)."""
from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="kernel tests need torch: pip install -r requirements-kernels.txt")
pytest.importorskip("triton", reason="kernel tests need triton: pip install -r requirements-kernels.txt")

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
if INTERPRET:
    pytest.importorskip("numpy", reason="TRITON_INTERPRET=1 needs numpy")

from kernels import wo_a_tc as T  # noqa: E402
from kernels import wo_a_w8 as K  # noqa: E402

from .test_wo_a_w8 import assert_close_to_fp64, bits, odd_x, random_twin  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

pytestmark = pytest.mark.kernels

GPU = torch.cuda.is_available() and not INTERPRET
DEVICE = "cuda" if GPU else "cpu"
needs_kernels = pytest.mark.skipif(not (GPU or INTERPRET), reason="no CUDA device and TRITON_INTERPRET is not set")
needs_gpu = pytest.mark.skipif(not GPU, reason="full shapes need a CUDA GPU")
SWEEP = ROOT / "docs" / "measurements" / "wo_a_issue26_tc_sweep_big.json"

R_SMALL, D_SMALL = 64, 512  # two row blocks, 16 column blocks: split-K up to 4 with 128-wide K tiles


@pytest.fixture
def gen():
    seed = int.from_bytes(os.urandom(4), "little")
    return torch.Generator(device=DEVICE).manual_seed(seed)


def _x(m, groups, cols, gen, odd):
    if odd:
        return odd_x(m, groups, cols, gen)
    return torch.randn((m, groups, cols), generator=gen, device=DEVICE, dtype=torch.float32).to(torch.bfloat16)


@needs_kernels
@pytest.mark.parametrize("groups, m, cfg, odd", [
    (2, 20, T.TcConfig(32, 64, 128, 2), True),                                   # W as A, split-K
    (4, 40, T.TcConfig(64, 32, 128, 1, w_as_a=False), False),                    # x as A, one split
    (2, 17, T.TcConfig(16, 64, 256, 1, sub_blocks=True), True),                  # one dot per K block
    (4, 30, T.TcConfig(32, 64, 128, 2, w_as_a=False, sub_blocks=True), False),   # both, split 2
    (2, 20, T.TcConfig(32, 64, 128, 2, bf16_scale=False, tma=True), False),      # descriptors, W as A
    (4, 40, T.TcConfig(64, 32, 256, 1, w_as_a=False, bf16_scale=False, tma=True), False),  # descriptors, x as A
])
def test_tc_kernel_matches_fp64(groups, m, cfg, odd, gen):
    """Every output written (NaN-poisoned first), within bf16 rounding of the float64 product, and the
    same bits on a second call (split-K sums in a fixed order)."""
    twin = random_twin(groups, R_SMALL, D_SMALL, gen)
    x = _x(m, groups, D_SMALL, gen, odd)
    y = torch.full((m, groups, R_SMALL), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    K.wo_a(x, twin, out=y, config=cfg)
    assert_close_to_fp64(y, x, K.dequantize(twin), gen.initial_seed())
    again = torch.full_like(y, float("nan"))
    K.wo_a(x, twin, out=again, config=cfg, path="tc")
    assert torch.equal(bits(again), bits(y))
    assert int(twin.semaphores.abs().sum()) == 0  # every split-K counter reset for the next launch


def test_tc_config_rules():
    assert T.TcConfig(32, 64).fits(1024, 4096)
    assert not T.TcConfig(24, 64).fits(1024, 4096)          # token tile not a power of two
    assert not T.TcConfig(8, 64).fits(1024, 4096)           # the dot needs 16 tokens
    assert not T.TcConfig(32, 64, 96).fits(1024, 4096)      # K tiles are int32 words of exponents
    assert not T.TcConfig(32, 64, 128, 64).fits(1024, 4096)  # 128 * 64 does not divide 4096
    assert not T.TcConfig(32, 128).fits(64, 4096)
    assert T.TcConfig(32, 64, 128, 4).grid(40, 4, 1024) == (2, 64, 4)


@needs_kernels
def test_tc_bad_configs_raise_value_error(gen):
    twin = random_twin(2, R_SMALL, D_SMALL, gen)
    x = _x(20, 2, D_SMALL, gen, False)
    with pytest.raises(ValueError, match="does not tile"):
        K.wo_a(x, twin, config=T.TcConfig(32, 128))  # 128 rows of a 64-row weight
    with pytest.raises(ValueError, match="tc path"):
        K.wo_a(x, twin, config=T.TcConfig(32, 64), path="mid")
    with pytest.raises(ValueError, match="TcConfig"):
        K.wo_a(x, twin, config=K.KernelConfig(32, 64, 128), path="tc")


@needs_kernels
def test_dispatcher_runs_tc_rows_and_matches_fp64(monkeypatch, gen):
    """Rows in TC_TABLE take the tc path (G=2 here; other G use the G=4 entries) at the test shape."""
    monkeypatch.setattr(K._wg, "available", lambda device: False)  # the paths below wg (issue 26, fifth session)
    monkeypatch.setattr(K._gluon, "available", lambda device: False)
    lo, hi, _ = K.TC_TABLE[2][0]
    assert K.select_path(lo, 2, DEVICE) == "tc" and K.select_path(hi, 2, DEVICE) == "tc"
    assert K.select_path(hi + 1, 2, DEVICE) != "tc"
    calls = []
    real = T.launch
    monkeypatch.setattr(T, "launch", lambda *a: calls.append(a[-1]) or real(*a))
    twin = random_twin(2, R_SMALL, D_SMALL, gen)
    x = _x(lo, 2, D_SMALL, gen, True)
    y = torch.full((lo, 2, R_SMALL), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    K.wo_a(x, twin, out=y)
    want = K.tc_config(lo, 2, R_SMALL, D_SMALL)
    assert calls and calls[0] == (want if T.tma_ok(x) else replace(want, tma=False))  # odd x: no descriptors
    assert_close_to_fp64(y, x, K.dequantize(twin), gen.initial_seed())


@needs_kernels
def test_tc_kernel_that_cannot_run_falls_back_once(monkeypatch, gen, caplog):
    """A tc kernel that raises at compile or launch is logged once; the rows run mid from then on (an
    explicit path= still raises)."""
    monkeypatch.setattr(K._wg, "available", lambda device: False)  # the paths below wg (issue 26, fifth session)
    monkeypatch.setattr(K._gluon, "available", lambda device: False)
    monkeypatch.setattr(K, "_FAILED", {})
    lo = K.TC_TABLE[2][0][0]

    def broken(*args):
        raise RuntimeError("PassManager::run failed (sm_121a)")

    monkeypatch.setattr(T, "launch", broken)
    twin = random_twin(2, R_SMALL, D_SMALL, gen)
    x = _x(lo, 2, D_SMALL, gen, False)
    with caplog.at_level(logging.WARNING, logger="wo_a_w8"):
        first = K.wo_a(x, twin)
        second = K.wo_a(x, twin)
    lines = [r.getMessage() for r in caplog.records if "cannot run" in r.getMessage()]
    assert len(lines) == 1 and "the tc kernel" in lines[0] and "PassManager" in lines[0]
    assert K.select_path(lo, 2, DEVICE) == "mid"
    assert torch.equal(bits(first), bits(second))
    assert_close_to_fp64(first, x, K.dequantize(twin), gen.initial_seed())
    with pytest.raises(RuntimeError):
        K.wo_a(x, twin, path="tc")


def test_tables_from_the_h200_sweep():
    """TC_TABLE and PREFILL_BATCHED are what the sweep's rule picks from the stored H200 sweep."""
    import wo_a_tc_sweep as S

    tables = S.choose_tables(json.loads(SWEEP.read_text())["rows"])
    want_tc = {g: [[lo, hi, asdict(c)] for lo, hi, c in K.TC_TABLE[g]] for g in K.TC_TABLE}
    assert {int(g): v for g, v in tables["tc"].items()} == want_tc
    want_pf = {g: [list(r) for r in K.PREFILL_BATCHED[g]] for g in K.PREFILL_BATCHED}
    assert {int(g): v for g, v in tables["prefill_batched"].items()} == want_pf
    for g, buckets in tables["buckets"].items():
        for b in buckets:  # a bucket only leaves its baseline (wide/mid, per-group prefill) for a > 5% gain
            assert b["baseline_us"] is None or b["us"] == b["baseline_us"] or b["us"] * 1.05 < b["baseline_us"], b
            # tc replaces mid, or keeps a tc bucket whose installed tiling was timed in the same run
            assert b["path"] != "tc" or b["baseline_us"] is None or b["baseline"] in ("mid", "tc"), b


@needs_kernels
def test_tc_descriptor_tiling_with_odd_x_runs_without_descriptors(monkeypatch, gen):
    """A TC_TABLE tiling with tensor descriptors, x that no descriptor can read (strides not multiples of
    8 elements): the dispatcher runs the same tiling without them, within bf16 rounding of fp64; an
    explicit descriptor config with such x is a clear ValueError."""
    monkeypatch.setattr(K._gluon, "available", lambda device: False)
    cfg = T.TcConfig(32, 64, 128, 2, bf16_scale=False, tma=True)
    monkeypatch.setitem(K.TC_TABLE, 2, ((17, 64, cfg),))
    calls = []
    real = T.launch
    monkeypatch.setattr(T, "launch", lambda *a: calls.append(a[-1]) or real(*a))
    twin = random_twin(2, R_SMALL, D_SMALL, gen)
    x = odd_x(20, 2, D_SMALL, gen)
    assert not T.tma_ok(x)
    y = torch.full((20, 2, R_SMALL), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    K.wo_a(x, twin, out=y)
    assert calls == [T.TcConfig(32, 64, 128, 2, bf16_scale=False, tma=False)]
    assert_close_to_fp64(y, x, K.dequantize(twin), gen.initial_seed())
    with pytest.raises(ValueError, match="descriptor"):
        K.wo_a(x, twin, config=cfg)


def test_tc_config_tma_rules():
    assert T.TcConfig(32, 64, bf16_scale=False, tma=True).fits(1024, 4096)
    assert not T.TcConfig(32, 64, tma=True).fits(1024, 4096)  # descriptors: the fp32 scale multiply only
    assert not T.TcConfig(32, 64, bf16_scale=False, sub_blocks=True, tma=True).fits(1024, 4096)


def test_benchmark_flags_kernel_fallbacks():
    """A kernel that fell back during a benchmark run is reported, and the run exits 1: the rows after
    it were timed on the next path (a broken mid kernel once hid behind one log line)."""
    import wo_a_bench as B

    assert B.fallback_report({}) == ({}, [])
    report, lines = B.fallback_report({("mid", "NVIDIA H200"): "CompilationError: at 18:4"})
    assert report == {"mid on NVIDIA H200": "CompilationError: at 18:4"}
    assert len(lines) == 1 and lines[0].startswith("FALLBACK: the mid on NVIDIA H200 kernel failed")


@needs_gpu
@pytest.mark.parametrize("groups", [2, 4])
def test_tc_table_full_shape(groups, gen):
    """Every TC_TABLE entry (G=4 runs the G=2 tilings too) at 1024 x 4096: fp64 error, written, deterministic."""
    for lo, hi, cfg in K.TC_TABLE[2]:
        for m in (lo, hi):
            twin = random_twin(groups, 1024, 4096, gen)
            x = _x(m, groups, 4096, gen, False)
            y = torch.full((m, groups, 1024), float("nan"), dtype=torch.bfloat16, device=DEVICE)
            K.wo_a(x, twin, out=y, config=cfg)
            assert_close_to_fp64(y, x, K.dequantize(twin), gen.initial_seed())
            for _ in range(3):
                assert torch.equal(bits(K.wo_a(x, twin, config=cfg)), bits(y))


@needs_gpu
@pytest.mark.parametrize("groups, m", [(2, 512), (4, 300), (4, 1024)])
def test_batched_prefill_full_shape(groups, m, gen, monkeypatch):
    """The batched prefill (one dequantise launch, one batched GEMM) is within bf16 rounding of fp64,
    reproducible bit for bit, and what the dispatcher runs without the weight where PREFILL_BATCHED says
    (and where the wg path is not installed or cannot run)."""
    monkeypatch.setattr(K._wg, "available", lambda device: False)  # the paths below wg (issue 26, fifth session)
    twin = random_twin(groups, 1024, 4096, gen)
    x = _x(m, groups, 4096, gen, False)
    y = torch.full((m, groups, 1024), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    K.prefill(x, twin, y, batched=True)
    assert_close_to_fp64(y, x, K.dequantize(twin), gen.initial_seed())
    assert torch.equal(bits(K.prefill(x, twin, batched=True)), bits(y))
    assert K._prefill_batched(m, groups)  # every case above is in the table: the dispatcher runs it
    assert torch.equal(bits(K.wo_a(x, twin)), bits(y))

