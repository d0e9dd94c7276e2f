# -*- coding: utf-8 -*-
"""One engine container (a TP rank of the recipe's launcher): compared with the desired one, started, stopped and
waited for, through the docker CLI. It never creates, recreates or removes a container: roles/engine does that with
community.docker.docker_container (docs/engine.md, "community.docker").

The comparison follows docs/reference.md section 2: ``docker inspect`` is the truth. A container matches when its image
id, its managed env and its mounts equal the desired ones; run flags and labels are applied at creation and not
compared. Docker merges the image's own ENV (PATH, PYTHONPATH...) into ``Config.Env``, so the managed env of a
running container is: every desired key, plus every key that the image does not set or sets to another value
(a key someone added by hand with ``-e`` shows up; the image's own keys do not).

Plain Python, standard library only (runs on the hosts). ``Docker`` takes the command runner so unit tests and
the module share every line of logic.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from ansible.module_utils.env_text import key_problem, value_problem
# A docker image reference: [registry[:port]/]path[:tag][@digest], no whitespace.
IMAGE_REF = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
                       r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$|^sha256:[0-9a-f]{12,64}$")
CONTAINER_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")

Runner = Callable[[list], tuple]


class EngineContainerError(Exception):
    """Something the caller must fix; the message is one sentence with the numbers."""

    def __init__(self, msg: str, **facts):
        super().__init__(msg)
        self.facts = facts


@dataclass(frozen=True)
class Mount:
    source: str        # host path (bind) or volume name
    destination: str
    read_only: bool

    def spec(self) -> str:
        return f"{self.source}:{self.destination}" + (":ro" if self.read_only else "")


@dataclass
class Desired:
    name: str
    image: str = ""
    env: dict = field(default_factory=dict)
    mounts: list = field(default_factory=list)          # Mount


@dataclass
class Difference:
    what: str          # image | env | mount
    key: str
    desired: Optional[str]
    actual: Optional[str]

    def as_dict(self) -> dict:
        return {"what": self.what, "key": self.key, "desired": self.desired, "actual": self.actual}


# ---------------------------------------------------------------- input checks

def parse_mount(spec: str) -> Mount:
    """``SRC:DST[:ro|rw]`` (SRC a host path or a volume name) -> Mount; raise on anything else."""
    if not isinstance(spec, str) or any(c.isspace() for c in spec):
        raise EngineContainerError(f"mount {spec!r} must be SRC:DST[:ro] without spaces")
    parts = spec.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise EngineContainerError(f"mount {spec!r} must be SRC:DST[:ro] (a host path or volume name, then a "
                                   "container path)")
    mode = parts[2] if len(parts) == 3 else ""
    if mode not in ("", "ro", "rw"):
        raise EngineContainerError(f"mount {spec!r}: mode must be ro or rw, not {mode!r}")
    if not parts[1].startswith("/"):
        raise EngineContainerError(f"mount {spec!r}: the container path must be absolute")
    source = os.path.normpath(parts[0]) if parts[0].startswith("/") else parts[0]
    return Mount(source, os.path.normpath(parts[1]), mode == "ro")


def check_desired(desired: Desired, need_image: bool) -> None:
    if not CONTAINER_NAME.match(desired.name or ""):
        raise EngineContainerError(f"container name {desired.name!r} is not valid ([a-zA-Z0-9][a-zA-Z0-9_.-]*)")
    if need_image:
        if not desired.image or not IMAGE_REF.match(desired.image):
            raise EngineContainerError(f"image {desired.image!r} is not a docker image reference "
                                       "(no spaces, lowercase repository, optional :tag and @sha256:digest)")
    for key, value in desired.env.items():
        if key_problem("env key", key):
            raise EngineContainerError(f"env key {key!r} is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)")
        problem = value_problem(f"env value of {key}", "" if value is None else str(value))
        if problem:
            raise EngineContainerError(problem)
    destinations = [m.destination for m in desired.mounts]
    dupes = sorted({d for d in destinations if destinations.count(d) > 1})
    if dupes:
        raise EngineContainerError(f"several mounts target {', '.join(dupes)}")


# ---------------------------------------------------------------- docker CLI

class Docker:
    """The docker CLI subset an engine container needs. ``runner(argv) -> (rc, stdout, stderr)``."""

    def __init__(self, runner: Runner, binary: str = "docker"):
        self.runner = runner
        self.binary = binary

    def _call(self, *args: str, check: bool = True) -> tuple:
        rc, out, err = self.runner([self.binary, *args])
        if check and rc != 0:
            raise EngineContainerError(f"docker {args[0]} failed (rc={rc}): {(err or out).strip()[-500:]}",
                                       rc=rc, command=[self.binary, *args])
        return rc, out, err

    def container(self, name: str) -> Optional[dict]:
        rc, out, err = self._call("container", "inspect", name, check=False)
        if rc != 0:
            if "no such" in (err + out).lower():
                return None
            raise EngineContainerError(f"docker container inspect {name} failed (rc={rc}): {(err or out).strip()}")
        data = json.loads(out)
        return data[0] if data else None

    def image(self, ref: str) -> Optional[dict]:
        rc, out, err = self._call("image", "inspect", ref, check=False)
        if rc != 0:
            if "no such" in (err + out).lower():
                return None
            raise EngineContainerError(f"docker image inspect {ref} failed (rc={rc}): {(err or out).strip()}")
        data = json.loads(out)
        return data[0] if data else None

    def logs(self, name: str) -> str:
        _, out, err = self._call("logs", name)
        return out + err

    def start(self, name: str) -> None:
        self._call("start", name)

    def stop(self, name: str, timeout: int) -> None:
        self._call("stop", "-t", str(timeout), name)


# ---------------------------------------------------------------- comparison

def env_of(config_env: Optional[list]) -> dict:
    out = {}
    for item in config_env or []:
        key, _, value = item.partition("=")
        out[key] = value
    return out


def managed_env(container: dict, image_env: dict, desired_keys) -> dict:
    """The keys of the container's env that sparkfleet manages or that someone added to the image's."""
    actual = env_of(container.get("Config", {}).get("Env"))
    return {k: v for k, v in actual.items()
            if k in desired_keys or k not in image_env or image_env[k] != v}


def mounts_of(container: dict) -> list:
    out = []
    for m in container.get("Mounts") or []:
        source = m.get("Name") if m.get("Type") == "volume" else m.get("Source", "")
        if source and source.startswith("/"):
            source = os.path.normpath(source)
        out.append(Mount(source or "", os.path.normpath(m.get("Destination", "")), not m.get("RW", True)))
    return sorted(out, key=lambda m: m.destination)


def differences(desired: Desired, desired_image_id: str, container: dict, image_env: dict) -> list:
    diffs: list = []
    if container.get("Image") != desired_image_id:
        diffs.append(Difference("image", "id", desired_image_id, container.get("Image")))
    actual_env = managed_env(container, image_env, desired.env)
    for key in sorted(set(desired.env) | set(actual_env)):
        want, have = desired.env.get(key), actual_env.get(key)
        if want is not None:
            want = str(want)
        if want != have:
            diffs.append(Difference("env", key, want, have))
    want_mounts = {m.destination: m for m in desired.mounts}
    have_mounts = {m.destination: m for m in mounts_of(container)}
    for dest in sorted(set(want_mounts) | set(have_mounts)):
        want, have = want_mounts.get(dest), have_mounts.get(dest)
        if want != have:
            diffs.append(Difference("mount", dest, want.spec() if want else None, have.spec() if have else None))
    return diffs


def describe(image: str, image_id: Optional[str], status: str, env: dict, mounts: list) -> str:
    """The text both sides of the diff use: image, state, managed env, mounts."""
    lines = [f"image: {image} ({image_id or 'unknown id'})", f"state: {status}", "env:"]
    lines += [f"  {k}={v}" for k, v in sorted(env.items())]
    lines.append("mounts:")
    lines += [f"  {m.spec()}" for m in sorted(mounts, key=lambda m: m.destination)]
    return "\n".join(lines) + "\n"


def container_summary(container: Optional[dict], image_env: dict, desired_keys) -> Optional[dict]:
    if container is None:
        return None
    state = container.get("State") or {}
    return {"id": container.get("Id"), "name": (container.get("Name") or "").lstrip("/"),
            "image": (container.get("Config") or {}).get("Image"), "image_id": container.get("Image"),
            "status": state.get("Status"), "running": bool(state.get("Running")),
            "exit_code": state.get("ExitCode"), "started_at": state.get("StartedAt"),
            "finished_at": state.get("FinishedAt"),
            "env": managed_env(container, image_env, desired_keys),
            "mounts": [m.spec() for m in mounts_of(container)]}


def current_summary(docker: Docker, desired: Desired) -> Optional[dict]:
    """The container as it is now (``container_summary`` of a fresh inspect; None when absent)."""
    container = docker.container(desired.name)
    if container is None:
        return None
    own_image = docker.image(container.get("Image", "")) if container.get("Image") else None
    return container_summary(container, env_of(((own_image or {}).get("Config") or {}).get("Env")), desired.env)


# ---------------------------------------------------------------- plan and apply

@dataclass
class Plan:
    action: str                 # none | create | recreate | start | restart | stop (create/recreate: plan only)
    differences: list
    before: str
    after: str
    container: Optional[dict]   # summary of the container before the run
    image_id: Optional[str]
    image_labels: dict = field(default_factory=dict)


def plan(docker: Docker, desired: Desired, state: str, restart: bool) -> Plan:
    container = docker.container(desired.name)
    image_env: dict = {}
    if container is not None:
        own_image = docker.image(container.get("Image", "")) if container.get("Image") else None
        image_env = env_of(((own_image or {}).get("Config") or {}).get("Env"))
    summary = container_summary(container, image_env, desired.env)
    before_status = "absent" if container is None else summary["status"]
    before = "absent\n" if container is None else describe(
        summary["image"], summary["image_id"], before_status, summary["env"], mounts_of(container))

    if state == "stopped":
        running = bool(container and summary["running"])
        after = before.replace(f"state: {before_status}", "state: exited") if running else before
        return Plan("stop" if running else "none", [], before, after, summary, None)

    image = docker.image(desired.image)
    if image is None:
        raise EngineContainerError(f"image {desired.image} is not on this host; build or load it first "
                                   f"(docker image inspect {desired.image} finds nothing)", image=desired.image)
    image_id = image["Id"]
    labels = dict((image.get("Config") or {}).get("Labels") or {})
    after = describe(desired.image, image_id, "running", {k: str(v) for k, v in desired.env.items()},
                     desired.mounts)
    if container is None:
        return Plan("create", [], before, after, summary, image_id, labels)
    if not image_env:
        image_env = env_of((image.get("Config") or {}).get("Env"))
        summary = container_summary(container, image_env, desired.env)
    diffs = differences(desired, image_id, container, image_env)
    if diffs:
        action = "recreate"
    elif not summary["running"]:
        action = "start"
    elif restart:
        action = "restart"
    else:
        action = "none"
    if action == "restart":
        before = before.replace("state: running", "state: running (this boot)")
        after = after.replace("state: running", "state: running (restarted)")
    return Plan(action, diffs, before, after, summary, image_id, labels)


def log_line_count(docker: Docker, name: str) -> int:
    return len(docker.logs(name).splitlines())


def apply(docker: Docker, desired: Desired, p: Plan, stop_timeout: int) -> int:
    """Carry out a stop, start or restart; return the number of log lines written before this start. A plan to
    create or recreate is never carried out here (community.docker.docker_container makes containers)."""
    if p.action in ("create", "recreate"):
        raise EngineContainerError(f"{desired.name}: this module does not {p.action} containers")
    offset = 0
    if p.action == "stop":
        docker.stop(desired.name, stop_timeout)
    if p.action == "restart":
        offset = log_line_count(docker, desired.name)
        docker.stop(desired.name, stop_timeout)
        docker.start(desired.name)
    if p.action == "start":
        offset = log_line_count(docker, desired.name)
        docker.start(desired.name)
    return offset


@dataclass
class WaitResult:
    ready: bool
    line: Optional[str]
    seconds: float
    running: bool
    exit_code: Optional[int]
    tail: list
    extended: bool = False          # a line matched the extend pattern: the longer timeout applied
    extend_line: Optional[str] = None
    timeout: float = 0.0            # the timeout that applied


def wait_for_line(docker: Docker, name: str, pattern: str, timeout: float, offset: int, interval: float = 0.25,
                  tail_lines: int = 30, clock: Optional[Callable[[], float]] = None,
                  sleep: Optional[Callable[[float], None]] = None, extend_pattern: Optional[str] = None,
                  extended_timeout: Optional[float] = None) -> WaitResult:
    """Poll the container's log (lines after ``offset``) until a line matches, the container exits or time runs out.

    With ``extend_pattern``, a line matching it (e.g. the engine retuning its autotune caches on a first boot) makes
    ``extended_timeout`` apply instead of ``timeout``, counted from the same start."""
    clock = clock or time.monotonic
    sleep = sleep or time.sleep
    regex = re.compile(pattern)
    extend = re.compile(extend_pattern) if extend_pattern else None
    limit = float(timeout)
    started = clock()
    lines: list = []
    extend_line = None

    def result(ready, line, running, exit_code):
        return WaitResult(ready, line, clock() - started, running, exit_code, lines[-tail_lines:],
                          extend_line is not None, extend_line, limit)

    while True:
        lines = docker.logs(name).splitlines()[offset:]
        if extend is not None and extend_line is None:
            extend_line = next((line for line in lines if extend.search(line)), None)
            if extend_line is not None:
                limit = max(limit, float(extended_timeout or timeout))
        for line in lines:
            if regex.search(line):
                return result(True, line, True, None)
        container = docker.container(name)
        state = (container or {}).get("State") or {}
        if not state.get("Running"):
            # The last lines may have landed between the two reads.
            lines = docker.logs(name).splitlines()[offset:] if container else lines
            hit = next((line for line in lines if regex.search(line)), None)
            return result(hit is not None, hit, False, state.get("ExitCode"))
        if clock() - started >= limit:
            return result(False, None, True, None)
        sleep(interval)
