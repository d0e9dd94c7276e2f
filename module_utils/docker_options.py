# -*- coding: utf-8 -*-
"""The recipe's ``docker run`` flags as ``community.docker.docker_container`` options, and the rank's boot plan.

The roles keep the recipe's flags as the operators write them (``engine_run_args``: ``--network=host``,
``--gpus=all``, ``--ulimit=memlock=-1:-1`` ...); ``community.docker.docker_container`` takes options
(``network_mode``, ``device_requests``, ``ulimits`` ...). ``container_options`` translates one into the other and
refuses a flag it does not know, naming it, rather than dropping it: a dropped flag would be a container that
differs from the recipe without anyone seeing it. ``COMPARISONS`` says what a difference is (docs/engine.md).

``rank_plan`` joins the two views of a rank before a boot: the project's own plan (``engine_container`` in check
mode: the env difference named per key, secrets masked) and ``docker_container``'s (check mode, ``state=present``:
every option of the recipe compared by docker's API). A rank is recreated when either sees a difference.

Plain Python, standard library only; unit-tested in tests/unit/test_docker_options.py.
"""
from __future__ import annotations

import re
from typing import Any, Iterable

# How docker_container decides that a container differs (anything else of the module's defaults applies).
# env strict: the image's own ENV is merged into the expected env by the module, so a key added by hand
# with -e is a difference; labels are set at creation and not compared (sparkfleet.rank, sparkfleet.role).
# volumes: compared by the project's plan (engine_container, mounts normalised): the module expects a bind
# without a mode as SRC:DST:rw, while a container made by `docker run -v SRC:DST` holds SRC:DST, so the module
# would recreate every container the recipe's launch line made, for nothing.
COMPARISONS = {
    "image": "strict",
    "env": "strict",
    "volumes": "ignore",
    "devices": "strict",
    "device_requests": "strict",
    "ulimits": "strict",
    "capabilities": "strict",
    "labels": "ignore",
}

# --flag[=value] spellings the recipe uses -> the option they set. Value flags take "--flag=v" or "--flag v".
_VALUE_FLAGS = {
    "--network": "network_mode", "--net": "network_mode",
    "--ipc": "ipc_mode",
    "--pid": "pid_mode",
    "--gpus": "device_requests",
    "--shm-size": "shm_size",
    "--ulimit": "ulimits",
    "--device": "devices",
    "--cap-add": "capabilities",
    "--cap-drop": "cap_drop",
    "--restart": "restart_policy",
    "--security-opt": "security_opts",
    "--user": "user", "-u": "user",
    "--workdir": "working_dir", "-w": "working_dir",
    "--runtime": "runtime",
    "--memory": "memory", "-m": "memory",
}
_BOOL_FLAGS = {"--privileged": "privileged", "--init": "init", "--read-only": "read_only"}
_LIST_OPTIONS = {"ulimits", "devices", "capabilities", "cap_drop", "security_opts"}
_RESTART = re.compile(r"^(no|always|unless-stopped|on-failure)(?::([0-9]+))?$")
_ULIMIT = re.compile(r"^([a-z]+)=(-?[0-9]+)(?::(-?[0-9]+))?$")
_SIZE = re.compile(r"^[0-9]+[bkmgtpBKMGTP]?$")


class DockerOptionsError(ValueError):
    """A flag that cannot become a docker_container option; the message names it."""


def _gpus(value: str) -> list:
    """``--gpus`` as docker's CLI sends it: all -> count -1; N -> count N; device=0,1 -> device ids."""
    text = value.strip('"').strip("'")
    if text == "all":
        return [{"driver": "", "count": -1, "capabilities": [["gpu"]], "options": {}}]
    if text.isdigit():
        return [{"driver": "", "count": int(text), "capabilities": [["gpu"]], "options": {}}]
    if text.startswith("device="):
        ids = [i for i in text[len("device="):].split(",") if i]
        if ids:
            return [{"driver": "", "device_ids": ids, "capabilities": [["gpu"]], "options": {}}]
    raise DockerOptionsError(f"--gpus {value!r}: use all, a count, or device=ID[,ID]")


def _ulimit(value: str) -> str:
    match = _ULIMIT.match(value)
    if not match:
        raise DockerOptionsError(f"--ulimit {value!r}: use NAME=SOFT[:HARD]")
    name, soft, hard = match.groups()
    return f"{name}:{soft}:{hard if hard is not None else soft}"


def _one(flag: str, option: str, value: str, out: dict) -> None:
    if not value:
        raise DockerOptionsError(f"{flag} needs a value")
    if option == "device_requests":
        out.setdefault(option, []).extend(_gpus(value))
    elif option == "ulimits":
        out.setdefault(option, []).append(_ulimit(value))
    elif option == "shm_size" or option == "memory":
        if not _SIZE.match(value):
            raise DockerOptionsError(f"{flag} {value!r}: use a number with an optional unit (b, k, m, g)")
        out[option] = value
    elif option == "restart_policy":
        match = _RESTART.match(value)
        if not match:
            raise DockerOptionsError(f"--restart {value!r}: use no, always, unless-stopped or on-failure[:N]")
        out[option] = match.group(1)
        if match.group(2) is not None:
            out["restart_retries"] = int(match.group(2))
    elif option in _LIST_OPTIONS:
        out.setdefault(option, []).append(value)
    else:
        if option in out and out[option] != value:
            raise DockerOptionsError(f"{flag} is given twice ({out[option]!r} and {value!r})")
        out[option] = value


def container_options(run_args: Iterable[Any]) -> dict:
    """The docker_container options the recipe's ``docker run`` flags set; raise DockerOptionsError on a flag that
    has no option here (env, mounts, labels and the name have their own role variables)."""
    args = [str(a) for a in (run_args or [])]
    out: dict = {}
    i = 0
    while i < len(args):
        arg = args[i]
        flag, eq, inline = arg.partition("=")
        if flag in _BOOL_FLAGS and not eq:
            out[_BOOL_FLAGS[flag]] = True
        elif flag in _BOOL_FLAGS and inline in ("true", "false"):
            out[_BOOL_FLAGS[flag]] = inline == "true"
        elif flag in _VALUE_FLAGS:
            if eq:
                value = inline
            else:
                if i + 1 >= len(args) or args[i + 1].startswith("-"):
                    raise DockerOptionsError(f"{flag} needs a value")
                i += 1
                value = args[i]
            _one(flag, _VALUE_FLAGS[flag], value, out)
        else:
            known = ", ".join(sorted(set(_VALUE_FLAGS) | set(_BOOL_FLAGS)))
            raise DockerOptionsError(
                f"docker run flag {arg!r} has no docker_container option here (known: {known}); env, mounts and "
                "labels have their own variables")
        i += 1
    if "capabilities" in out:
        out["capabilities"] = sorted(set(out["capabilities"]))
    return out


def docker_differences(result: Any) -> list:
    """The option names docker_container's check-mode result says differ (its ``diff.differences``)."""
    diff = (result or {}).get("diff") if isinstance(result, dict) else None
    rows = (diff or {}).get("differences") or [] if isinstance(diff, dict) else []
    names = []
    for row in rows:
        if isinstance(row, dict):
            names += [str(k) for k in row]
    return sorted(set(names))


def docker_would(result: Any) -> str:
    """What docker_container (state=present, check mode) would do: none, create or recreate."""
    if not isinstance(result, dict) or result.get("skipped"):
        return "none"
    for action in result.get("actions") or []:
        if isinstance(action, dict):
            if "removed" in action or "recreated" in action:
                return "recreate"
            if "created" in action:
                return "create"
    return "recreate" if result.get("changed") else "none"


def rank_plan(engine_plan: Any, docker_plan: Any) -> dict:
    """One rank's boot plan: the project's plan (engine_container, check mode) joined with docker_container's.

    Returns ``{action, differences, docker_differences}``: the action is the project's unless docker_container
    would recreate a container the project would keep (an option the project does not compare: shm size, ulimits,
    devices, GPUs, restart policy ...); then it is ``recreate`` and ``differences`` gains one row per option."""
    engine_plan = engine_plan if isinstance(engine_plan, dict) else {}
    action = str(engine_plan.get("action") or "none")
    differences = list(engine_plan.get("differences") or [])
    would = docker_would(docker_plan)
    options = docker_differences(docker_plan)
    if would == "recreate" and action in ("none", "start", "restart", "stop"):
        action = "recreate"
        seen = {(d.get("what"), d.get("key")) for d in differences if isinstance(d, dict)}
        for name in options or ["configuration"]:
            if ("option", name) not in seen:
                differences.append({"what": "option", "key": name, "desired": "(recipe)", "actual": "(differs)"})
    return {"action": action, "differences": differences, "docker_differences": options}
