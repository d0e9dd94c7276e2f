# -*- coding: utf-8 -*-
"""Filters of the engine role for community.docker.docker_container (logic in module_utils/docker_options.py).

    {{ engine_run_args | engine_docker_options }}              -> {network_mode, ipc_mode, device_requests, ...}
    {{ engine_run_args | engine_docker_options_problem }}      -> '' or why a flag has no docker_container option
    {{ engine_docker_comparisons }} is a filter-free constant: {{ {} | engine_docker_comparisons }}
    {{ _engine_plan | engine_rank_plan(_engine_docker_plan) }} -> {action, differences, docker_differences}
"""
from __future__ import annotations

import os
import sys
from typing import Any

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - tests may import the plugin bare
    class AnsibleFilterError(ValueError):  # type: ignore[no-redef]
        pass

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "module_utils"))
from docker_options import COMPARISONS, DockerOptionsError, container_options, rank_plan  # noqa: E402


def engine_docker_options(run_args: Any) -> dict:
    try:
        return container_options(run_args)
    except DockerOptionsError as exc:
        raise AnsibleFilterError(f"engine_run_args: {exc}") from None


def engine_docker_options_problem(run_args: Any) -> str:
    try:
        container_options(run_args)
    except DockerOptionsError as exc:
        return str(exc)
    return ""


def engine_docker_comparisons(_: Any = None) -> dict:
    return dict(COMPARISONS)


def engine_rank_plan(engine_plan: Any, docker_plan: Any = None) -> dict:
    return rank_plan(engine_plan, docker_plan)


class FilterModule:
    def filters(self):
        return {"engine_docker_options": engine_docker_options,
                "engine_docker_options_problem": engine_docker_options_problem,
                "engine_docker_comparisons": engine_docker_comparisons, "engine_rank_plan": engine_rank_plan}
