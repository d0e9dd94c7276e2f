# -*- coding: utf-8 -*-
"""The workers' weights volume (``dsv41-weights``): what roles/weights_volume does with it, decided here.

On the fleet the volume is an NFS docker volume of the head's checkpoint folder (driver ``local``, ``type=nfs``,
``o=addr=...,ro``, ``device=:/path``); on the testbed a bind-backed local volume of the same name. Its driver and
options come from the inventory. ``community.docker.docker_volume_info`` reads the volume,
``community.docker.docker_host_info`` lists the containers that use it (only before a replacement), and
``community.docker.docker_volume`` creates or recreates it; this module decides which, from what they return:

- absent: ``create``;
- same driver and exactly the same options (both ways: an option the inventory lacks is a difference too, which
  ``docker_volume``'s own comparison would not see): ``none``;
- different: ``refuse`` (left as it is, every difference named) unless the operator opted in to a replacement;
  with the opt-in, ``replace`` only while no container (running or not) uses the volume, else ``refuse`` naming
  them (docker cannot remove a volume a container references, and the engine reads its weights from it);
- never ``replace`` a volume whose removal could delete data, even with the opt-in: a local volume without a
  ``device`` option (its files are in docker's own storage) or one of another driver (a plugin's remove may
  delete its backing store). Only a local volume mounting a device, bind, NFS export or tmpfs is replaced.

Plain Python, standard library only.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, List, Optional

# docker's own rule for volume names ([a-zA-Z0-9][a-zA-Z0-9_.-]+).
VOLUME_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]+$")
DRIVER = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.:/-]*$")
OPTION_KEY = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")


class WeightsVolumeError(ValueError):
    """Bad input: one sentence naming the variable and the value."""


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def problems(name: Any, driver: Any, options: Any, prefix: str = "weights_volume") -> List[str]:
    """Everything wrong with the inputs, each naming its variable (empty: fine). Runs before any host is touched."""
    out: List[str] = []
    if not isinstance(name, str) or not VOLUME_NAME.match(name):
        out.append(f"{prefix}_name {name!r} is not a docker volume name ([a-zA-Z0-9][a-zA-Z0-9_.-]+)")
    if not isinstance(driver, str) or not DRIVER.match(driver):
        out.append(f"{prefix}_driver {driver!r} is not a docker volume driver name")
    if not isinstance(options, dict):
        out.append(f"{prefix}_driver_options must be a mapping of option to value, not {type(options).__name__}")
        return out
    for key, value in options.items():
        if not isinstance(key, str) or not OPTION_KEY.match(key):
            out.append(f"{prefix}_driver_options key {key!r} is not a volume option name")
        elif isinstance(value, (dict, list)):
            out.append(f"{prefix}_driver_options.{key} must be a single value, not a {type(value).__name__}")
        elif any(c in _text(value) for c in "\n\r\0"):
            out.append(f"{prefix}_driver_options.{key} contains a newline or NUL")
    if driver == "local" and isinstance(options, dict) and options:
        kind = _text(options.get("type"))
        device = _text(options.get("device"))
        if not kind:
            out.append(f"{prefix}_driver_options of a local volume with options needs a type (nfs, none for a bind, ...)")
        elif kind == "nfs":
            if "addr=" not in _text(options.get("o")):
                out.append(f"{prefix}_driver_options.o of an NFS volume must give the server: addr=ADDRESS,...")
            if not device.startswith(":/"):
                out.append(f"{prefix}_driver_options.device of an NFS volume must be :/EXPORTED/PATH, not {device!r}")
        elif kind == "none":
            if "bind" not in _text(options.get("o")).split(","):
                out.append(f"{prefix}_driver_options.o of a type=none volume must be bind (o=bind)")
            if not device.startswith("/"):
                out.append(f"{prefix}_driver_options.device of a bind volume must be an absolute path, not {device!r}")
    return out


def desired_options(options: Optional[dict]) -> dict:
    """The options as docker stores them: every value a string."""
    return {str(k): _text(v) for k, v in (options or {}).items()}


def differences(driver: str, options: dict, existing: dict) -> List[dict]:
    """Each difference between the desired driver/options and an existing volume (docker_volume_info's volume)."""
    out: List[dict] = []
    if (existing.get("Driver") or "") != driver:
        out.append({"key": "driver", "desired": driver, "actual": existing.get("Driver")})
    want = desired_options(options)
    have = {str(k): _text(v) for k, v in (existing.get("Options") or {}).items()}
    for key in sorted(set(want) | set(have)):
        if want.get(key) != have.get(key):
            out.append({"key": f"driver_options.{key}", "desired": want.get(key), "actual": have.get(key)})
    return out


def _shown(value: Optional[str]) -> str:
    return "(absent)" if value is None else repr(value)


def _users(containers: Iterable[dict]) -> List[str]:
    names = []
    for c in containers or []:
        found = [n.lstrip("/") for n in (c.get("Names") or []) if n] or [str(c.get("Id", "?"))[:12]]
        state = c.get("State") or c.get("Status") or ""
        names.append(f"{found[0]} ({state})" if state else found[0])
    return sorted(names)


def _removal_deletes(existing: dict) -> str:
    """Why removing this volume could delete data ('' when it cannot: a local volume mounting a device, a bind, an
    NFS export or a tmpfs, whose files live elsewhere or nowhere once unmounted)."""
    driver = existing.get("Driver") or ""
    if driver != "local":
        return f"driver {driver or '(none)'} may delete what the volume holds when the volume is removed"
    if not _text((existing.get("Options") or {}).get("device")):
        where = existing.get("Mountpoint") or "under docker's data root"
        return f"its files live in docker's own storage ({where})"
    return ""


def plan(existing: Optional[dict], name: str, driver: str, options: Optional[dict], replace: bool = False,
         users: Optional[list] = None, host: str = "") -> dict:
    """What to do with the volume: {action: create|none|replace|refuse, differences, users, msg}.

    ``existing``: docker_volume_info's ``volume`` (None when absent). ``users``: docker_host_info's ``containers``
    filtered on the volume, or None when not looked up yet (``needs_users`` then says whether it must be)."""
    where = f"{host}: " if host else ""
    if not existing:
        return {"action": "create", "differences": [], "users": [], "needs_users": False,
                "msg": f"{where}docker volume {name}: would create it (driver {driver})"}
    diffs = differences(driver, options or {}, existing)
    if not diffs:
        return {"action": "none", "differences": [], "users": [], "needs_users": False,
                "msg": f"{where}docker volume {name}: as the inventory says (driver {driver})"}
    listed = "; ".join(f"{d['key']}: inventory {_shown(d['desired'])}, volume {_shown(d['actual'])}" for d in diffs)
    if not replace:
        return {"action": "refuse", "differences": diffs, "users": [], "needs_users": False,
                "msg": (f"{where}docker volume {name} exists with another driver or options than the inventory's "
                        f"({listed}); it is left as it is. To remove and recreate it with the inventory's, set "
                        f"weights_volume_replace=true (refused while any container uses it)")}
    kept = _removal_deletes(existing)
    if kept:
        return {"action": "refuse", "differences": diffs, "users": [], "needs_users": False,
                "msg": (f"{where}docker volume {name} exists with another driver or options than the inventory's "
                        f"({listed}); {kept}, so removing it could delete the only copy: it is left as it is, even "
                        f"with weights_volume_replace=true. Copy what it holds elsewhere and remove it by hand "
                        f"(docker volume rm {name}), then run again")}
    if users is None:
        return {"action": "replace", "differences": diffs, "users": [], "needs_users": True,
                "msg": f"{where}docker volume {name}: would be replaced ({listed}) if no container uses it"}
    named = _users(users)
    if named:
        return {"action": "refuse", "differences": diffs, "users": named, "needs_users": False,
                "msg": (f"{where}docker volume {name} exists with another driver or options than the inventory's "
                        f"({listed}) and is used by {len(named)} container{'s' if len(named) != 1 else ''}: "
                        f"{', '.join(named)}; it is left as it is. Remove "
                        f"{'them' if len(named) != 1 else 'it'} first (docker rm), then run again")}
    return {"action": "replace", "differences": diffs, "users": [], "needs_users": False,
            "msg": f"{where}docker volume {name}: replaced ({listed}); no container used it"}
