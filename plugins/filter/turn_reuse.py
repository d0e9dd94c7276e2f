# -*- coding: utf-8 -*-
"""Filters that let a rung reuse what an earlier turn of the same run proved (logic in module_utils/).

    {{ names | bench_client_expected(module_utils_dir, launcher_text) }}  -> {name: digest} the role would ship
    {{ read.stdout | bench_client_current(expected) }}                    -> bool (module_utils/bench_client_state.py)
    {{ _engine_liveness | liveness_smoke_answer(prompt) }}                -> str or None (module_utils/liveness_smoke.py)
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "module_utils"))
from bench_client_state import current, expected  # noqa: E402
from liveness_smoke import smoke_answer  # noqa: E402


def bench_client_expected(names, module_utils_dir, launcher_text):
    return expected(str(module_utils_dir), list(names), str(launcher_text))


class FilterModule:
    def filters(self):
        return {"bench_client_expected": bench_client_expected, "bench_client_current": current,
                "liveness_smoke_answer": smoke_answer}
