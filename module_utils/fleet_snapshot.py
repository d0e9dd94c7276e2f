# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read-only snapshot of one fleet host: memory and pressure, load, GPU clocks and lock, driver, boot
target and display, containers, the serving container's env and image, volume space, files and units.

Plain Python (standard library only): hosts have a bare Debian python3. Every external command goes
through an injected ``run(argv) -> (rc, stdout, stderr)`` so unit tests mock it; every path is in
``Paths`` so unit tests point it at fixtures. A section that cannot be read records why under
``errors`` instead of failing the whole snapshot: a snapshot is an observation, not a gate.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import socket
import stat
from dataclasses import dataclass
from typing import Callable, Iterable

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.module_alias import warn_if_deprecated
from ansible.module_utils.env_text import mask_tree, secret_values
from ansible.module_utils.node_preflight_parsers import parse_clock_query

Runner = Callable[[list], tuple]

SECTIONS = ("memory", "load", "gpu", "boot", "containers", "serving", "disks", "files", "units")


@dataclass(frozen=True)
class Paths:
    """Where the host's state is read from (tests replace them with fixtures)."""
    meminfo: str = "/proc/meminfo"
    pressure_memory: str = "/proc/pressure/memory"
    loadavg: str = "/proc/loadavg"
    unit_dir: str = "/etc/systemd/system"
    nvidia_drm_parameters: str = "/sys/module/nvidia_drm/parameters"


@dataclass(frozen=True)
class Request:
    """What to gather (the module's options)."""
    sections: tuple = SECTIONS
    serving_names: tuple = ()    # the inventory's engine container names (fleet_head_container, fleet_worker_container)
    serving_image: str = ""
    owner_label: str = "owner"
    volumes: tuple = ()          # ((name, path), ...)
    files: tuple = ()
    units: tuple = ()
    content_max_bytes: int = 65536
    secret_env_keys: tuple = ()  # env keys masked besides those that look secret (module_utils/env_text)


DEFAULT_PATHS = Paths()


class SectionError(Exception):
    """A section could not be read; the message says what and where."""


# ------------------------------------------------------------------ helpers

def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def _int_or_none(text: str):
    text = (text or "").strip()
    for suffix in (" MHz", "MHz", " MiB", " %"):
        if text.endswith(suffix):
            text = text[: -len(suffix)].strip()
    try:
        return int(float(text))
    except ValueError:
        return None


def _checked(run: Runner, argv: list, what: str) -> str:
    try:
        rc, out, err = run(argv)
    except OSError as exc:  # the tool is missing
        raise SectionError(f"{what}: cannot run {argv[0]}: {exc}") from exc
    if rc != 0:
        raise SectionError(f"{what}: `{' '.join(argv)}` exited {rc}: {(err or out).strip()[:300]}")
    return out


# ------------------------------------------------------------------ memory, load

def parse_meminfo(text: str) -> dict:
    """/proc/meminfo as {key: kB}."""
    values = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if not sep:
            continue
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key.strip()] = int(parts[0])
    return values


def parse_pressure(text: str) -> dict:
    """/proc/pressure/memory as {"some": {"avg10": .., "avg60": .., "avg300": .., "total": ..}, "full": ..}."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        fields = {}
        for part in parts[1:]:
            key, _, value = part.partition("=")
            fields[key] = int(value) if key == "total" else float(value)
        out[parts[0]] = fields
    return out


def memory(paths: Paths) -> dict:
    try:
        info = parse_meminfo(_read(paths.meminfo))
    except OSError as exc:
        raise SectionError(f"memory: cannot read {paths.meminfo}: {exc}") from exc
    cma_total, cma_free = info.get("CmaTotal"), info.get("CmaFree")
    try:
        pressure = parse_pressure(_read(paths.pressure_memory))
    except OSError:
        pressure = None  # kernels without PSI (or PSI disabled) have no such file
    return {
        "mem_total_kb": info.get("MemTotal"), "mem_free_kb": info.get("MemFree"),
        "mem_available_kb": info.get("MemAvailable"), "cached_kb": info.get("Cached"),
        "cma_total_kb": cma_total, "cma_free_kb": cma_free,
        # docs/reference.md section 11: CmaFree above CmaTotal is the tell of the Kexec HandOver kernel.
        "cma_free_exceeds_total": (cma_total is not None and cma_free is not None and cma_free > cma_total),
        "pressure": pressure,
    }


def load(paths: Paths) -> dict:
    try:
        parts = _read(paths.loadavg).split()
    except OSError as exc:
        raise SectionError(f"load: cannot read {paths.loadavg}: {exc}") from exc
    running, _, total = parts[3].partition("/") if len(parts) > 3 else ("", "", "")
    return {"load1": float(parts[0]), "load5": float(parts[1]), "load15": float(parts[2]),
            "runnable": _int_or_none(running), "processes": _int_or_none(total), "cpus": os.cpu_count()}


# ------------------------------------------------------------------ GPU

QUERY_FIELDS = ("index", "name", "driver_version", "clocks.sm", "clocks.max.sm")


def parse_query_gpu(text: str) -> list:
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < len(QUERY_FIELDS):
            continue
        gpus.append({"index": _int_or_none(cells[0]), "name": cells[1], "driver": cells[2],
                     "sm_mhz": _int_or_none(cells[3]), "max_sm_mhz": _int_or_none(cells[4])})
    return gpus


def gpu(run: Runner) -> dict:
    query = _checked(run, ["nvidia-smi", f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits"],
                     "gpu")
    gpus = parse_query_gpu(query)
    if not gpus:
        raise SectionError(f"gpu: nvidia-smi listed no GPU ({query.strip()[:200]!r})")
    clocks = parse_clock_query(_checked(run, ["nvidia-smi", "-q", "-d", "CLOCK"], "gpu"))
    for index, entry in enumerate(gpus):
        detail = clocks["gpus"][index] if index < len(clocks["gpus"]) else {}
        lo, hi = detail.get("locked_min"), detail.get("locked_max")
        entry["bus_id"] = detail.get("bus_id")
        entry["locked"] = {"min_mhz": lo, "max_mhz": hi} if lo is not None and hi is not None else None
    first = gpus[0]
    return {"count": len(gpus), "name": first["name"], "driver": first["driver"] or clocks["driver"],
            "sm_mhz": first["sm_mhz"], "max_sm_mhz": first["max_sm_mhz"], "locked": first["locked"],
            "gpus": gpus}


# ------------------------------------------------------------------ boot target and display

def _unit_link(paths: Paths, name: str):
    path = os.path.join(paths.unit_dir, name)
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def _systemctl_word(run: Runner, verb: str, unit: str) -> str:
    try:
        rc, out, err = run(["systemctl", verb, unit])
    except OSError as exc:
        raise SectionError(f"systemctl {verb} {unit}: {exc}") from exc
    word = out.strip().splitlines()[-1].strip() if out.strip() else ""
    if not word:
        word = "not-found" if "not found" in (err or "").lower() or rc == 4 or rc == 1 else "unknown"
    return word


def boot(run: Runner, paths: Paths) -> dict:
    target = _unit_link(paths, "default.target")
    source = "link"
    if target is None:
        target = _checked(run, ["systemctl", "get-default"], "boot").strip() or None
        source = "systemctl"
    display_unit = _unit_link(paths, "display-manager.service")
    display = None
    if display_unit:
        display = {"unit": display_unit, "active": _systemctl_word(run, "is-active", display_unit)}
    drm = None
    if os.path.isdir(paths.nvidia_drm_parameters):
        drm = {}
        for name in ("modeset", "fbdev"):
            try:
                drm[name] = _read(os.path.join(paths.nvidia_drm_parameters, name)).strip()
            except OSError:
                drm[name] = None
    return {"default_target": target, "default_target_source": source, "display_manager": display,
            "nvidia_drm": drm}


# ------------------------------------------------------------------ containers and serving

def _env_dict(env_list) -> dict:
    out = {}
    for item in env_list or []:
        key, _, value = item.partition("=")
        out[key] = value
    return out


def inspect_containers(run: Runner) -> list:
    ids = _checked(run, ["docker", "ps", "-a", "-q", "--no-trunc"], "containers").split()
    if not ids:
        return []
    text = _checked(run, ["docker", "inspect", "--type", "container", *ids], "containers")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise SectionError(f"containers: docker inspect did not return JSON: {exc}") from exc


def serving_image_id(run: Runner, image: str):
    if not image:
        return None
    rc, out, _ = run(["docker", "image", "inspect", "--format", "{{.Id}}", image])
    return out.strip() or None if rc == 0 else None


def _is_serving(raw: dict, names: Iterable, image: str, image_id) -> bool:
    name = raw.get("Name", "").lstrip("/")
    cfg = raw.get("Config") or {}
    return (name in names or (bool(image) and cfg.get("Image") == image)
            or (image_id is not None and raw.get("Image") == image_id))


def container_rows(raw_list: list, request: Request, image_id) -> list:
    rows = []
    for raw in raw_list:
        cfg, state = raw.get("Config") or {}, raw.get("State") or {}
        labels = cfg.get("Labels") or {}
        rows.append({
            "name": raw.get("Name", "").lstrip("/"), "id": raw.get("Id", "")[:12], "image": cfg.get("Image"),
            "image_id": raw.get("Image"), "state": state.get("Status"), "labels": labels,
            "owner": labels.get(request.owner_label),
            "restart_policy": ((raw.get("HostConfig") or {}).get("RestartPolicy") or {}).get("Name"),
            "serving": _is_serving(raw, request.serving_names, request.serving_image, image_id),
        })
    return sorted(rows, key=lambda r: r["name"])


def serving_rows(raw_list: list, request: Request, image_id) -> list:
    rows = []
    for raw in raw_list:
        if not _is_serving(raw, request.serving_names, request.serving_image, image_id):
            continue
        cfg, state = raw.get("Config") or {}, raw.get("State") or {}
        rows.append({
            "name": raw.get("Name", "").lstrip("/"), "image": cfg.get("Image"), "image_id": raw.get("Image"),
            "state": state.get("Status"), "started_at": state.get("StartedAt"), "env": _env_dict(cfg.get("Env")),
            "mounts": [{"source": m.get("Source") or m.get("Name"), "destination": m.get("Destination"),
                        "rw": m.get("RW")} for m in raw.get("Mounts") or []],
        })
    return sorted(rows, key=lambda r: r["name"])


# ------------------------------------------------------------------ disks, files, units

def _existing_ancestor(path: str) -> str:
    current = os.path.abspath(path)
    while not os.path.exists(current) and current != "/":
        current = os.path.dirname(current)
    return current


def disks(volumes: Iterable) -> dict:
    out = {}
    for name, path in volumes:
        measured = _existing_ancestor(path)
        try:
            st = os.statvfs(measured)
        except OSError as exc:
            out[name] = {"path": path, "error": f"statvfs {measured}: {exc}"}
            continue
        total, free, avail = st.f_blocks * st.f_frsize, st.f_bfree * st.f_frsize, st.f_bavail * st.f_frsize
        out[name] = {"path": path, "exists": os.path.exists(path), "measured_path": measured,
                     "device": os.stat(measured).st_dev, "total_bytes": total, "free_bytes": free,
                     "available_bytes": avail,
                     "used_percent": round(100.0 * (total - free) / total, 1) if total else None}
    return out


def file_facts(path: str, content_max_bytes: int) -> dict:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {"exists": False}
    except OSError as exc:
        return {"exists": None, "error": str(exc)}
    facts = {"exists": True, "mode": f"{stat.S_IMODE(st.st_mode):04o}", "size": st.st_size}
    if stat.S_ISLNK(st.st_mode):
        facts.update(type="link", link_target=os.readlink(path))
        return facts
    if stat.S_ISDIR(st.st_mode):
        facts["type"] = "directory"
        return facts
    if not stat.S_ISREG(st.st_mode):
        facts["type"] = "other"
        return facts
    facts["type"] = "file"
    digest = hashlib.sha256()
    head = b""
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
                if len(head) <= content_max_bytes:
                    head += block[: content_max_bytes + 1 - len(head)]
    except OSError as exc:
        facts["error"] = str(exc)
        return facts
    facts["sha256"] = digest.hexdigest()
    if st.st_size <= content_max_bytes:
        try:
            facts["content"] = head.decode("utf-8")
        except UnicodeDecodeError:
            facts["content"] = None  # binary: the hash says enough
    return facts


def unit_facts(run: Runner, unit: str) -> dict:
    return {"enabled": _systemctl_word(run, "is-enabled", unit), "active": _systemctl_word(run, "is-active", unit)}


# ------------------------------------------------------------------ the snapshot

def take(run: Runner, request: Request, paths: Paths | None = None) -> dict:
    """One snapshot of this host. Never changes anything."""
    paths = paths or DEFAULT_PATHS
    snap = {"host": socket.gethostname(),
            "taken_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "sections": list(request.sections), "errors": {}}

    def guarded(name: str, fn: Callable[[], object]) -> None:
        try:
            snap[name] = fn()
        except SectionError as exc:
            snap[name] = None
            snap["errors"][name] = str(exc)

    wanted = set(request.sections)
    if "memory" in wanted:
        guarded("memory", lambda: memory(paths))
    if "load" in wanted:
        guarded("load", lambda: load(paths))
    if "gpu" in wanted:
        guarded("gpu", lambda: gpu(run))
    if "boot" in wanted:
        guarded("boot", lambda: boot(run, paths))
    if wanted & {"containers", "serving"}:
        try:
            raw = inspect_containers(run)
            image_id = serving_image_id(run, request.serving_image)
        except SectionError as exc:
            for name in wanted & {"containers", "serving"}:
                snap[name] = None
                snap["errors"][name] = str(exc)
        else:
            if "containers" in wanted:
                snap["containers"] = container_rows(raw, request, image_id)
            if "serving" in wanted:
                snap["serving"] = {"image": request.serving_image or None, "image_id": image_id,
                                   "containers": serving_rows(raw, request, image_id)}
    if "disks" in wanted:
        snap["disks"] = disks(request.volumes)
    if "files" in wanted:
        snap["files"] = {path: file_facts(path, request.content_max_bytes) for path in request.files}
    if "units" in wanted:
        units = {}
        for unit in request.units:
            try:
                units[unit] = unit_facts(run, unit)
            except SectionError as exc:
                units[unit] = {"error": str(exc)}
        snap["units"] = units
    # Secrets never leave the host: serving env values of secret-looking keys, the same values anywhere else in
    # the snapshot (a file's content), and URL credentials (module_utils/env_text, issue 19 item 13).
    secrets = [v for row in (snap.get("serving") or {}).get("containers") or []
               for v in secret_values(row.get("env") or {}, request.secret_env_keys)]
    return mask_tree(snap, secrets, request.secret_env_keys)


def sections_from(gather: Iterable) -> tuple:
    gather = list(gather or ["all"])
    if "all" in gather:
        return SECTIONS
    return tuple(s for s in SECTIONS if s in gather)




def run_module(name: str) -> None:
    """The body of the fleet_snapshot_info module (and of its deprecated alias fleet_snapshot)."""
    module = AnsibleModule(
        argument_spec=dict(
            gather=dict(type="list", elements="str", default=["all"], choices=["all", *SECTIONS]),
            serving_names=dict(type="list", elements="str", default=[]),
            serving_image=dict(type="str", default=""),
            owner_label=dict(type="str", default="owner"),
            volumes=dict(type="dict", default={}),
            files=dict(type="list", elements="path", default=[]),
            units=dict(type="list", elements="str", default=[]),
            content_max_bytes=dict(type="int", default=65536),
            secret_env_keys=dict(type="list", elements="str", default=[], no_log=False),
        ),
        supports_check_mode=True,
    )
    warn_if_deprecated(module, name)
    p = module.params
    bad = [name for name, path in p["volumes"].items() if not isinstance(path, str) or not path.startswith("/")]
    if bad:
        module.fail_json(msg=f"volumes must map names to absolute paths; not absolute: {', '.join(sorted(bad))}",
                         volumes=p["volumes"])
    if p["content_max_bytes"] < 0:
        module.fail_json(msg=f"content_max_bytes must be 0 or more, not {p['content_max_bytes']}")

    def run(argv: list) -> tuple:
        # A missing tool raises OSError: that section then records the error instead of failing the module.
        return module.run_command(argv, environ_update={"LC_ALL": "C"}, handle_exceptions=False,
                                  expand_user_and_vars=False)

    request = Request(
        sections=sections_from(p["gather"]), serving_names=tuple(p["serving_names"]),
        serving_image=p["serving_image"], owner_label=p["owner_label"],
        volumes=tuple(sorted(p["volumes"].items())), files=tuple(p["files"]), units=tuple(p["units"]),
        content_max_bytes=p["content_max_bytes"], secret_env_keys=tuple(p["secret_env_keys"]))
    module.exit_json(changed=False, snapshot=take(run, request))

