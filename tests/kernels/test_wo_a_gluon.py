"""The gluon path (kernels/wo_a_gluon.py): machine code checked on the CPU, results on a GPU.

Gluon has no CPU interpreter, so CI compiles the kernel for sm_90 with the installed Triton (its
bundled ptxas and cuobjdump) and checks what the round-4 measurements rest on: tensor-core mma,
8-byte weight loads, no slow fp16 -> bf16 conversions, no local memory. On an sm_89+ GPU the kernel
runs against a float64 reference (odd strides, NaN-poisoned output, bitwise repeatable)."""
from __future__ import annotations

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
kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg["NW"]})
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


RING_SASS_SCRIPT = SASS_SCRIPT.replace('"*u8"', '"*i32"').replace("GL._wo_a_gluon_kernel", "GL._wo_a_ring_kernel") \
    .replace("(0, 1, 2, 3, 5)", "(0, 1, 2, 3, 5, 6, 7)")  # the ring needs x strides divisible by 16


def ring_sass_of(cfg: GL.RingConfig, cols: int = 4096) -> str:
    consts = {"D": cols, "NW": cfg.num_warps, "BLOCK_M": cfg.block_m, "BLOCK_R": cfg.block_r, "S": cfg.stages,
              "SB": cfg.sb}
    return sass_of(None, cols, script=RING_SASS_SCRIPT, consts=consts)


@needs_gluon
@pytest.mark.parametrize("cfg", [GL.RING_CANDIDATES[8][0], GL.RING_CANDIDATES[16][0]], ids=["m8", "m16"])
def test_ring_sm90_machine_code(cfg):
    """Every weight byte and x value goes global -> shared by cp.async (8-byte weight pieces from the
    tiled copy, 16-byte x pieces), the expected tensor-core work, no slow conversion, no spills."""
    sass = ring_sass_of(cfg)
    ops = Counter(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", sass, re.M))
    blocks = 4096 // cfg.num_warps // 32  # K blocks per warp
    assert ops["HMMA.16816.F32.BF16"] == blocks * cfg.block_r // 16 * cfg.block_m // 8 * 2, ops
    assert ops["LDGSTS.E.64"] == blocks * cfg.block_r // 16 * 2, ops
    assert ops["LDGSTS.E.BYPASS.128"] == blocks * cfg.block_m // 8, ops
    assert not any(op.startswith("LDG.E") for op in ops), "a weight or x load bypasses the ring"
    assert not any(op.startswith("F2F.BF16.F16") for op in ops), "slow fp16 -> bf16 conversions are back"
    assert not any(op.startswith(("LDL", "STL")) for op in ops), "registers spilled to local memory"


def test_ring_config_rules():
    h200, gb10 = 227 * 1024, 99 * 1024
    assert GL.default_ring_config(8, 1024, 4096, h200) == GL.RingConfig(16, 8, 4, 2, 6)
    assert GL.default_ring_config(1, 1024, 4096, h200) == GL.RingConfig(16, 8, 4, 2, 6)
    assert GL.default_ring_config(9, 1024, 4096, h200) == GL.RingConfig(32, 16, 4, 4, 3)
    assert GL.default_ring_config(16, 1024, 4096, gb10).smem_bytes() <= gb10 - 1024
    small = GL.default_ring_config(4, 1024, 4096, 48 * 1024)
    assert small is not None and small.smem_bytes() + 1024 <= 48 * 1024
    assert GL.default_ring_config(17, 1024, 4096, h200) is None
    assert GL.default_ring_config(8, 1024, 4096, 8 * 1024) is None  # nothing fits: the register kernel
    assert GL.default_ring_config(8, 1024, 96, h200) is None  # K not a multiple of 128 per warp
    assert not GL.RingConfig(16, 8, 4, 2, 6).fits(9, 1024, 4096)


def test_ring_needs_aligned_x_strides():
    big = torch.zeros(4, 5, 4096 + 16, dtype=torch.bfloat16)
    assert GL.ring_ok(big[:, 1:, :4096])
    assert GL.ring_ok(big[:, 1:, 8:8 + 4096])  # 16 bytes in: still aligned
    assert not GL.ring_ok(big[:, 1:, 4:4 + 4096])  # 8 bytes in
    odd = torch.zeros(4, 5, 4096 + 13, dtype=torch.bfloat16)
    assert not GL.ring_ok(odd[:, 1:, :4096])


def test_pack_tiles_round_trip():
    codes = torch.randint(0, 256, (2, 64, 256), dtype=torch.int32).to(torch.uint8)
    tiles = GL.pack_tiles(codes)
    assert tiles.shape == (8, 8, 16, 32) and tiles.is_contiguous()
    # block (row tile 1, K block 3) of group 0 is 512 contiguous bytes: rows 16..31, columns 96..127
    assert torch.equal(tiles[1, 3], codes[0, 16:32, 96:128])
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
    assert [K.select_path(m, 4, "cuda") for m in (1, 8, 9, 16, 17, 192, 193)] == \
        ["gluon", "gluon", "gluon", "gluon", "mid", "mid", "einsum"]


def test_gluon_refused_where_it_cannot_run():
    x = torch.randn(2, 2, 1024).to(torch.bfloat16)
    codes = torch.randint(0, 126, (2, 64, 1024), dtype=torch.int32).to(torch.uint8)
    twin = K.Twin(codes.view(torch.float8_e4m3fn), torch.full((2, 2, 32), 120, dtype=torch.uint8))
    assert not GL.available("cpu")
    with pytest.raises(ValueError, match="gluon path needs"):
        K.wo_a(x, twin, path="gluon")
    with pytest.raises(ValueError, match="GluonConfig runs on the gluon path"):
        K.wo_a(x, twin, path="small", config=GL.GluonConfig())


@needs_gluon_gpu
@pytest.mark.parametrize("groups", [2, 4])
@pytest.mark.parametrize("m", [1, 2, 5, 8, 9, 16])
def test_gluon_matches_fp64_reference(groups, m):
    gen = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    codes = torch.randint(0, 256, (groups, 256, 2048), generator=gen, device="cuda", dtype=torch.int32)
    codes = torch.where((codes & 0x7F) == 0x7F, codes ^ 1, codes).to(torch.uint8)
    exps = torch.randint(100, 140, (groups, 8, 64), generator=gen, device="cuda", dtype=torch.int32).to(torch.uint8)
    twin = K.Twin(codes.view(torch.float8_e4m3fn).contiguous(), exps.contiguous())
    big = torch.randn((m, groups + 1, 2048 + 13), generator=gen, device="cuda").to(torch.bfloat16)
    x = big[:, 1:, 5:5 + 2048]
    # up to 8 rows through the dispatcher, 9..16 with an explicit 16-token tile
    cfg = None if m <= 8 else GL.GluonConfig(block_r=16, block_m=16, num_warps=4)
    assert K.select_path(m, groups, "cuda") == "gluon"
    outs = []
    for _ in range(2):
        out = torch.full((m, groups, 256), float("nan"), dtype=torch.bfloat16, device="cuda")
        outs.append(K.wo_a(x, twin, out=out, config=cfg))
    ref = torch.einsum("tgd,grd->tgr", x.double(), K.dequantize(twin).double())
    assert not torch.isnan(outs[0]).any()
    err = ((outs[0].double() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, f"relative error {err:.2e} (seed {gen.initial_seed()})"
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), "not bitwise repeatable"


@needs_gluon_gpu
@pytest.mark.parametrize("groups", [2, 4])
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
def test_ring_matches_fp64_reference(groups, m):
    """Aligned x (the engine's contiguous activations): the dispatcher runs the ring kernel on the
    tiled copy; NaN-poisoned output, float64 reference, bitwise repeatable."""
    gen = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    codes = torch.randint(0, 256, (groups, 256, 2048), generator=gen, device="cuda", dtype=torch.int32)
    codes = torch.where((codes & 0x7F) == 0x7F, codes ^ 1, codes).to(torch.uint8)
    exps = torch.randint(100, 140, (groups, 8, 64), generator=gen, device="cuda", dtype=torch.int32).to(torch.uint8)
    twin = K.Twin(codes.view(torch.float8_e4m3fn).contiguous(), exps.contiguous())
    big = torch.randn((m, groups + 1, 2048 + 32), generator=gen, device="cuda").to(torch.bfloat16)
    x = big[:, 1:, 16:16 + 2048]  # strides multiples of 16, not contiguous
    assert GL.ring_ok(x) and twin._tiles is None
    outs = []
    for _ in range(2):
        out = torch.full((m, groups, 256), float("nan"), dtype=torch.bfloat16, device="cuda")
        outs.append(K.wo_a(x, twin, out=out))
    assert twin._tiles is not None, "the ring kernel did not run"
    ref = torch.einsum("tgd,grd->tgr", x.double(), K.dequantize(twin).double())
    assert not torch.isnan(outs[0]).any()
    err = ((outs[0].double() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, f"relative error {err:.2e} (seed {gen.initial_seed()})"
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), "not bitwise repeatable"


@needs_gluon_gpu
def test_unaligned_x_with_9_to_16_rows_runs_mid():
    gen = torch.Generator(device="cuda").manual_seed(3)
    codes = torch.randint(0, 126, (2, 256, 2048), generator=gen, device="cuda", dtype=torch.int32).to(torch.uint8)
    twin = K.Twin(codes.view(torch.float8_e4m3fn), torch.full((2, 8, 64), 120, dtype=torch.uint8, device="cuda"))
    x = torch.randn((12, 3, 2048 + 13), generator=gen, device="cuda").to(torch.bfloat16)[:, 1:, 5:5 + 2048]
    assert not GL.ring_ok(x)
    y = K.wo_a(x, twin)
    ref = torch.einsum("tgd,grd->tgr", x.double(), K.dequantize(twin).double())
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-2 and twin._tiles is None
