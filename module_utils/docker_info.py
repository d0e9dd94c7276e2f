# -*- coding: utf-8 -*-
"""Decisions over what community.docker's read-only modules return (docs/engine.md, "community.docker").

``docker_container_info`` returns ``{exists, container}`` (``container`` the whole ``docker inspect``, env included:
the tasks that run it are ``no_log``, and only what these functions pick leaves them); ``docker_image_info`` returns
``{images: [...]}`` (empty when the image is not on the host). Plain Python, standard library only.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional


def container_status(info: Any) -> Optional[str]:
    """The container's state (running, paused, exited, ...) from one docker_container_info result; None when it
    does not exist or the read failed."""
    if not isinstance(info, dict) or info.get("failed") or not info.get("exists"):
        return None
    state = (info.get("container") or {}).get("State") or {}
    return state.get("Status") or ("running" if state.get("Running") else None)


def any_running(results: Iterable[Any]) -> bool:
    """Whether any of the read containers runs (a loop's ``results`` of docker_container_info)."""
    return any(container_status(r) == "running" for r in results or [])


def image_present(info: Any, image_id: str) -> bool:
    """Whether docker_image_info found the image with exactly this id (a recorded image id, sha256:...)."""
    if not isinstance(info, dict) or info.get("failed"):
        return False
    return any(isinstance(i, dict) and i.get("Id") == image_id for i in info.get("images") or [])
