"""FlashInfer autotune caches as the simulated engine keeps them (docs/reference.md section 4).

Host path ~/.cache/sglang/flashinfer/autotune/<flashinfer_version>/<smXY>/<key16>/rank_tp{r}_pp0_dp0.json,
two keys per boot (target and draft); key16 is the first 16 hex digits of a sha256 over model path,
dtype, quant, MoE backend, tp, pp, dp, ep size and model class (the draft adds its quant). With the
keep adapter a `<cache>.launch` sidecar holds a sha256 of argv plus the SGLANG_/DSV41_/SPARK_/B12X_/NCCL_
env minus volatile switches.
"""
from __future__ import annotations

import hashlib
import json
import os

FLASHINFER_VERSION = "0.5.2"
SM = "sm121"
MODEL_PATH = "/models/DeepSeek-V4.1-Flash"
ENV_PREFIXES = ("SGLANG_", "DSV41_", "SPARK_", "B12X_", "NCCL_")
# Volatile: switches that do not shape tactics, and the per-node fabric keys (the RoCE v2 GID index moves after a
# reboot and differs per node; a cache must survive it and ranks' sidecars must agree).
VOLATILE = {"DSV41_ENGRAM_PREFETCH_CHECK", "NCCL_DEBUG", "SGLANG_LOG_LEVEL", "NCCL_IB_GID_INDEX", "NCCL_IB_HCA"}


def key16(kind: str, tp: int, ep: int | None = None, moe_backend: str = "b12x") -> str:
    parts = [MODEL_PATH, "bfloat16", "fp8", moe_backend, f"tp={tp}", "pp=1", "dp=1", f"ep={ep or tp}",
             "DeepseekV4ForCausalLM" if kind == "target" else "DSparkDraftModel"]
    if kind == "draft":
        parts.append("draft_quant=bf16")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def key_dir(cache_root: str, tp: int, kind: str) -> str:
    return os.path.join(cache_root, "sglang", "flashinfer", "autotune", FLASHINFER_VERSION, SM, key16(kind, tp))


def cache_path(cache_root: str, rank: int, tp: int, kind: str) -> str:
    return os.path.join(key_dir(cache_root, tp, kind), f"rank_tp{rank}_pp0_dp0.json")


def tactics(kind: str, boot_id: str) -> dict:
    """A tuned cache: tactic choices that depend on the boot that tuned them (timing noise)."""
    seed = hashlib.sha256(f"{kind}/{boot_id}".encode()).hexdigest()
    return {"flashinfer_version": FLASHINFER_VERSION, "sm": SM, "kind": kind,
            "tactics": {f"moe_gemm_m{m}": int(seed[i:i + 2], 16) % 7 for i, m in enumerate((1, 2, 4, 8, 16, 32))}}


def env_fingerprint(env: dict, argv: list[str]) -> str:
    keep = sorted((k, v) for k, v in env.items() if k.startswith(ENV_PREFIXES) and k not in VOLATILE)
    return hashlib.sha256(json.dumps([argv, keep]).encode()).hexdigest()


def file_digest(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except FileNotFoundError:
        return None
