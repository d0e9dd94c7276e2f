"""Import hook of the dsv41 adapters: each adapter module is imported when its env gate is on
(on unless the value is 0, empty, off or false)."""
import importlib
import os

GATES = {
    "wo_a_w8": "DSV41_WO_A_W8", "autotune_keep": "DSV41_AUTOTUNE_KEEP",
    "engram_prefetch": "DSV41_ENGRAM_PREFETCH", "folded_fence": "DSV41_FOLDED_FENCE",
    "draft_head_fp8": "DSV41_DRAFT_HEAD_FP8", "block_verify": "DSV41_BLOCK_VERIFY", "verify_cap": "DSV41_VERIFY_CAP",
}


def gate_on(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "off", "false")


for module, gate in GATES.items():
    if gate_on(gate):
        try:
            importlib.import_module(module)
        except ImportError:
            pass
