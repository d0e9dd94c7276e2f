"""The gluon path (kernels/wo_a_gluon.py): machine code checked on the CPU, results on a GPU.

Gluon has no CPU interpreter, so CI compiles the kernel for sm_90 with the installed Triton (its
bundled ptxas and cuobjdump) and checks what the round-4 measurements rest on: tensor-core mma,
8-byte weight loads, no slow fp16 -> bf16 conversions, no local memory. On an sm_89+ GPU the kernel
runs against a float64 reference (odd strides, NaN-poisoned output, bitwise repeatable)."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="kernel tests need torch: pip install -r requirements-kernels.txt")
triton = pytest.importorskip("triton", reason="kernel tests need triton: pip install -r requirements-kernels.txt")

from kernels import wo_a_gluon as GL  # noqa: E402
from kernels import wo_a_w8 as K  # noqa: E402

pytestmark = pytest.mark.kernels
ROOT = Path(__file__).resolve().parents[2]

GPU = GL.available("cuda") if torch.cuda.is_available() else False
needs_gluon_gpu = pytest.mark.skipif(not GPU, reason="needs a CUDA GPU of compute capability 8.9+ (not interpreting)")
needs_gluon = pytest.mark.skipif(GL.gluon is None, reason="this Triton has no Gluon")


SASS_SCRIPT = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from kernels import wo_a_gluon as GL
cfg = json.loads(sys.argv[1])
sig = {"x_ptr": "*bf16", "w_ptr": "*fp8e4nv", "e_ptr": "*u8", "y_ptr": "*bf16", "M": "i32", "R": "i32",
       "stride_xm": "i32", "stride_xg": "i32", "stride_ym": "i32", "stride_yg": "i32"}
sig.update({name: "constexpr" for name in cfg})
attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 5)}  # pointers and R; x strides may be odd
src = GluonASTSource(fn=GL._wo_a_gluon_kernel, signature=sig, constexprs=cfg, attrs=attrs)
kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg["NW"] * cfg.get("RH", 1)})
sys.stdout.buffer.write(kernel.asm["cubin"])
"""


def sass_of(cfg: GL.GluonConfig | None, cols: int = 4096, script: str = SASS_SCRIPT, consts: dict | None = None) -> str:
    """Compile for sm_90 in a clean interpreter (TRITON_INTERPRET would swap the language's functions)
    and disassemble with the cuobjdump that ships inside Triton."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        pytest.skip(f"no cuobjdump in this Triton ({tool})")
    consts = consts or {"D": cols, "NW": cfg.num_warps, "KW": cfg.k_width, "BLOCK_M": cfg.block_m,
                        "BLOCKS": cfg.blocks, "BLOCK_R": cfg.block_r}
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    built = subprocess.run([sys.executable, "-c", script, json.dumps(consts)], capture_output=True, env=env,
                           timeout=600)
    assert built.returncode == 0 and built.stdout, built.stderr.decode(errors="replace")[-3000:]
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(built.stdout)
        cubin.flush()
        return subprocess.run([str(tool), "-sass", cubin.name], capture_output=True, text=True, check=True).stdout


@needs_gluon
@pytest.mark.parametrize("cfg", [GL.GluonConfig(block_r=32, block_m=8), GL.GluonConfig(block_r=16, block_m=16)],
                         ids=["r32-m8", "r16-m16"])
def test_sm90_machine_code(cfg):
    sass = sass_of(cfg)
    ops = Counter(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", sass, re.M))
    assert ops, "no instructions disassembled"
    per_k_block = cfg.block_r // 16 * cfg.block_m // 8 * 2  # m16n8k16 per warp and 32-wide K block
    assert ops["HMMA.16816.F32.BF16"] == per_k_block * cfg.blocks, ops
    # weights: one 8-byte load per thread, row and K block (k_width 8); no byte-wise weight loads
    assert ops["LDG.E.64"] == cfg.block_r // 16 * 2 * cfg.blocks, ops
    assert not any(op.startswith("F2F.BF16.F16") for op in ops), "slow fp16 -> bf16 conversions are back"
    assert not any(op.startswith(("LDL", "STL")) for op in ops), "registers spilled to local memory"


RING_SASS_SCRIPT = SASS_SCRIPT.replace('"*u8"', '"*i32"').replace('"*fp8e4nv"', '"*u8"').replace("GL._wo_a_gluon_kernel", "GL._wo_a_ring_kernel") \
    .replace("(0, 1, 2, 3, 5)", "(0, 1, 2, 3, 5, 6, 7)")  # the ring needs x strides divisible by 16


def ring_sass_of(cfg: GL.RingConfig, cols: int = 4096) -> str:
    consts = {"D": cols, "NW": cfg.num_warps, "BLOCK_M": cfg.block_m, "BLOCK_R": cfg.block_r, "S": cfg.stages,
              "SB": cfg.sb, "PDL": cfg.pdl, "RH": cfg.row_warps}
    return sass_of(None, cols, script=RING_SASS_SCRIPT, consts=consts)


@needs_gluon
@pytest.mark.parametrize("cfg", [GL.RingConfig(16, 8, 4, 2, 10, pdl=True), GL.RingConfig(16, 16, 4, 2, 8, pdl=True),
                                 GL.PDL_WIDE[8], GL.PDL_WIDE[16], GL.RingConfig(32, 16, 4, 2, 10, pdl=True)],
                         ids=["m8", "m16", "wide8", "wide16", "rows32"])
def test_ring_pdl_machine_code(cfg):
    """A PDL launch lets the next kernel start (PREEXIT) and waits for the previous one (ACQBULK) once,
    after requesting exactly the first S - 1 stages of weights and before any copy of x; the plain
    kernel has neither instruction."""
    sass = ring_sass_of(cfg)
    assert sass.count("PREEXIT") == 1 and sass.count("ACQBULK") == 1, "one launch_dependents and one wait"
    before, after = sass.split("ACQBULK")
    weights_per_stage = cfg.sb * cfg.block_r // 16 // cfg.row_warps  # a warp copies its own rows' tiles
    assert before.count("LDGSTS.E.BYPASS.128") == (cfg.stages - 1) * weights_per_stage, "only weights before the wait"
    blocks = 4096 // cfg.num_warps // 32  # K blocks per warp
    assert after.count("LDGSTS.E.BYPASS.128") == blocks * (cfg.block_r // 16 // cfg.row_warps + cfg.block_m // 8) - \
        (cfg.stages - 1) * weights_per_stage
    plain = ring_sass_of(GL.RingConfig(cfg.block_r, cfg.block_m, 4, 2, cfg.stages, row_warps=cfg.row_warps))
    assert "ACQBULK" not in plain and "PREEXIT" not in plain


@needs_gluon
@pytest.mark.parametrize("cfg", [GL.RingConfig(16, 8, 4, 2, 8), GL.RingConfig(32, 16, 4, 2, 6)], ids=["m8", "m16"])
def test_ring_sm90_machine_code(cfg):
    """Every weight byte and x value goes global -> shared by 16-byte cp.async (lane-ordered tiles)
    and comes back by one 16-byte shared load per thread and block; the decode is integer and bf16 fma
    work (no conversion-pipe instructions); one barrier per ring stage; no spills."""
    sass = ring_sass_of(cfg)
    ops = Counter(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", sass, re.M))
    blocks = 4096 // cfg.num_warps // 32  # K blocks per warp
    tiles, xt = cfg.block_r // 16, cfg.block_m // 8
    assert ops["HMMA.16816.F32.BF16"] == blocks * tiles * xt * 2, ops
    assert ops["LDGSTS.E.BYPASS.128"] == blocks * (tiles + xt), ops
    assert ops["LDS.128"] >= blocks * (tiles + xt), ops
    assert ops["HMUL2.BF16_V2"] == blocks * tiles * 8, ops  # one per weight pair of the thread
    assert not any(op.startswith(("LDG.E", "LDGSTS.E.64")) for op in ops), "a weight or x load bypasses the ring"
    assert not any(op.startswith(("F2FP.F16.E4M3", "F2F.BF16", "HADD2.F32")) for op in ops), "cvt decode is back"
    assert sum(n for op, n in ops.items() if op.startswith("F2F")) <= cfg.block_r * cfg.block_m, ops  # epilogue
    assert not any(op.startswith(("LDL", "STL")) for op in ops), "registers spilled to local memory"
    body = sass[sass.index("HMMA"):sass.rindex("HMMA")]
    stages = blocks // cfg.sb
    assert body.count("BAR.SYNC") <= stages, f"{body.count('BAR.SYNC')} barriers for {stages} ring stages"


def decode_model(codes: torch.Tensor, exps: torch.Tensor) -> torch.Tensor:
    """The ring kernel's DECODE_ASM restated on the CPU (prmt with sign bytes, shift, mask, bf16 multiply
    by 2**(e - 7)), for codes uint8 [N] and exponents int [N] (e + 127)."""
    b = codes.to(torch.int32)
    spread = b | torch.where(b >= 128, 0xFF00, 0)  # the half prmt writes: the byte and its sign byte
    bits = (spread << 4) & 0x87F0
    low = bits.to(torch.int16).view(torch.bfloat16).float()  # exact in fp32, bf16 subnormals included
    scale = ((exps.to(torch.int32) + 120) << 23).view(torch.float32)  # the bf16x2 word's value, 2**(e - 7)
    return (low * scale).to(torch.bfloat16)


def test_decode_model_is_exact_for_every_code():
    finite = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    for e in (10, 60, 100, 120, 127, GL.RING_EXP_MAX):
        want = (finite.view(torch.float8_e4m3fn).float() * 2.0 ** (e - 127)).to(torch.bfloat16)
        got = decode_model(finite, torch.full((finite.numel(),), e))
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), e
    # one more and the scale word no longer fits a bf16 exponent: the dispatcher keeps such twins off the ring
    assert GL.RING_EXP_MAX + 120 == 254


def test_ring_config_rules():
    h200, gb10 = 227 * 1024, 99 * 1024
    cfg = GL.default_ring_config
    # G=4 on 132 SMs: 16-row programs up to 4 tokens, 32-row ones (128 programs) from 6 and for 9..16
    assert cfg(1, 4, 1024, 4096, 132, h200) == cfg(4, 4, 1024, 4096, 132, h200) == GL.RingConfig(16, 8, 4, 2, 8)
    assert cfg(6, 4, 1024, 4096, 132, h200) == cfg(8, 4, 1024, 4096, 132, h200) == GL.RingConfig(32, 8, 4, 2, 6)
    assert cfg(9, 4, 1024, 4096, 132, h200) == cfg(16, 4, 1024, 4096, 132, h200) == GL.RingConfig(32, 16, 4, 2, 6)
    # G=2: 64 wide programs would idle half the SMs
    assert cfg(8, 2, 1024, 4096, 132, h200) == GL.RingConfig(16, 8, 4, 2, 8)
    assert cfg(16, 2, 1024, 4096, 132, h200) == GL.RingConfig(16, 16, 4, 2, 8)
    # GB10 (48 SMs, ~99 KB per block): G=2 is wide there, and every choice fits
    for m in (1, 8, 16):
        for g in (2, 4):
            c = cfg(m, g, 1024, 4096, 48, gb10)
            assert c is not None and c.smem_bytes() + 1024 <= gb10 and c.fits(m, 1024, 4096), (m, g, c)
    assert cfg(16, 2, 1024, 4096, 48, gb10).block_r == 32
    small = cfg(4, 4, 1024, 4096, 132, 48 * 1024)
    assert small is not None and small.smem_bytes() + 1024 <= 48 * 1024
    assert cfg(17, 4, 1024, 4096, 132, h200) is None
    assert cfg(8, 4, 1024, 4096, 132, 8 * 1024) is None  # nothing fits: the register kernel
    assert cfg(8, 4, 1024, 96, 132, h200) is None  # K not a multiple of 128 per warp
    assert not GL.RingConfig(16, 8, 4, 2, 6).fits(9, 1024, 4096)


def test_ring_pdl_config_rules():
    """PDL launches: 16-row programs with the most measured stages that let exactly two programs share
    an SM (the running kernel's and the next one's), or where 32-row programs keep the SMs busy (G=4 on
    132 SMs) from 6 rows one such program per SM whose two row halves share x."""
    cfg = GL.default_ring_config
    h200 = dict(smem_limit=227 * 1024, pdl=True, smem_per_sm=228 * 1024)
    for g in (2, 4):
        assert cfg(1, g, 1024, 4096, 132, **h200) == cfg(4, g, 1024, 4096, 132, **h200) == \
            GL.RingConfig(16, 8, 4, 2, 10, pdl=True)
    assert cfg(8, 2, 1024, 4096, 132, **h200) == GL.RingConfig(16, 8, 4, 2, 10, pdl=True)
    # 6..16 rows: one 32-row program per SM at G=4 (128 programs keep 7/8 of 132 SMs busy), not at G=2
    assert cfg(6, 4, 1024, 4096, 132, **h200) == cfg(8, 4, 1024, 4096, 132, **h200) == GL.PDL_WIDE[8]
    assert cfg(9, 4, 1024, 4096, 132, **h200) == cfg(16, 4, 1024, 4096, 132, **h200) == GL.PDL_WIDE[16]
    assert all(c.row_warps == 2 and c.block_r == 32 and c.smem_bytes() + 1024 <= 227 * 1024
               for c in GL.PDL_WIDE.values())
    assert cfg(9, 2, 1024, 4096, 132, **h200) == cfg(16, 2, 1024, 4096, 132, **h200) == \
        GL.RingConfig(16, 16, 4, 2, 8, pdl=True)
    gb10 = dict(smem_limit=99 * 1024, pdl=True, smem_per_sm=100 * 1024)
    for m in (1, 8, 9, 16):  # neither PDL_WIDE fits 99 KB
        c = cfg(m, 4, 1024, 4096, 48, **gb10)
        assert c.pdl and c.block_r == 16 and 100 * 1024 // (c.smem_bytes() + 1024) == 2, (m, c)
    # nothing gives two per SM: the first that fits, still a PDL launch; nothing fits: round 6's rules
    assert cfg(4, 4, 1024, 4096, 132, 227 * 1024, pdl=True, smem_per_sm=0) == GL.RingConfig(16, 8, 4, 2, 10, pdl=True)
    assert cfg(4, 4, 1024, 4096, 132, 20 * 1024, pdl=True, smem_per_sm=20 * 1024) == \
        GL.RingConfig(16, 8, 4, 2, 2, pdl=True)
    assert cfg(17, 4, 1024, 4096, 132, **h200) is None
    assert cfg(4, 4, 1024, 4096, 132, 227 * 1024) == GL.RingConfig(16, 8, 4, 2, 8)  # pdl off: round 6


def test_ring_needs_aligned_x_strides():
    big = torch.zeros(4, 5, 4096 + 16, dtype=torch.bfloat16)
    codes = torch.zeros(4, 32, 4096, dtype=torch.uint8).view(torch.float8_e4m3fn)
    low = K.Twin(codes, torch.full((4, 1, 128), GL.RING_EXP_MAX, dtype=torch.uint8))
    high = K.Twin(codes, torch.full((4, 1, 128), GL.RING_EXP_MAX, dtype=torch.uint8).index_fill_(2, torch.tensor([7]),
                                                                                           GL.RING_EXP_MAX + 1))
    assert GL.ring_ok(big[:, 1:, :4096], low) and not GL.ring_ok(big[:, 1:, :4096], high)
    assert GL.ring_ok(big[:, 1:, :4096])
    assert GL.ring_ok(big[:, 1:, 8:8 + 4096])  # 16 bytes in: still aligned
    assert not GL.ring_ok(big[:, 1:, 4:4 + 4096])  # 8 bytes in
    odd = torch.zeros(4, 5, 4096 + 13, dtype=torch.bfloat16)
    assert not GL.ring_ok(odd[:, 1:, :4096])


def test_pack_tiles_round_trip():
    codes = torch.randint(0, 256, (2, 64, 256), dtype=torch.int32).to(torch.uint8)
    tiles = GL.pack_tiles(codes)
    assert tiles.shape == (8, 8, 512) and tiles.is_contiguous()
    # block (row tile 1, K block 3) of group 0: rows 16..31, columns 96..127, 16 bytes per lane 4i + t:
    # row 16 + i, then row 24 + i, columns 96 + 8t .. 96 + 8t + 7
    block = codes[0, 16:32, 96:128]
    for i, t in ((0, 0), (3, 2), (7, 3)):
        lane = tiles[1, 3, (4 * i + t) * 16:(4 * i + t + 1) * 16]
        assert torch.equal(lane[:8], block[i, 8 * t:8 * t + 8]) and torch.equal(lane[8:], block[i + 8, 8 * t:8 * t + 8])
    assert torch.equal(GL.unpack_tiles(tiles, 2), codes)
    with pytest.raises(ValueError):
        GL.pack_tiles(codes[:, :8])


def test_default_config_rules():
    # 32-row programs while they give every SM one (G=4 on 132 SMs: 128 of them), else 16-row ones
    # 32-row programs while they keep 7/8 of the SMs busy: G=4 on the H200 (128 on 132), not G=2 (64)
    assert GL.default_config(8, 4, 1024, 4096, sms=132) == GL.GluonConfig(block_r=32, block_m=8)
    assert GL.default_config(8, 2, 1024, 4096, sms=132) == GL.GluonConfig(block_r=16, block_m=8)
    assert GL.default_config(8, 2, 1024, 4096, sms=48) == GL.GluonConfig(block_r=32, block_m=8)
    assert GL.default_config(12, 2, 1024, 4096, sms=48).block_m == 16
    small = GL.default_config(3, 2, 64, 1024, sms=132)  # CPU test shapes: fewer warps or blocks
    assert small.fits(3, 64, 1024) and small.num_warps * 32 * small.blocks <= 1024
    with pytest.raises(ValueError):
        GL.default_config(4, 2, 64, 96, sms=132)
    assert not GL.GluonConfig().fits(17, 1024, 4096) and not GL.GluonConfig(block_m=8).fits(9, 1024, 4096)


def test_dispatcher_chooses_gluon_up_to_16_rows(monkeypatch):
    monkeypatch.setattr(GL, "available", lambda device: True)
    monkeypatch.setattr(K._wg, "available", lambda device: False)  # the paths below wg (issue 26, fifth session)
    assert [K.select_path(m, 4, "cuda") for m in (1, 8, 9, 16, 17, 32, 33, 192, 193)] == \
        ["gluon", "gluon", "gluon", "gluon", "wide", "wide", "tc", "tc", "einsum"]  # issue 26's H200 tables
    monkeypatch.setattr(K, "WIDE_MAX_M", {})  # no wide path: mid from 17 rows
    assert [K.select_path(m, 4, "cuda") for m in (16, 17)] == ["gluon", "mid"]
    monkeypatch.setattr(K, "WIDE_MAX_M", {4: 64, 2: 32})  # issue 26: the wide path up to its measured M
    assert [K.select_path(m, 4, "cuda") for m in (16, 17, 64, 65, 193)] == ["gluon", "wide", "wide", "tc", "einsum"]
    assert [K.select_path(m, 2, "cuda") for m in (32, 33, 65)] == ["wide", "tc", "mid"]
    assert K.select_path(40, 3, "cuda") == "wide"  # other G: the G=4 entry


def test_gluon_refused_where_it_cannot_run():
    x = torch.randn(2, 2, 1024).to(torch.bfloat16)
    codes = torch.randint(0, 126, (2, 64, 1024), dtype=torch.int32).to(torch.uint8)
    twin = K.Twin(codes.view(torch.float8_e4m3fn), torch.full((2, 2, 32), 120, dtype=torch.uint8))
    assert not GL.available("cpu")
    with pytest.raises(ValueError, match="gluon path needs"):
        K.wo_a(x, twin, path="gluon")
    with pytest.raises(ValueError, match="GluonConfig runs on the gluon path"):
        K.wo_a(x, twin, path="small", config=GL.GluonConfig())


def random_case(groups: int, m: int, exp_hi: int, aligned: bool):
    """A random twin (every finite e4m3 code, exponents 100..exp_hi) of [groups, 256, 2048] and x
    [m, groups, 2048] cut from a larger tensor: with token and group strides that are multiples of 16
    and 16-byte aligned data (aligned), or with odd strides and a 10-byte offset."""
    gen = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    codes = torch.randint(0, 256, (groups, 256, 2048), generator=gen, device="cuda", dtype=torch.int32)
    codes = torch.where((codes & 0x7F) == 0x7F, codes ^ 1, codes).to(torch.uint8)
    exps = torch.randint(100, exp_hi + 1, (groups, 8, 64), generator=gen, device="cuda", dtype=torch.int32)
    twin = K.Twin(codes.view(torch.float8_e4m3fn).contiguous(), exps.to(torch.uint8).contiguous())
    pad, offset = (32, 16) if aligned else (13, 5)
    big = torch.randn((m, groups + 1, 2048 + pad), generator=gen, device="cuda").to(torch.bfloat16)
    return twin, big[:, 1:, offset:offset + 2048], gen.initial_seed()


def check_against_fp64(twin, x, seed, **kw):
    """Two NaN-poisoned runs of wo_a: no NaN left, float64 reference within bf16 error, bitwise equal."""
    m, groups, _ = x.shape
    outs = []
    for _ in range(2):
        out = torch.full((m, groups, 256), float("nan"), dtype=torch.bfloat16, device="cuda")
        outs.append(K.wo_a(x, twin, out=out, **kw))
    ref = torch.einsum("tgd,grd->tgr", x.double(), K.dequantize(twin).double())
    assert not torch.isnan(outs[0]).any()
    err = ((outs[0].double() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, f"relative error {err:.2e} (seed {seed})"
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), "not bitwise repeatable"


@needs_gluon_gpu
@pytest.mark.parametrize("groups", [2, 4])
@pytest.mark.parametrize("m", [1, 2, 5, 8, 9, 16])
def test_gluon_matches_fp64_reference(groups, m):
    """Odd x strides: the register kernel (up to 8 rows through the dispatcher, 9..16 with an explicit
    16-token tile)."""
    twin, x, seed = random_case(groups, m, exp_hi=139, aligned=False)
    assert K.select_path(m, groups, "cuda") == "gluon" and not GL.ring_ok(x, twin)
    check_against_fp64(twin, x, seed, config=None if m <= 8 else GL.GluonConfig(block_r=16, block_m=16, num_warps=4))
    assert twin._tiles is None


@needs_gluon_gpu
@pytest.mark.parametrize("groups", [2, 4])
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
def test_ring_matches_fp64_reference(groups, m):
    """Aligned x (the engine's contiguous activations): the dispatcher runs the ring kernel on the
    lane-ordered tiles."""
    twin, x, seed = random_case(groups, m, exp_hi=GL.RING_EXP_MAX, aligned=True)
    assert GL.ring_ok(x, twin) and twin._tiles is None
    check_against_fp64(twin, x, seed)
    assert twin._tiles is not None, "the ring kernel did not run"


@needs_gluon_gpu
@pytest.mark.parametrize("m", [8, 16])
def test_ring_decodes_every_code_exactly(m):
    """One-hot tokens pick single columns, so y is the weight itself: every finite e4m3 code (zeros and
    subnormals included: a decode that flushed them would show here, not in a norm) at every exponent
    of the ring's range, bit for bit against the dequantised twin."""
    groups, rows, cols = 2, 256, 2048
    gen = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    picked = torch.randperm(cols, generator=gen, device="cuda")[:m]
    codes = torch.randint(0, 256, (groups, rows, cols), generator=gen, device="cuda", dtype=torch.int32)
    ramp = torch.arange(groups * rows * m, device="cuda", dtype=torch.int32).reshape(groups, rows, m) % 256
    codes[:, :, picked] = ramp  # every code in the picked columns
    codes = torch.where((codes & 0x7F) == 0x7F, codes ^ 1, codes).to(torch.uint8)
    exps = torch.randint(10, GL.RING_EXP_MAX + 1, (groups, rows // 32, cols // 32), generator=gen, device="cuda",
                         dtype=torch.int32).to(torch.uint8)
    twin = K.Twin(codes.view(torch.float8_e4m3fn), exps)
    x = torch.zeros((m, groups, cols), dtype=torch.bfloat16, device="cuda")
    x[torch.arange(m, device="cuda"), :, picked] = 1.0
    y = K.wo_a(x, twin)
    assert twin._tiles is not None, "the ring kernel did not run"
    want = K.dequantize(twin)[:, :, picked].permute(2, 0, 1)  # [m, groups, rows]
    assert torch.equal(y, want), f"{int((y != want).sum())} weights decoded wrong (seed {gen.initial_seed()})"


@needs_gluon_gpu
def test_unaligned_x_with_9_to_16_rows_runs_mid():
    gen = torch.Generator(device="cuda").manual_seed(3)
    codes = torch.randint(0, 126, (2, 256, 2048), generator=gen, device="cuda", dtype=torch.int32).to(torch.uint8)
    twin = K.Twin(codes.view(torch.float8_e4m3fn), torch.full((2, 8, 64), 120, dtype=torch.uint8, device="cuda"))
    x = torch.randn((12, 3, 2048 + 13), generator=gen, device="cuda").to(torch.bfloat16)[:, 1:, 5:5 + 2048]
    assert not GL.ring_ok(x, twin)
    y = K.wo_a(x, twin)
    ref = torch.einsum("tgd,grd->tgr", x.double(), K.dequantize(twin).double())
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-2 and twin._tiles is None


@needs_gluon_gpu
@pytest.mark.parametrize("m", [4, 12])
def test_exponents_beyond_the_ring_run_elsewhere(m):
    """A block scale above 2**7 (exponent > RING_EXP_MAX) keeps the twin off the ring, even with
    aligned x: 1..8 rows run the register kernel, 9..16 mid; both correct."""
    twin, x, seed = random_case(2, m, exp_hi=GL.RING_EXP_MAX, aligned=True)
    twin.exponents[1, 3, 5] = GL.RING_EXP_MAX + 1
    twin = K.Twin(twin.values, twin.exponents)
    assert not GL.ring_ok(x, twin)
    check_against_fp64(twin, x, seed)
    assert twin._tiles is None


@needs_gluon_gpu
@pytest.mark.skipif(not GL.pdl_enabled("cuda") if GPU else True, reason="needs an sm_90+ GPU with PDL on")
def test_pdl_chain_reads_the_previous_kernels_output():
    """Each layer's x is the previous ring kernel's y (R == D): with PDL the next kernel's programs start
    while the previous kernel runs and must not read x before it is written. Eager and CUDA-graph replay
    of the PDL chain give the plain launches' results bit for bit, every layer within bf16 error."""
    gen = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    groups, dim, layers, m = 4, 1024, 6, 8
    twins = []
    for _ in range(layers):
        codes = torch.randint(0, 126, (groups, dim, dim), generator=gen, device="cuda", dtype=torch.int32)
        codes |= torch.randint(0, 2, codes.shape, generator=gen, device="cuda", dtype=torch.int32) << 7
        twins.append(K.Twin(codes.to(torch.uint8).view(torch.float8_e4m3fn),
                            torch.full((groups, dim // 32, dim // 32), 113, dtype=torch.uint8, device="cuda")))
    pdl = GL.ring_config_for(m, groups, dim, dim, "cuda")
    plain = dataclasses.replace(pdl, pdl=False)
    assert pdl.pdl
    x0 = torch.randn((m, groups, dim), generator=gen, device="cuda").to(torch.bfloat16)
    ys = [torch.empty((m, groups, dim), dtype=torch.bfloat16, device="cuda") for _ in range(layers)]

    def chain(cfg):
        x = x0
        for twin, y in zip(twins, ys):
            x = K.wo_a(x, twin, out=y, config=cfg)

    chain(plain)
    want = [y.clone() for y in ys]
    for i, (twin, y) in enumerate(zip(twins, want)):
        ref = torch.einsum("tgd,grd->tgr", (x0 if i == 0 else want[i - 1]).double(), K.dequantize(twin).double())
        assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-2, f"layer {i}"
    for y in ys:
        y.fill_(float("nan"))
    chain(pdl)
    assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(ys, want)), "eager PDL chain"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain(pdl)
    for _ in range(3):
        for y in ys:
            y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(ys, want)), "graph chain"


@needs_gluon_gpu
@pytest.mark.parametrize("m", [3, 8, 16])
def test_row_warps_share_x(m):
    """32-row programs whose two row halves share one copy of x (row_warps=2), plain and PDL launches:
    correct, bitwise repeatable, and the bits of 16-row programs (the same sums in the same order), so
    the dispatcher's change of tiling with M never changes a result."""
    twin, x, seed = random_case(4, m, exp_hi=GL.RING_EXP_MAX, aligned=True)
    cfg = GL.RingConfig(32, 8 if m <= 8 else 16, 4, 2, 10, row_warps=2)
    check_against_fp64(twin, x, seed, config=cfg)
    want = K.wo_a(x, twin, config=GL.RingConfig(16, cfg.block_m, 4, 2, 8))
    for c in (cfg, dataclasses.replace(cfg, pdl=True))[:1 + GL.pdl_enabled("cuda")]:
        assert torch.equal(K.wo_a(x, twin, config=c).view(torch.int16), want.view(torch.int16)), (c, seed)


@needs_gluon_gpu
@pytest.mark.skipif(not GL.pdl_enabled("cuda") if GPU else True, reason="needs an sm_90+ GPU with PDL on")
@pytest.mark.parametrize("m", [7, 12])
def test_full_shape_wide_pdl_tiling(m):
    """The production shape at 6..16 rows (G=4, 1024 x 4096): on a GPU with enough SMs and shared memory
    the dispatcher takes PDL_WIDE (32-row programs, row halves sharing x); correct and bitwise repeatable."""
    gen = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    codes = torch.randint(0, 126, (4, 1024, 4096), generator=gen, device="cuda", dtype=torch.int32)
    codes |= torch.randint(0, 2, codes.shape, generator=gen, device="cuda", dtype=torch.int32) << 7
    exps = torch.randint(110, GL.RING_EXP_MAX + 1, (4, 32, 128), generator=gen, device="cuda", dtype=torch.int32)
    twin = K.Twin(codes.to(torch.uint8).view(torch.float8_e4m3fn), exps.to(torch.uint8))
    x = torch.randn((m, 4, 4096), generator=gen, device="cuda").to(torch.bfloat16)
    cfg = GL.ring_config_for(m, 4, 1024, 4096, "cuda")
    if cfg != GL.PDL_WIDE[8 if m <= 8 else 16]:
        pytest.skip(f"this GPU takes {cfg}")
    outs = [K.wo_a(x, twin, out=torch.full((m, 4, 1024), float("nan"), dtype=torch.bfloat16, device="cuda"))
            for _ in range(2)]
    ref = torch.einsum("tgd,grd->tgr", x.double(), K.dequantize(twin).double())
    err = ((outs[0].double() - ref).norm() / ref.norm()).item()
    assert err < 1e-2 and torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), err


@needs_gluon_gpu
def test_pdl_can_be_turned_off(monkeypatch):
    monkeypatch.setenv(GL.PDL_ENV, "0")
    cfg = GL.ring_config_for(4, 4, 1024, 4096, "cuda")
    assert cfg is not None and not cfg.pdl


# ------------------------------------------------------------------------------------------ issue 26: wide


@needs_gluon
@pytest.mark.parametrize("cfg", [GL.RingConfig(16, 32, 4, 2, 6, pdl=True), GL.RingConfig(32, 64, 4, 2, 4, pdl=True,
                                                                                         row_warps=2)],
                         ids=["r16-m32", "r32-m64-rows2"])
def test_wide_ring_machine_code(cfg):
    """The ring with 32/64-token tiles (the wide path, 17+ rows) compiles for sm_90 with one m16n8k16 per
    16 rows, 8 tokens and 16 K per warp, every copy through the ring, and no spills."""
    sass = ring_sass_of(cfg)
    ops = Counter(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", sass, re.M))
    blocks = 4096 // cfg.num_warps // 32
    assert ops["HMMA.16816.F32.BF16"] == blocks * (cfg.block_r // 16 // cfg.row_warps) * (cfg.block_m // 8) * 2, ops
    assert not any(op.startswith(("LDG.E", "LDGSTS.E.64")) for op in ops), "a weight or x load bypasses the ring"
    assert not any(op.startswith(("LDL", "STL")) for op in ops), "registers spilled to local memory"


def test_wide_ring_config_rules():
    """32/64-token ring tiles exist only for the wide path's launches; the 1..16-row tilings are as before."""
    assert GL.RingConfig(32, 64, 4, 2, 3, row_warps=2).fits(64, 1024, 4096)
    assert GL.RingConfig(16, 32, 4, 2, 4).fits(17, 1024, 4096)
    assert not GL.RingConfig(16, 32, 4, 2, 4).fits(33, 1024, 4096)
    assert not GL.RingConfig(16, 128, 4, 2, 4).fits(100, 1024, 4096)
    for m in (1, 8, 9, 16):
        assert GL.default_ring_config(m, 4, 1024, 4096, 132, 232448, pdl=True, smem_per_sm=233472).block_m in (8, 16)
    assert GL.default_ring_config(17, 4, 1024, 4096, 132, 232448) is None


@needs_gluon_gpu
@pytest.mark.parametrize("path", ["wide", "einsum"])
@pytest.mark.parametrize("groups", [2, 4])
@pytest.mark.parametrize("m", [17, 24, 48, 64, 100, 192, 1024])
def test_wide_and_prefill_full_shape(path, groups, m):
    """Full shapes on the GPU, fp8 twin only (as after DROP): the wide path and the prefill path
    against float64, every output written (poisoned with NaN), bitwise identical over repeated calls."""
    gen = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    codes = torch.randint(0, 256, (groups, 1024, 4096), generator=gen, device="cuda", dtype=torch.int32)
    codes = torch.where((codes & 0x7F) == 0x7F, codes ^ 1, codes).to(torch.uint8)
    exps = torch.randint(112, 122, (groups, 32, 128), generator=gen, device="cuda", dtype=torch.int32).to(torch.uint8)
    twin = K.Twin(codes.view(torch.float8_e4m3fn), exps)
    x = torch.randn((m, groups, 4096), generator=gen, device="cuda").to(torch.bfloat16)
    ref = torch.einsum("tgd,grd->tgr", x.double(), K.dequantize(twin).double())
    first = None
    for _ in range(3):
        out = torch.full((m, groups, 1024), float("nan"), dtype=torch.bfloat16, device="cuda")
        y = K.wo_a(x, twin, out=out, path=path)
        assert y is out and bool(torch.isfinite(y).all())
        first = y.clone() if first is None else first
        assert torch.equal(y.view(torch.int16), first.view(torch.int16)), "not bitwise deterministic"
    rel = ((first.double() - ref).norm() / ref.norm()).item()
    assert rel <= 1e-2, f"relative error {rel:.2e} on the {path} path (seed {gen.initial_seed()})"
