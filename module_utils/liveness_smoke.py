# -*- coding: utf-8 -*-
"""The answer a boot's liveness check already got to a smoke prompt.

roles/engine asks the head every prompt of ``engine_smoke_prompts`` after each boot (engine_liveness_info:
non-streaming, temperature 0, thinking off, 16 tokens) and fails the boot on a wrong answer. roles/rollout then
asked the head its own ``rollout_smoke_prompt`` again, the same request (one more Ansible turn a boot). It now takes
the answer from the liveness result of this boot when that result holds the same prompt, and asks only when it does
not (liveness off, or a prompt the engine's table lacks). Unit-tested in tests/unit/test_liveness_smoke.py.
"""
from __future__ import annotations


def smoke_answer(liveness, prompt):
    """The answer ``liveness`` (a registered engine_liveness_info result) holds for ``prompt``, or None."""
    if not isinstance(liveness, dict) or liveness.get("skipped") or not isinstance(prompt, str):
        return None
    for item in liveness.get("smoke") or []:
        if isinstance(item, dict) and item.get("prompt") == prompt and isinstance(item.get("answer"), str):
            return item["answer"]
    return None
