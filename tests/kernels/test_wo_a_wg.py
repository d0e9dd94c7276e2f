"""Issue 26, fifth session: the wg path (kernels/wo_a_wg.py, a Gluon wgmma kernel for sm_90).

Gluon has no CPU interpreter, so on the CPU these tests check the dispatcher around the kernel (its table
rebuilt from the stored H200 sweep, which rows it takes, the fallback when the kernel cannot run, the x it
refuses, bad configurations) under TRITON_INTERPRET=1 at small shapes, and compile the installed tilings for
sm_90 to check the machine code (wgmma, no local memory). On an H200 the kernel's numerics run: float64
reference, fresh random inputs, NaN-poisoned outputs, padded and odd strides, bitwise reproducibility."""
from __future__ import annotations

import json
import logging
import os
import subprocess
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
from kernels import wo_a_wg as W  # noqa: E402

from .test_wo_a_w8 import assert_close_to_fp64, bits, odd_x, random_twin  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

pytestmark = pytest.mark.kernels

GPU = torch.cuda.is_available() and not INTERPRET
DEVICE = "cuda" if GPU else "cpu"
WG = GPU and W.available(DEVICE)
needs_kernels = pytest.mark.skipif(not (GPU or INTERPRET), reason="no CUDA device and TRITON_INTERPRET is not set")
needs_wg = pytest.mark.skipif(not WG, reason="the wg kernel needs an sm_90 GPU")
SWEEP = ROOT / "docs" / "measurements" / "wo_a_issue26_wg_sweep.json"
WS_SWEEP = ROOT / "docs" / "measurements" / "wo_a_issue26_ws_sweep.json"  # sixth session, over SWEEP's table

R_SMALL, D_SMALL = 64, 512


@pytest.fixture
def gen():
    seed = int.from_bytes(os.urandom(4), "little")
    return torch.Generator(device=DEVICE).manual_seed(seed)


def _x(m, groups, cols, gen, pad=0):
    """x [m, groups, cols] bf16; with ``pad`` a view of a wider buffer (token stride G*cols + pad)."""
    big = torch.randn((m, groups * cols + pad), generator=gen, device=DEVICE, dtype=torch.float32).to(torch.bfloat16)
    return big[:, : groups * cols].view(m, groups, cols) if not pad else \
        big.as_strided((m, groups, cols), (groups * cols + pad, cols, 1))


def _small_first_run(groups, m, cfg, pad, gen):
    """A small twin and x, one call into a NaN-poisoned out= with `cfg`: out is returned and within the float64
    bound. Returns (twin, x, y) for the determinism checks."""
    twin = random_twin(groups, R_SMALL, D_SMALL, gen)
    x = _x(m, groups, D_SMALL, gen, pad)
    y = torch.full((m, groups, R_SMALL), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    assert K.wo_a(x, twin, out=y, config=cfg) is y
    assert_close_to_fp64(y, x, K.dequantize(twin), gen.initial_seed())
    return twin, x, y


def test_table_from_the_h200_sweep():
    """WG_TABLE is what the sweep's rule picks from the stored H200 sweeps (the sixth session's warp-specialised
    sweep laid over the fifth session's table it was timed against); every entry tiles the full shape."""
    import wo_a_wg_sweep as S

    table = S.overlay_wg_table(S.choose_wg_table(json.loads(SWEEP.read_text())["rows"]),
                               S.choose_wg_table(json.loads(WS_SWEEP.read_text())["rows"]))
    assert {int(g): v for g, v in table.items()} == \
        {g: [[lo, hi, asdict(c)] for lo, hi, c in K.WG_TABLE[g]] for g in K.WG_TABLE}
    for g, entries in K.WG_TABLE.items():
        assert entries[0][0] > K.WIDE_MAX_M.get(g, 32)  # the ring paths keep 1..32 rows
        for (lo, hi, cfg), nxt in zip(entries, entries[1:] + ((None, None, None),)):
            assert cfg.fits(1024, 4096) and (hi is None or lo <= hi)
            assert nxt[0] is None or nxt[0] == hi + 1  # contiguous, no overlap
    rows = json.loads(SWEEP.read_text())["rows"] + json.loads(WS_SWEEP.read_text())["rows"]
    for r in rows:  # every timed candidate was checked first: written, deterministic, within 1e-2
        if r.get("wg_us"):
            assert r["written"] and r["deterministic"] and r["rel_err_vs_fp64"] <= 1e-2


def test_sweeps_share_one_compile_worker():
    """wo_a_bench, wo_a_tc_sweep and wo_a_wg_sweep compile through one worker (wo_a_bench.compile_worker),
    each with its own module-level launch function, which must pickle by name for the spawned processes."""
    import functools
    import pickle

    import wo_a_bench as B
    import wo_a_tc_sweep as TS
    import wo_a_wg_sweep as S

    for mod in (B, TS, S):
        assert not hasattr(mod, "_compile_worker"), mod.__name__
    for launch in (B.launch_dispatcher, TS.launch_tc, S.launch_wg):
        job = pickle.loads(pickle.dumps(functools.partial(B.compile_worker, launch)))
        assert job.func is B.compile_worker and job.args == (launch,)


def test_overlay_wg_table():
    """A later sweep's ranges replace what the base table held there, cutting base ranges around them."""
    import wo_a_wg_sweep as S

    a, b, c = {"t": 1}, {"t": 2}, {"t": 3}
    base = {2: [[33, 64, a], [65, 512, b], [513, None, a]]}
    assert S.overlay_wg_table(base, {2: [[100, 200, c]]}) == \
        {2: [[33, 64, a], [65, 99, b], [100, 200, c], [201, 512, b], [513, None, a]]}
    assert S.overlay_wg_table(base, {2: [[513, None, b]]}) == {2: [[33, 64, a], [65, None, b]]}
    assert S.overlay_wg_table(base, {4: [[33, None, c]]}) == {**base, 4: [[33, None, c]]}


def test_config_rules():
    assert W.WgConfig().fits(1024, 4096)
    assert not W.WgConfig(block_n=48).fits(1024, 4096)       # Gluon tiles are powers of two
    assert not W.WgConfig(block_r=32).fits(1024, 4096)       # a warpgroup's wgmma has 64 rows
    assert not W.WgConfig(split_k=128).fits(1024, 4096)      # K range shorter than one K step
    assert not W.WgConfig(block_k=128, block_n=256, stages=6).fits(1024, 4096)  # shared memory
    assert W.WgConfig(64, 64, 128, 2, 8).row_warps == 4      # 8 warps on 64 rows: two split the tokens
    assert W.WgConfig(64, 64).grid(100, 4, 1024) == (64, 2, 4)
    assert W.WgConfig(decoders=4).fits(1024, 4096) and W.WgConfig(decoders=8).fits(1024, 4096)
    assert not W.WgConfig(decoders=2).fits(1024, 4096)       # warp-specialised: 4 or 8 decode warps


def test_select_path_takes_wg_rows_where_it_can_run(monkeypatch):
    monkeypatch.setattr(K._gluon, "available", lambda device: True)
    monkeypatch.setattr(K._wg, "available", lambda device: True)
    monkeypatch.setattr(K, "_FAILED", {})
    assert [K.select_path(m, 4, "cuda") for m in (16, 32, 33, 64, 192, 193, 4096)] == \
        ["gluon", "wide", "wg", "wg", "wg", "wg", "wg"]
    assert [K.select_path(m, 2, "cuda") for m in (33, 512, 513)] == ["wg", "wg", "wg"]  # 513+: sixth session
    monkeypatch.setattr(K._wg, "available", lambda device: False)  # not sm_90: tc / einsum as before
    assert [K.select_path(m, 4, "cuda") for m in (33, 193)] == ["tc", "einsum"]


@needs_kernels
def test_wg_failure_falls_back_once(monkeypatch, gen, caplog):
    """A wg kernel that raises at compile or launch is logged once; the rows run the next path (tc here)
    from then on, with a correct result; an explicit path= still raises."""
    monkeypatch.setattr(K._gluon, "available", lambda device: False)
    monkeypatch.setattr(K._wg, "available", lambda device: True)
    monkeypatch.setattr(K, "_FAILED", {})
    calls = []

    def broken(*args):
        calls.append(args[-1])
        raise RuntimeError("PassManager::run failed (sm_121a: no wgmma)")

    monkeypatch.setattr(W, "launch", broken)
    twin = random_twin(2, R_SMALL, D_SMALL, gen)
    x = _x(40, 2, D_SMALL, gen)
    assert K.select_path(40, 2, DEVICE) == "wg"
    with caplog.at_level(logging.WARNING, logger="wo_a_w8"):
        first = K.wo_a(x, twin, out=torch.full((40, 2, R_SMALL), float("nan"), dtype=torch.bfloat16, device=DEVICE))
        second = K.wo_a(x, twin)
    assert calls == [K.wg_config(40, 2, R_SMALL, D_SMALL)], "a failed kernel must not be retried"
    lines = [r.getMessage() for r in caplog.records if "cannot run" in r.getMessage()]
    assert len(lines) == 1 and "the wg kernel" in lines[0] and "PassManager" in lines[0]
    assert K.select_path(40, 2, DEVICE) == "tc"
    assert torch.equal(bits(first), bits(second))
    assert_close_to_fp64(first, x, K.dequantize(twin), gen.initial_seed())
    with pytest.raises(RuntimeError):
        K.wo_a(x, twin, path="wg")


@needs_kernels
def test_warp_specialised_failure_falls_back_to_one_partition(monkeypatch, gen, caplog):
    """A warp-specialised tiling (decoders > 0) that raises at compile or launch is logged once as the
    wg_ws kernel; the rows run the same tiling on the one-partition wg kernel from then on (not tc), and a
    later failure of that kernel still falls to the next path."""
    monkeypatch.setattr(K._gluon, "available", lambda device: False)
    monkeypatch.setattr(K._wg, "available", lambda device: True)
    monkeypatch.setattr(K, "_FAILED", {})
    ws = W.WgConfig(64, 64, 128, 1, 4, 4, True, 4)
    monkeypatch.setattr(K, "WG_TABLE", {g: ((33, None, ws),) for g in (2, 4)})
    calls = []

    def one_partition_only(x, twin, y, cfg):
        calls.append(cfg)
        if cfg.decoders:
            raise RuntimeError("warp_specialize: setmaxnreg not supported (sm_121a)")
        y.copy_(torch.einsum("tgd,grd->tgr", x.double(), K.dequantize(twin).double()).to(y.dtype))
        return y

    monkeypatch.setattr(W, "launch", one_partition_only)
    twin = random_twin(2, R_SMALL, D_SMALL, gen)
    x = _x(40, 2, D_SMALL, gen)
    with caplog.at_level(logging.WARNING, logger="wo_a_w8"):
        first = K.wo_a(x, twin)
        second = K.wo_a(x, twin)
    assert calls == [ws, replace(ws, decoders=0), replace(ws, decoders=0)], calls
    lines = [r.getMessage() for r in caplog.records if "cannot run" in r.getMessage()]
    assert len(lines) == 1 and "the wg_ws kernel" in lines[0] and "setmaxnreg" in lines[0]
    assert K.select_path(40, 2, DEVICE) == "wg"
    assert torch.equal(bits(first), bits(second))
    assert_close_to_fp64(first, x, K.dequantize(twin), gen.initial_seed())


@needs_kernels
def test_x_the_descriptor_cannot_read_runs_the_next_path(monkeypatch, gen):
    """Odd strides (groups not contiguous) or block scales above the decode's range: wg is skipped
    without a launch, the next path computes the right result; asked for explicitly it is a ValueError."""
    monkeypatch.setattr(K._gluon, "available", lambda device: False)
    monkeypatch.setattr(K._wg, "available", lambda device: True)
    monkeypatch.setattr(K, "_FAILED", {})
    calls = []
    monkeypatch.setattr(W, "launch", lambda *a: calls.append(a) or pytest.fail("wg launched"))
    twin = random_twin(2, R_SMALL, D_SMALL, gen)
    x = odd_x(40, 2, D_SMALL, gen)
    assert not W.wg_ok(x, twin)
    y = K.wo_a(x, twin, out=torch.full((40, 2, R_SMALL), float("nan"), dtype=torch.bfloat16, device=DEVICE))
    assert_close_to_fp64(y, x, K.dequantize(twin), gen.initial_seed())
    with pytest.raises(ValueError, match="wg path needs x"):
        K.wo_a(x, twin, path="wg")
    big = random_twin(2, R_SMALL, D_SMALL, gen, lo=130, hi=140)  # scales up to 2**12: beyond the decode
    xa = _x(40, 2, D_SMALL, gen)
    assert W.wg_ok(xa, twin) and not W.wg_ok(xa, big)
    assert_close_to_fp64(K.wo_a(xa, big), xa, K.dequantize(big), gen.initial_seed())
    assert not calls


@needs_kernels
def test_prefill_with_the_weight_stays_on_the_einsum(monkeypatch, gen):
    """Above MID_MAX_M rows the wg path serves only callers without the bf16 weight."""
    monkeypatch.setattr(K._wg, "available", lambda device: True)
    monkeypatch.setattr(W, "launch", lambda *a: pytest.fail("wg launched"))
    twin = random_twin(4, R_SMALL, D_SMALL, gen)
    w = K.dequantize(twin)
    x = _x(K.MID_MAX_M + 1, 4, D_SMALL, gen)
    assert torch.equal(bits(K.wo_a(x, twin, w)), bits(torch.einsum("tgd,grd->tgr", x, w)))


def test_bad_wg_requests_raise_value_error(gen):
    twin = random_twin(2, R_SMALL, D_SMALL, gen)
    x = _x(40, 2, D_SMALL, gen)
    if not WG:
        with pytest.raises(ValueError, match="sm_90"):
            K.wo_a(x, twin, path="wg")
        with pytest.raises(ValueError, match="sm_90"):
            W.launch(x, twin, torch.empty((40, 2, R_SMALL), dtype=torch.bfloat16), W.WgConfig())
    with pytest.raises(ValueError):
        K.wo_a(x, twin, path="tc", config=W.WgConfig())
    with pytest.raises(ValueError):
        K.wo_a(x, twin, path="wg", config=T.TcConfig(32, 64))


# the warp-specialised kernel's tilings (sixth session) compiled on the CPU and run at full shape on the GPU
WS_SHAPES = (W.WgConfig(64, 64, 128, 2, 4, 6, True, 4), W.WgConfig(64, 128, 128, 2, 4, 4, True, 8),
             W.WgConfig(128, 128, 64, 1, 8, 4, False, 4), W.WgConfig(128, 256, 64, 1, 8, 4, False, 4, False))


SASS_SCRIPT = """
import json, re, subprocess, sys, tempfile
from pathlib import Path
import triton
sys.path[:0] = [sys.argv[2], sys.argv[2] + "/benchmarks"]
import wo_a_wg_compile as C
from kernels import wo_a_wg as W
k = C.compile_cfg(W.WgConfig(**json.loads(sys.argv[1])))
tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
f = tempfile.NamedTemporaryFile(suffix=".cubin", delete=False); f.write(k.asm["cubin"]); f.close()
res = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
sass = subprocess.run([str(tool), "--dump-sass", f.name], capture_output=True, text=True).stdout
print(json.dumps({"stack": re.findall(r"STACK:(\\d+)", res), "local": re.findall(r"LOCAL:(\\d+)", res),
                  "hgmma": sass.count("HGMMA"), "utmaldg": sass.count("UTMALDG"), "ldl": sass.count("LDL")}))
"""


def test_installed_tilings_compile_to_wgmma_for_sm90():
    """The table's tilings compiled for sm_90 on this machine: wgmma (HGMMA) fed by the bulk tensor copy
    (UTMALDG), no large spill. (A clean interpreter: TRITON_INTERPRET would swap the language.)"""
    import triton

    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump").exists():
        pytest.skip("no cuobjdump in this Triton")
    if W.gluon is None:
        pytest.skip("Triton without Gluon's Hopper module")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    seen = [WS_SHAPES[-1]]  # and the warp-specialised kernel without a TMA warp (the table has one with)
    for g in (2, 4):
        for _, _, cfg in K.WG_TABLE[g]:
            if cfg not in seen:
                seen.append(cfg)
    for cfg in seen:
        out = subprocess.run([sys.executable, "-c", SASS_SCRIPT, json.dumps(asdict(cfg)), str(ROOT)], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        info = json.loads(out.stdout.strip().splitlines()[-1])
        assert info["hgmma"] > 0 and info["utmaldg"] > 0, (cfg, info)
        # at most a small spill: the 128-token tilings keep 104 bytes on the stack under the H200's
        # Triton 3.6 (40 under 3.9), measured as they are; a register array in local memory shows as far more
        assert max(int(s) for s in info["stack"] or ["0"]) <= 128 and set(info["local"]) <= {"0"}, (cfg, info)


# ------------------------------------------------------------------------------------------ GPU (sm_90)


@needs_wg
@pytest.mark.parametrize("groups, m, cfg, pad", [
    (2, 40, W.WgConfig(64, 64, 128, 2, 4, 4, True, 4), 0),     # split-K 2, one token tile, 4 decode warps
    (4, 100, W.WgConfig(64, 64, 64, 4, 4, 4, False, 8), 64),   # two token tiles, 8 decode warps, padded x
    (2, 17, W.WgConfig(64, 32, 128, 1, 4, 3, True, 4), 8),     # no split, the ring wraps (4 steps, 3 slots)
    (4, 33, W.WgConfig(64, 64, 64, 1, 4, 3, True, 8), 0),      # 8 steps through 3 slots and 3 buffers
    (2, 40, W.WgConfig(64, 64, 64, 1, 4, 4, True, 4, False), 0),   # no TMA warp: the decoders copy, 8 steps
    (4, 70, W.WgConfig(64, 64, 128, 1, 4, 3, False, 8, False), 8),  # no TMA warp, 2 token tiles, padded x
])
def test_warp_specialised_kernel_small_shapes(groups, m, cfg, pad, gen):
    """decoders > 0: the TMA warp, the decode warps and the wgmma warps meet on mbarriers; against float64,
    every output written, run to run bit for bit, and the one-partition kernel's bits (same sums, same order)."""
    twin, x, y = _small_first_run(groups, m, cfg, pad, gen)
    for _ in range(3):
        assert torch.equal(bits(K.wo_a(x, twin, path="wg", config=cfg)), bits(y))
    assert torch.equal(bits(K.wo_a(x, twin, config=replace(cfg, decoders=0, tma_warp=True))), bits(y))
    assert int(twin.semaphores.abs().sum()) == 0


@needs_wg
@pytest.mark.parametrize("groups", [2, 4])
@pytest.mark.parametrize("cfg", WS_SHAPES, ids=str)
def test_warp_specialised_kernel_full_shape(groups, cfg, gen):
    """The warp-specialised kernel at 1024 x 4096 (up to 64 K steps through the ring) for 48 and 160 rows."""
    twin = random_twin(groups, 1024, 4096, gen)
    w = K.dequantize(twin)
    for m in (48, 160):
        x = _x(m, groups, 4096, gen)
        y = torch.full((m, groups, 1024), float("nan"), dtype=torch.bfloat16, device=DEVICE)
        K.wo_a(x, twin, out=y, config=cfg)
        assert_close_to_fp64(y, x, w, gen.initial_seed())
        assert torch.equal(bits(K.wo_a(x, twin, config=cfg)), bits(y))
        assert torch.equal(bits(K.wo_a(x, twin, config=replace(cfg, decoders=0, tma_warp=True))), bits(y))


@needs_wg
@pytest.mark.parametrize("groups, m, cfg, pad", [
    (2, 40, W.WgConfig(64, 64, 128, 2, 4, 4), 0),            # split-K 2, one token tile
    (4, 100, W.WgConfig(64, 64, 64, 4, 8, 4), 64),           # two token tiles, 8 warps split the tokens
    (2, 17, W.WgConfig(64, 32, 128, 1, 4, 3, pdl=False), 8),  # no split, plain launch, padded token stride
])
def test_wg_kernel_small_shapes(groups, m, cfg, pad, gen):
    twin, x, y = _small_first_run(groups, m, cfg, pad, gen)
    for _ in range(3):
        again = torch.full_like(y, float("nan"))
        K.wo_a(x, twin, out=again, path="wg", config=cfg)
        assert torch.equal(bits(again), bits(y))
    assert int(twin.semaphores.abs().sum()) == 0  # every split-K counter reset for the next launch


@needs_wg
@pytest.mark.parametrize("groups", [2, 4])
def test_wg_table_full_shape(groups, gen):
    """Every WG_TABLE entry of this G at 1024 x 4096, at both ends of its range, through the dispatcher
    without the weight: float64 error, every output written, bitwise reproducible, and the einsum on the
    bf16 weight where that is held (prefill rows). Odd-strided x runs the next path, also correctly."""
    twin = random_twin(groups, 1024, 4096, gen)
    w = K.dequantize(twin)
    for lo, hi, cfg in K.WG_TABLE[groups]:
        for m in (lo, hi or 1024):
            assert K.select_path(m, groups, DEVICE) == "wg"
            x = _x(m, groups, 4096, gen)
            y = torch.full((m, groups, 1024), float("nan"), dtype=torch.bfloat16, device=DEVICE)
            K.wo_a(x, twin, out=y)
            assert_close_to_fp64(y, x, w, gen.initial_seed())
            for _ in range(3):
                assert torch.equal(bits(K.wo_a(x, twin)), bits(y))
            assert torch.equal(bits(K.wo_a(x, twin, config=replace(cfg, pdl=not cfg.pdl))), bits(y))
            xo = odd_x(m, groups, 4096, gen)
            assert_close_to_fp64(K.wo_a(xo, twin), xo, w, gen.initial_seed())
