"""Compile the wg kernel for sm_90 on a machine without a GPU (a syntax/layout check, no device time)."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

from kernels import wo_a_wg as W  # noqa: E402


def compile_cfg(cfg: W.WgConfig, d: int = 4096):
    wl = W._nvmma(cfg.block_k, 8)
    xl = W._nvmma(cfg.block_k, 16)
    sig = {"x_desc": f"tensordesc<bf16[{cfg.block_n}, {cfg.block_k}],{xl!r}>",
           "w_desc": f"tensordesc<u8[{cfg.block_r}, {cfg.block_k}],{wl!r}>",
           "e_ptr": "*i32", "y_ptr": "*bf16", "ws_ptr": "*fp32", "sem_ptr": "*i32", "M": "i32", "R": "i32",
           "stride_ym": "i32", "stride_yg": "i32"}
    consts = {"D": d, "BLOCK_R": cfg.block_r, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k,
              "SPLIT": cfg.split_k, "S": cfg.stages, "NW": cfg.num_warps, "PDL": cfg.pdl}
    kernel = W._wg_kernel
    if cfg.decoders:
        kernel = W._wg_ws_kernel
        consts.update(DW=cfg.decoders, NB=cfg.WS_BUFFERS, DEC_REGS=W.WS_DECODE_REGS, TMA_WARP=cfg.tma_warp)
    sig.update({k: "constexpr" for k in consts})
    attrs = {(i,): [["tt.divisibility", 16]] for i in (2, 3, 4, 5, 7)}
    src = GluonASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.num_warps})


if __name__ == "__main__":
    cfgs = [W.WgConfig(**json.loads(a)) for a in sys.argv[1:]] or [W.WgConfig()]
    for c in cfgs:
        k = compile_cfg(c)
        sass_ops = k.asm.get("ptx", "")
        print(c, "ok", "wgmma" in sass_ops, k.metadata.shared, "regs?", getattr(k, "n_regs", None))
