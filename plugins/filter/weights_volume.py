# -*- coding: utf-8 -*-
"""Filters of roles/weights_volume (logic in module_utils/weights_volume.py).

    {{ weights_volume_name | weights_volume_problems(driver, options) }}          -> [] or what is wrong, named
    {{ info.volume | weights_volume_plan(name, driver, options, replace, users, host) }}
                                                                                   -> {action, differences, users, msg}
"""
from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "module_utils"))
from weights_volume import plan, problems  # noqa: E402


def weights_volume_problems(name: Any, driver: Any, options: Any) -> list:
    return problems(name, driver, options)


def weights_volume_plan(existing: Any, name: str, driver: str, options: Any, replace: Any = False,
                        users: Any = None, host: str = "") -> dict:
    return plan(existing or None, name, driver, options if isinstance(options, dict) else {}, bool(replace),
                users, host)


class FilterModule:
    def filters(self):
        return {"weights_volume_problems": weights_volume_problems, "weights_volume_plan": weights_volume_plan}
