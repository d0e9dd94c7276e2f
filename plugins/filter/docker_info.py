# -*- coding: utf-8 -*-
"""Filters over community.docker's read-only modules' results (logic in module_utils/docker_info.py).

    {{ result | docker_container_status }}          -> running | paused | exited | ... | None (no container)
    {{ loop_result.results | docker_any_running }}  -> bool
    {{ result | docker_image_present(image_id) }}   -> bool
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "module_utils"))
from docker_info import any_running, container_status, image_present  # noqa: E402


class FilterModule:
    def filters(self):
        return {"docker_container_status": container_status, "docker_any_running": any_running,
                "docker_image_present": image_present}
