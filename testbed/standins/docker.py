#!/usr/bin/python3
# Over 600 lines, to be removed: the Docker CLI stand-in goes when the real engine becomes the testbed's default
# (issue 22).
"""Stand-in for the `docker` CLI on a testbed host (there is no Docker engine on a CPU CI machine).

It implements the subset the roles use, with the real CLI's arguments, output shapes and exit codes:
run (-d, --rm, -e, --env-file, -v, --name, --network, --entrypoint, --label, and the recipe's other
flags, recorded in HostConfig), ps, inspect, logs, stop, start, restart, rm, pause, unpause, exec,
build, images, image inspect/ls/rm, rmi, tag, volume create/inspect/ls/rm.

Containers are real processes. Each runs in its own mount namespace whose root is a copy of the
image's files with the host's /usr, /etc (read-only), /dev, /proc and /sys bound in, plus the
requested volumes (testbed/standins/container_init.py). `--network host` shares the host's network
namespace, `--network none` gets an empty one. State lives in /var/lib/docker like the real engine's.
Images are folders; `docker build` copies the context the Dockerfile names (FROM, COPY, ADD, ENV,
LABEL, ENTRYPOINT, CMD, WORKDIR) and the image id is the sha256 of the base id, the instructions and
every copied file, so the same context always yields the same image.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid

ROOT = os.environ.get("DOCKER_STANDIN_ROOT", "/var/lib/docker")
INIT = os.path.join(os.path.dirname(os.path.realpath(__file__)), "container_init.py")
SERVER_VERSION = "28.2.2"


class DockerError(Exception):
    def __init__(self, msg: str, code: int = 1):
        super().__init__(msg)
        self.code = code


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _read_json(path: str, default=None):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (FileNotFoundError, json.JSONDecodeError):
        return default


def _write_json(path: str, data) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1)
    os.replace(tmp, path)


def _dir(*parts: str) -> str:
    path = os.path.join(ROOT, *parts)
    os.makedirs(path, exist_ok=True)
    return path


# ---------------------------------------------------------------- images

def _repos() -> dict:
    return _read_json(os.path.join(ROOT, "repositories.json"), {})


def _normalize_tag(ref: str) -> str:
    return ref if ":" in ref.rsplit("/", 1)[-1] else f"{ref}:latest"


def find_image(ref: str) -> dict | None:
    repos = _repos()
    image_id = repos.get(_normalize_tag(ref))
    if image_id is None:
        bare = ref[7:] if ref.startswith("sha256:") else ref
        for name in os.listdir(_dir("images")):
            if name.endswith(".json") and name[:-5].startswith(bare) and len(bare) >= 12:
                image_id = "sha256:" + name[:-5]
                break
    if image_id is None:
        return None
    image = _read_json(os.path.join(ROOT, "images", image_id[7:] + ".json"))
    if image is not None:
        image["RepoTags"] = sorted(t for t, i in repos.items() if i == image_id)
    return image


def image_rootfs(image: dict) -> str:
    return os.path.join(ROOT, "images", image["Id"][7:], "rootfs")


def save_image(image: dict, tags: list[str]) -> None:
    _write_json(os.path.join(_dir("images"), image["Id"][7:] + ".json"), image)
    repos = _repos()
    for tag in tags:
        repos[_normalize_tag(tag)] = image["Id"]
    _write_json(os.path.join(ROOT, "repositories.json"), repos)


def create_image(rootfs_src: str | None, tags: list[str], config: dict, labels: dict | None = None) -> dict:
    """Register an image from a folder of files (the testbed uses it for base images)."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    if rootfs_src:
        _hash_tree(digest, rootfs_src)
    image_id = "sha256:" + digest.hexdigest()
    dest = os.path.join(_dir("images"), image_id[7:], "rootfs")
    if not os.path.isdir(dest):
        if rootfs_src:
            shutil.copytree(rootfs_src, dest, symlinks=True)
        else:
            os.makedirs(dest)
    full = dict(config)
    full.setdefault("Env", ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"])
    full["Labels"] = labels or full.get("Labels") or {}
    image = {"Id": image_id, "RepoTags": [], "RepoDigests": [], "Parent": "", "Created": now_iso(),
             "Architecture": "arm64", "Os": "linux", "Size": _tree_size(dest), "Config": full,
             "RootFS": {"Type": "layers", "Layers": [image_id]}}
    save_image(image, tags)
    return image


def _hash_tree(digest, path: str) -> None:
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, path)
            digest.update(rel.encode() + b"\0" + oct(os.stat(full).st_mode & 0o777).encode() + b"\0")
            with open(full, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)


def _tree_size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def build(context: str, tag: list[str], dockerfile: str | None, build_args: dict, quiet: bool) -> str:
    dockerfile = dockerfile or os.path.join(context, "Dockerfile")
    if not os.path.isfile(dockerfile):
        raise DockerError(f"ERROR: failed to solve: failed to read dockerfile: open {dockerfile}: no such file or directory")
    lines = _dockerfile_lines(open(dockerfile).read())
    if not lines or lines[0][0] != "FROM":
        raise DockerError("ERROR: failed to solve: the Dockerfile must start with FROM")
    base = find_image(_subst(lines[0][1], build_args))
    if base is None:
        raise DockerError(f"ERROR: failed to solve: {lines[0][1]}: failed to resolve source metadata: "
                          "pull access denied, repository does not exist or may require authorization "
                          "(the testbed hosts have no registry)")
    config = json.loads(json.dumps(base["Config"]))
    digest = hashlib.sha256(base["Id"].encode())
    staging = os.path.join(_dir("tmp"), "build-" + uuid.uuid4().hex[:12])
    shutil.copytree(image_rootfs(base), staging, symlinks=True)
    try:
        for step, (op, arg) in enumerate(lines, 1):
            arg = _subst(arg, build_args)
            digest.update(f"{op} {arg}\n".encode())
            if not quiet:
                print(f"Step {step}/{len(lines)} : {op} {arg}")
            if op == "FROM":
                continue
            if op in ("COPY", "ADD"):
                parts = [p for p in shlex.split(arg) if not p.startswith("--")]
                *sources, target = parts
                for src in sources:
                    _copy_into(context, src, staging, target, config.get("WorkingDir") or "/", digest)
            elif op == "ENV":
                env = dict(e.split("=", 1) for e in config.get("Env", []))
                for key, value in _kv_pairs(arg):
                    env[key] = value
                config["Env"] = [f"{k}={v}" for k, v in env.items()]
            elif op == "LABEL":
                config.setdefault("Labels", {}).update(dict(_kv_pairs(arg)))
            elif op in ("ENTRYPOINT", "CMD"):
                value = json.loads(arg) if arg.startswith("[") else ["/bin/sh", "-c", arg]
                config["Entrypoint" if op == "ENTRYPOINT" else "Cmd"] = value
            elif op == "WORKDIR":
                config["WorkingDir"] = arg
            elif op == "ARG":
                continue
            else:
                raise DockerError(f"ERROR: {op} is not supported by the testbed's docker build stand-in")
        image_id = "sha256:" + digest.hexdigest()
        final = os.path.join(ROOT, "images", image_id[7:], "rootfs")
        if not os.path.isdir(final):
            os.makedirs(os.path.dirname(final), exist_ok=True)
            os.replace(staging, final)
        image = {"Id": image_id, "RepoTags": [], "RepoDigests": [], "Parent": base["Id"], "Created": now_iso(),
                 "Architecture": "arm64", "Os": "linux", "Size": _tree_size(final), "Config": config,
                 "RootFS": {"Type": "layers", "Layers": base["RootFS"]["Layers"] + [image_id]}}
        existing = find_image(image_id)
        if existing:
            image["Created"] = existing["Created"]
        save_image(image, tag)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if not quiet:
        print(f"Successfully built {image_id[7:19]}")
        for t in tag:
            print(f"Successfully tagged {_normalize_tag(t)}")
    return image_id


def _dockerfile_lines(text: str) -> list[tuple[str, str]]:
    out, pending = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        op, _, arg = line.partition(" ")
        out.append((op.upper(), arg.strip()))
    return out


def _subst(text: str, args: dict) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), text)


def _kv_pairs(arg: str) -> list[tuple[str, str]]:
    parts = shlex.split(arg)
    if parts and "=" not in parts[0]:
        return [(parts[0], " ".join(parts[1:]))]
    return [tuple(p.split("=", 1)) for p in parts]


def _copy_into(context: str, src: str, rootfs: str, target: str, workdir: str, digest) -> None:
    src_path = os.path.realpath(os.path.join(context, src))
    if not (src_path + os.sep).startswith(os.path.realpath(context) + os.sep) and src_path != os.path.realpath(context):
        raise DockerError(f"ERROR: failed to compute cache key: {src}: path outside the build context")
    if not os.path.exists(src_path):
        raise DockerError(f'ERROR: failed to compute cache key: "/{src}": not found')
    if not target.startswith("/"):
        target = os.path.join(workdir, target)
    dest = os.path.join(rootfs, target.lstrip("/"))
    if os.path.isdir(src_path):
        _hash_tree(digest, src_path)
        os.makedirs(dest, exist_ok=True)
        shutil.copytree(src_path, dest, dirs_exist_ok=True)
    else:
        _hash_tree_file(digest, src_path)
        if target.endswith("/"):
            os.makedirs(dest, exist_ok=True)
            dest = os.path.join(dest, os.path.basename(src_path))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy2(src_path, dest)


def _hash_tree_file(digest, path: str) -> None:
    digest.update(os.path.basename(path).encode() + b"\0")
    with open(path, "rb") as fh:
        digest.update(fh.read())


# ---------------------------------------------------------------- volumes

def volume_inspect(name: str) -> dict | None:
    return _read_json(os.path.join(ROOT, "volumes", name, "volume.json"))


def volume_create(name: str, driver: str = "local", opts: dict | None = None, labels: dict | None = None) -> dict:
    existing = volume_inspect(name)
    if existing:
        return existing
    base = _dir("volumes", name)
    os.makedirs(os.path.join(base, "_data"), exist_ok=True)
    vol = {"CreatedAt": now_iso(), "Driver": driver, "Labels": labels or {},
           "Mountpoint": os.path.join(base, "_data"), "Name": name, "Options": opts or {}, "Scope": "local"}
    _write_json(os.path.join(base, "volume.json"), vol)
    return vol


def volume_source(vol: dict) -> str:
    """Where the volume's data is: its own folder, or for an NFS volume the head's export."""
    opts = vol.get("Options") or {}
    if opts.get("type") == "nfs":
        addr = next((o.split("=", 1)[1] for o in opts.get("o", "").split(",") if o.startswith("addr=")), "")
        export = f"/run/testbed/nfs/{addr}{opts.get('device', '').lstrip(':')}"
        if not addr or not os.path.isdir(export) or not os.access(export, os.R_OK | os.X_OK):
            raise DockerError(
                f"docker: Error response from daemon: error while mounting volume '{vol['Mountpoint']}': "
                f"failed to mount local volume: mount {opts.get('device')}:{vol['Mountpoint']}, data: "
                f"addr={addr}: permission denied.", 125)
        return export
    return vol["Mountpoint"]


# ---------------------------------------------------------------- containers

def _containers_dir() -> str:
    return _dir("containers")


def all_containers() -> list[dict]:
    out = []
    for cid in os.listdir(_containers_dir()):
        c = load_container(cid)
        if c:
            out.append(c)
    return sorted(out, key=lambda c: c["Created"], reverse=True)


def load_container(cid: str) -> dict | None:
    cdir = os.path.join(ROOT, "containers", cid)
    c = _read_json(os.path.join(cdir, "config.v2.json"))
    if c is None:
        return None
    c["State"] = _state(cdir, c["State"])
    return c


# A container's init (container_init.py) starts its own session, so its pid is also the id of its process
# group and session, and it records that pid ("pid") and its start time ("pidstart", clock ticks since
# boot, field 22 of /proc/<pid>/stat), each written by rename. Pids are reused soon (pid_max is 32768 here
# and every testbed shares one pid namespace), so a recorded pid stands for the container only while the
# process behind it leads its own session and group and started at the recorded time: anything else is
# some other process that got the number, and is never signalled.

PID_FILE_WAIT_S = 2.0
KILL_WAIT_S = 5.0


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat from the state on (state, ppid, pgrp, session, ...), None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except (FileNotFoundError, ProcessLookupError):
        # ProcessLookupError: the process was reaped between the open and the read.
        return None
    fields = data.rsplit(b")", 1)[-1].split()
    return [f.decode() for f in fields] if len(fields) > 19 else None


def _read_small(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except FileNotFoundError:
        return None


class ContainerProcess:
    """The init process of a running container, known by its pid and, where recorded, its start time."""

    def __init__(self, pid: int, start: str | None):
        self.pid = pid
        self.start = start

    def __repr__(self) -> str:
        return f"ContainerProcess(pid={self.pid}, start={self.start})"

    def alive(self) -> bool:
        """True while the recorded process runs; False once it exited (or is a zombie) or the pid is reused."""
        stat = _proc_stat(self.pid)
        if stat is None or stat[0] in ("Z", "X", "x"):
            return False
        if stat[2] != str(self.pid) or stat[3] != str(self.pid):
            return False
        return self.start is None or stat[19] == self.start

    def signal_group(self, sig: int) -> bool:
        """Signal the container's process group, checked to be still the container's just before; False
        when the container's init is gone (nothing is signalled then)."""
        if not self.alive():
            return False
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            return False
        except PermissionError:
            raise DockerError(f"Error response from daemon: cannot signal the processes of container "
                              f"(pid {self.pid}): permission denied")
        return True

    def wait(self, timeout: float) -> bool:
        """Wait up to timeout seconds for the init to exit; True when it did."""
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True


def _recorded_pid(cdir: str) -> tuple[int, str | None] | None:
    """The pid and start time the init recorded; None while there is no whole pid file (not started yet, or
    a file that is empty or not a number)."""
    text = _read_small(os.path.join(cdir, "pid"))
    if not text or not text.isdigit() or int(text) <= 0:
        return None
    start = _read_small(os.path.join(cdir, "pidstart"))
    return int(text), (start if start and start.isdigit() else None)


def container_process(cdir: str, wait_for_pid: float = 0.0) -> ContainerProcess | None:
    """The running init of the container in cdir, or None when it is not running: it exited (the shim
    wrote its exit code), it never wrote a pid file, or its pid now belongs to another process. A start
    that has not yet written its pid file is waited for up to wait_for_pid seconds."""
    deadline = time.monotonic() + wait_for_pid
    while True:
        if os.path.exists(os.path.join(cdir, "exitcode")):
            return None
        recorded = _recorded_pid(cdir)
        if recorded is not None:
            proc = ContainerProcess(*recorded)
            if not proc.alive():
                return None
            # The exit code is written after the init exits: checked again, the pid cannot be a later one's.
            return None if os.path.exists(os.path.join(cdir, "exitcode")) else proc
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


def _state(cdir: str, state: dict) -> dict:
    state = dict(state)
    exit_file = os.path.join(cdir, "exitcode")
    if state.get("Status") == "created" and _recorded_pid(cdir) is None and not os.path.exists(exit_file):
        return state
    proc = container_process(cdir)
    if proc is not None:
        paused = os.path.exists(os.path.join(cdir, "paused"))
        state.update(Status="paused" if paused else "running", Running=True, Paused=paused, Pid=proc.pid)
    else:
        try:
            code = int(_read_small(exit_file) or 137)
            finished = _dt.datetime.fromtimestamp(os.path.getmtime(exit_file), _dt.timezone.utc)
            state["FinishedAt"] = finished.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        except (FileNotFoundError, ValueError):
            code = 137
        state.update(Status="exited", Running=False, Paused=False, Pid=0, ExitCode=code)
    return state


def find_container(ref: str) -> dict | None:
    ref = ref.lstrip("/")
    containers = all_containers()
    for c in containers:
        if c["Name"] == "/" + ref or c["Id"] == ref:
            return c
    matches = [c for c in containers if len(ref) >= 4 and c["Id"].startswith(ref)]
    return matches[0] if len(matches) == 1 else None


def must_container(ref: str) -> dict:
    c = find_container(ref)
    if c is None:
        raise DockerError(f"Error response from daemon: No such container: {ref}")
    return c


def _parse_env_file(path: str) -> list[str]:
    if not os.path.isfile(path):
        raise DockerError(f"docker: open {path}: no such file or directory.", 125)
    out = []
    for line in open(path):
        line = line.rstrip("\n")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if "=" in line:
            out.append(line)
        elif line in os.environ:
            out.append(f"{line}={os.environ[line]}")
    return out


def create_container(opts: dict, image_ref: str, cmd: list[str]) -> dict:
    image = find_image(image_ref)
    if image is None:
        raise DockerError(f"Unable to find image '{_normalize_tag(image_ref)}' locally\ndocker: Error response "
                          f"from daemon: pull access denied for {image_ref.split(':')[0]}, repository does not "
                          "exist or may require 'docker login' (the testbed hosts have no registry).", 125)
    name = opts.get("name") or ("sparkfleet_" + uuid.uuid4().hex[:8])
    if not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*", name):
        raise DockerError(f'docker: Error response from daemon: Invalid container name ({name}), only '
                          '[a-zA-Z0-9][a-zA-Z0-9_.-] are allowed.', 125)
    if find_container(name):
        existing = find_container(name)
        raise DockerError(f'docker: Error response from daemon: Conflict. The container name "/{name}" is '
                          f'already in use by container "{existing["Id"]}". You have to remove (or rename) '
                          "that container to be able to reuse that name.", 125)
    env = dict(e.split("=", 1) for e in image["Config"].get("Env", []))
    for path in opts["env_files"]:
        for item in _parse_env_file(path):
            k, v = item.split("=", 1)
            env[k] = v
    for item in opts["env"]:
        if "=" in item:
            k, v = item.split("=", 1)
            env[k] = v
        elif item in os.environ:
            env[item] = os.environ[item]
    mounts, binds = [], []
    for spec in opts["volumes"]:
        mounts.append(_mount(spec))
        binds.append(spec)
    cid = hashlib.sha256(uuid.uuid4().bytes).hexdigest()
    cdir = os.path.join(_containers_dir(), cid)
    os.makedirs(cdir)
    shutil.copytree(image_rootfs(image), os.path.join(cdir, "rootfs"), symlinks=True)
    entrypoint = [opts["entrypoint"]] if opts.get("entrypoint") is not None else image["Config"].get("Entrypoint")
    if opts.get("entrypoint") == "":
        entrypoint = None
    command = cmd or (image["Config"].get("Cmd") if opts.get("entrypoint") is None else []) or []
    labels = dict(image["Config"].get("Labels") or {})
    labels.update(opts["labels"])
    container = {
        "Id": cid, "Created": now_iso(), "Path": (entrypoint or command or [""])[0],
        "Args": ((entrypoint or [])[1:] + command) if entrypoint else command[1:],
        "State": {"Status": "created", "Running": False, "Paused": False, "Restarting": False,
                  "OOMKilled": False, "Dead": False, "Pid": 0, "ExitCode": 0, "Error": "",
                  "StartedAt": "0001-01-01T00:00:00Z", "FinishedAt": "0001-01-01T00:00:00Z"},
        "Image": image["Id"], "Name": "/" + name, "RestartCount": 0, "Driver": "overlay2",
        "LogPath": os.path.join(cdir, f"{cid}-json.log"),
        "HostConfig": {
            "Binds": binds, "NetworkMode": opts["network"] or "bridge", "IpcMode": opts.get("ipc") or "private",
            "Privileged": opts["privileged"], "CapAdd": opts["cap_add"] or None, "ShmSize": opts["shm_size"],
            "Ulimits": opts["ulimits"] or None, "AutoRemove": opts["rm"],
            "Devices": [{"PathOnHost": d.split(":")[0], "PathInContainer": d.split(":")[-1],
                         "CgroupPermissions": "rwm"} for d in opts["devices"]] or None,
            "DeviceRequests": ([{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]],
                                 "Options": {}}] if opts["gpus"] else None),
            "RestartPolicy": {"Name": opts.get("restart") or "no", "MaximumRetryCount": 0},
        },
        "Mounts": mounts,
        "Config": {"Hostname": os.uname().nodename, "Env": [f"{k}={v}" for k, v in env.items()],
                   "Cmd": command or None, "Image": image_ref, "Entrypoint": entrypoint,
                   "WorkingDir": image["Config"].get("WorkingDir", ""), "Labels": labels,
                   "Healthcheck": image["Config"].get("Healthcheck")},
        "NetworkSettings": {"Networks": {opts["network"] or "bridge": {}}},
    }
    _write_json(os.path.join(cdir, "config.v2.json"), container)
    return container


def _mount(spec: str) -> dict:
    parts = spec.split(":")
    if len(parts) < 2:
        raise DockerError(f"docker: Error response from daemon: invalid volume specification: '{spec}'.", 125)
    src, dst = parts[0], parts[1]
    mode = parts[2] if len(parts) > 2 else ""
    rw = "ro" not in mode.split(",")
    if not dst.startswith("/"):
        raise DockerError(f"docker: Error response from daemon: invalid mount config: mount path must be "
                          f"absolute: {dst}.", 125)
    if src.startswith("/"):
        if not os.path.exists(src):
            os.makedirs(src)
        return {"Type": "bind", "Source": src, "Destination": dst, "Mode": mode, "RW": rw,
                "Propagation": "rprivate"}
    vol = volume_inspect(src) or volume_create(src)
    return {"Type": "volume", "Name": src, "Source": vol["Mountpoint"], "Destination": dst,
            "Driver": vol["Driver"], "Mode": mode or "z", "RW": rw, "Propagation": ""}


def _spawn_argv(container: dict) -> list[str]:
    cdir = os.path.dirname(container["LogPath"])
    argv = ["unshare", "-m", "--propagation", "private"]
    if container["HostConfig"]["NetworkMode"] == "none":
        argv.append("-n")
    return argv + ["/usr/bin/python3", INIT, cdir]


def _resolved_mounts(container: dict) -> list[dict]:
    out = []
    for m in container["Mounts"]:
        source = m["Source"]
        if m["Type"] == "volume":
            source = volume_source(volume_inspect(m["Name"]) or volume_create(m["Name"]))
        out.append({"source": source, "target": m["Destination"], "ro": not m["RW"]})
    return out


def start(container: dict, detach: bool = True) -> int:
    cdir = os.path.dirname(container["LogPath"])
    spec = {"mounts": _resolved_mounts(container), "env": container["Config"]["Env"],
            "argv": (container["Config"]["Entrypoint"] or []) + (container["Config"]["Cmd"] or []),
            "workdir": container["Config"]["WorkingDir"] or "/", "hostname": container["Config"]["Hostname"],
            "network": container["HostConfig"]["NetworkMode"]}
    if not spec["argv"]:
        raise DockerError("docker: Error response from daemon: no command specified.", 125)
    _write_json(os.path.join(cdir, "spec.json"), spec)
    for name in ("pid", "pidstart", "exitcode", "paused"):
        _unlink(os.path.join(cdir, name))
    state = dict(container["State"], StartedAt=now_iso(), Status="running", FinishedAt="0001-01-01T00:00:00Z")
    container["State"] = state
    _write_json(os.path.join(cdir, "config.v2.json"), container)
    argv = _spawn_argv(container)
    if not detach:
        proc = subprocess.Popen(argv)
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait()
        code = code if code >= 0 else 128 - code
        _write_text(os.path.join(cdir, "exitcode"), f"{code}\n")
        return code
    # A shell is the shim: it outlives the CLI, waits for the container and records its exit code (by rename:
    # a reader never sees an empty exit code file).
    exit_file = shlex.quote(os.path.join(cdir, "exitcode"))
    shim = f'{" ".join(shlex.quote(a) for a in argv)} >> {shlex.quote(container["LogPath"])} 2>&1; ' \
           f'echo $? > {exit_file}.tmp && /bin/mv -f {exit_file}.tmp {exit_file}'
    subprocess.Popen(["setsid", "/bin/sh", "-c", shim], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, close_fds=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if os.path.exists(os.path.join(cdir, "pid")) or os.path.exists(os.path.join(cdir, "exitcode")):
            break
        time.sleep(0.01)
    return 0


def stop(container: dict, timeout: float = 10.0) -> None:
    """docker stop: SIGTERM to the container's processes, SIGKILL to them after timeout seconds, then wait
    for the exit code. A container that is not running (never started, exited, or whose recorded pid now
    belongs to another process) is left as it is: docker stop succeeds on it too."""
    cdir = os.path.dirname(container["LogPath"])
    recorded = (_read_json(os.path.join(cdir, "config.v2.json")) or {}).get("State") or {}
    # Started (not "created") but no pid file yet: the init is starting, give it a moment to write one.
    proc = container_process(cdir, wait_for_pid=0 if recorded.get("Status") == "created" else PID_FILE_WAIT_S)
    if proc is not None:
        # SIGCONT too: a paused container must run to act on the SIGTERM.
        for sig in (signal.SIGTERM, signal.SIGCONT):
            proc.signal_group(sig)
        # A negative timeout waits as long as it takes, as docker's -t -1 does.
        if not proc.wait(timeout if timeout >= 0 else float("inf")):
            proc.signal_group(signal.SIGKILL)
            proc.wait(KILL_WAIT_S)
    _unlink(os.path.join(cdir, "paused"))
    if proc is not None:
        _wait_for_exit_code(cdir)


def kill(container: dict, sig: int) -> None:
    """docker kill: one signal to the container's processes; an error when the container is not running."""
    cdir = os.path.dirname(container["LogPath"])
    proc = container_process(cdir)
    if proc is None or not proc.signal_group(sig):
        raise DockerError(f"Error response from daemon: cannot kill container: {container['Name'].lstrip('/')}: "
                          f"container {container['Id']} is not running")
    if sig == signal.SIGKILL and proc.wait(KILL_WAIT_S):
        _wait_for_exit_code(cdir)


def _wait_for_exit_code(cdir: str) -> None:
    # The shim records the exit code just after the init exits; inspect right after stop must see it.
    deadline = time.monotonic() + KILL_WAIT_S
    while not os.path.exists(os.path.join(cdir, "exitcode")) and time.monotonic() < deadline:
        time.sleep(0.01)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _write_text(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def parse_signal(text: str) -> int:
    name = text.strip().upper()
    if name.isdigit() and 0 < int(name) < signal.NSIG:
        return int(name)
    try:
        return int(signal.Signals[name if name.startswith("SIG") else "SIG" + name])
    except KeyError:
        raise DockerError(f"invalid signal: {text}") from None


def remove(container: dict, force: bool) -> None:
    if container["State"]["Running"]:
        if not force:
            raise DockerError(f"Error response from daemon: cannot remove container \"{container['Name']}\": "
                              "container is running: stop the container before removing or force remove")
        stop(container, timeout=0)
    shutil.rmtree(os.path.dirname(container["LogPath"]), ignore_errors=True)


# ---------------------------------------------------------------- output helpers

def ps_row(c: dict) -> dict:
    started = c["State"].get("StartedAt", "")
    status = c["State"]["Status"]
    human = {"running": "Up", "paused": "Up (Paused)", "created": "Created"}.get(status)
    if human is None:
        human = f"Exited ({c['State'].get('ExitCode', 0)})"
    elif status != "created":
        human = f"Up {_ago(started)}" + (" (Paused)" if status == "paused" else "")
    cmd = " ".join((c["Config"].get("Entrypoint") or []) + (c["Config"].get("Cmd") or []))
    return {"Command": json.dumps(cmd[:20] + ("…" if len(cmd) > 20 else "")), "CreatedAt": c["Created"],
            "ID": c["Id"][:12], "Image": c["Config"]["Image"],
            "Labels": ",".join(f"{k}={v}" for k, v in sorted((c["Config"].get("Labels") or {}).items())),
            "LocalVolumes": str(sum(1 for m in c["Mounts"] if m["Type"] == "volume")),
            "Mounts": ",".join(m.get("Name") or m["Source"] for m in c["Mounts"]),
            "Names": c["Name"].lstrip("/"), "Networks": c["HostConfig"]["NetworkMode"], "Ports": "",
            "RunningFor": _ago(c["Created"]) + " ago", "Size": "0B", "State": status, "Status": human}


def _ago(stamp: str) -> str:
    try:
        then = _dt.datetime.strptime(stamp[:26], "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=_dt.timezone.utc)
    except ValueError:
        return "a moment"
    secs = int((_dt.datetime.now(_dt.timezone.utc) - then).total_seconds())
    if secs < 60:
        return f"{max(secs, 1)} seconds"
    if secs < 3600:
        return f"{secs // 60} minutes"
    return f"{secs // 3600} hours"


def render(template: str, obj) -> str:
    """The Go-template subset the roles use: {{json .}}, {{json .A.B}}, {{.A.B}}, {{index .A "k"}}."""
    def lookup(path: str):
        value = obj
        for part in [p for p in path.split(".") if p]:
            value = value.get(part) if isinstance(value, dict) else None
        return value

    def repl(match: re.Match) -> str:
        expr = match.group(1).strip()
        if expr.startswith("json "):
            return json.dumps(lookup(expr[5:].strip()), separators=(",", ":"))
        m = re.fullmatch(r'index\s+(\.[\w.]*)\s+"([^"]*)"', expr)
        if m:
            value = (lookup(m.group(1)) or {}).get(m.group(2))
            return "" if value is None else str(value)
        if expr.startswith("."):
            value = lookup(expr)
            if isinstance(value, bool):
                return str(value).lower()
            if isinstance(value, (dict, list)):
                return json.dumps(value)
            return "<no value>" if value is None else str(value)
        raise DockerError(f"template: the testbed's docker stand-in does not support {{{{{expr}}}}}")
    return re.sub(r"\{\{(.*?)\}\}", repl, template)


# ---------------------------------------------------------------- CLI

RUN_FLAGS_WITH_VALUE = {"-e", "--env", "--env-file", "-v", "--volume", "--name", "--network", "--net",
                        "--entrypoint", "-l", "--label", "--ipc", "--cap-add", "--shm-size", "--ulimit",
                        "--device", "--gpus", "--restart", "-w", "--workdir", "-u", "--user", "--health-cmd",
                        "--health-interval", "--health-timeout", "--health-retries", "--pid", "-m", "--memory",
                        "--hostname", "-h", "--stop-timeout", "--log-driver", "--log-opt"}


def parse_run(args: list[str]) -> tuple[dict, str, list[str]]:
    opts = {"detach": False, "rm": False, "env": [], "env_files": [], "volumes": [], "labels": {},
            "network": "", "privileged": False, "cap_add": [], "shm_size": 67108864, "ulimits": [],
            "devices": [], "gpus": "", "entrypoint": None, "name": None, "ipc": "", "restart": ""}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-") or arg == "-":
            break
        key, eq, inline = arg.partition("=")
        if key in RUN_FLAGS_WITH_VALUE and not eq:
            if i + 1 >= len(args):
                raise DockerError(f"flag needs an argument: {key}", 125)
            value = args[i + 1]
            i += 2
        else:
            value = inline
            i += 1
        if key in ("-d", "--detach"):
            opts["detach"] = True
        elif key == "--rm":
            opts["rm"] = True
        elif key in ("-e", "--env"):
            opts["env"].append(value)
        elif key == "--env-file":
            opts["env_files"].append(value)
        elif key in ("-v", "--volume"):
            opts["volumes"].append(value)
        elif key in ("-l", "--label"):
            k, _, v = value.partition("=")
            opts["labels"][k] = v
        elif key in ("--network", "--net"):
            opts["network"] = value
        elif key == "--privileged":
            opts["privileged"] = True
        elif key == "--cap-add":
            opts["cap_add"].append(value)
        elif key == "--shm-size":
            opts["shm_size"] = _size(value)
        elif key == "--ulimit":
            name, _, limits = value.partition("=")
            soft, _, hard = limits.partition(":")
            opts["ulimits"].append({"Name": name, "Soft": int(soft), "Hard": int(hard or soft)})
        elif key == "--device":
            opts["devices"].append(value)
        elif key == "--gpus":
            opts["gpus"] = value
        elif key == "--entrypoint":
            opts["entrypoint"] = value
        elif key == "--name":
            opts["name"] = value
        elif key == "--ipc":
            opts["ipc"] = value
        elif key == "--restart":
            opts["restart"] = value
        elif key in ("-i", "-t", "-it", "--init", "--interactive", "--tty") or key in RUN_FLAGS_WITH_VALUE:
            pass
        else:
            raise DockerError(f"unknown flag: {key}\nSee 'docker run --help'.", 125)
    if i >= len(args):
        raise DockerError('"docker run" requires at least 1 argument.\nSee \'docker run --help\'.', 125)
    return opts, args[i], args[i + 1:]


def _size(text: str) -> int:
    m = re.fullmatch(r"(\d+)([bkmg]?)", text.lower())
    if not m:
        raise DockerError(f"invalid size: '{text}'", 125)
    return int(m.group(1)) * {"": 1, "b": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}[m.group(2)]


def _take(args: list[str], flags: set[str], valued: set[str]) -> tuple[dict, list[str]]:
    expanded = []
    for arg in args:
        # Combined short flags, as the real CLI accepts them: -aq is -a -q.
        if re.fullmatch(r"-[a-zA-Z]{2,}", arg) and all(f"-{ch}" in flags for ch in arg[1:]):
            expanded.extend(f"-{ch}" for ch in arg[1:])
        else:
            expanded.append(arg)
    args = expanded
    opts, rest, i = {}, [], 0
    while i < len(args):
        key, eq, inline = args[i].partition("=")
        if key in valued:
            if eq:
                opts.setdefault(key, []).append(inline)
                i += 1
            else:
                opts.setdefault(key, []).append(args[i + 1] if i + 1 < len(args) else "")
                i += 2
        elif key in flags:
            opts[key] = True
            i += 1
        else:
            rest.append(args[i])
            i += 1
    return opts, rest


def _print_format(objs: list, fmt: str | None) -> None:
    if fmt:
        for obj in objs:
            print(render(fmt, obj))
    else:
        print(json.dumps(objs, indent=4))


def _ps_filter(c: dict, filters: list[str]) -> bool:
    for f in filters:
        key, _, value = f.partition("=")
        if key == "name" and value.lstrip("/") not in c["Name"].lstrip("/"):
            return False
        if key == "status" and c["State"]["Status"] != value:
            return False
        if key == "label":
            k, eq, v = value.partition("=")
            labels = c["Config"].get("Labels") or {}
            if k not in labels or (eq and labels[k] != v):
                return False
        if key == "ancestor" and c["Config"]["Image"] != value:
            return False
    return True


def main(argv: list[str]) -> int:
    if not argv:
        print("Usage:  docker [OPTIONS] COMMAND (testbed stand-in)")
        return 0
    verb, args = argv[0], argv[1:]
    if verb in ("container", "image", "volume") and args:
        sub = args[0]
        if verb == "container":
            return main([sub] + args[1:])
        if verb == "image":
            aliases = {"ls": "images", "list": "images", "rm": "rmi", "inspect": "image-inspect",
                       "build": "build", "tag": "tag"}
            return main([aliases.get(sub, "image-" + sub)] + args[1:])
        return volume_cli(sub, args[1:])
    if verb == "version":
        opts, _ = _take(args, set(), {"--format", "-f"})
        fmt = (opts.get("--format") or opts.get("-f") or [None])[0]
        data = {"Client": {"Version": SERVER_VERSION}, "Server": {"Version": SERVER_VERSION}}
        print(render(fmt, data) if fmt else f"Client: {SERVER_VERSION}\nServer: {SERVER_VERSION} (testbed stand-in)")
        return 0
    if verb == "run":
        opts, image, cmd = parse_run(args)
        container = create_container(opts, image, cmd)
        if opts["detach"]:
            start(container, detach=True)
            print(container["Id"])
            return 0
        code = start(container, detach=False)
        if opts["rm"]:
            remove(load_container(container["Id"]), force=True)
        return code
    if verb == "ps":
        opts, _ = _take(args, {"-a", "--all", "-q", "--quiet", "--no-trunc"}, {"--format", "--filter", "-f"})
        rows = [c for c in all_containers() if (opts.get("-a") or opts.get("--all") or c["State"]["Running"])
                and _ps_filter(c, opts.get("--filter", []) + opts.get("-f", []))]
        if opts.get("-q") or opts.get("--quiet"):
            for c in rows:
                print(c["Id"] if opts.get("--no-trunc") else c["Id"][:12])
            return 0
        fmt = (opts.get("--format") or [None])[0]
        if fmt:
            for c in rows:
                print(render(fmt, ps_row(c)))
            return 0
        print(f"{'CONTAINER ID':<15}{'IMAGE':<36}{'STATUS':<24}NAMES")
        for c in rows:
            r = ps_row(c)
            print(f"{r['ID']:<15}{r['Image']:<36}{r['Status']:<24}{r['Names']}")
        return 0
    if verb == "inspect":
        opts, refs = _take(args, {"-s", "--size"}, {"--format", "-f", "--type"})
        fmt = (opts.get("--format") or opts.get("-f") or [None])[0]
        kind = (opts.get("--type") or [""])[0]
        objs, missing = [], []
        for ref in refs:
            obj = None
            if kind in ("", "container"):
                obj = find_container(ref)
            if obj is None and kind in ("", "image"):
                obj = find_image(ref)
            if obj is None and kind in ("", "volume"):
                obj = volume_inspect(ref)
            (objs.append(obj) if obj is not None else missing.append(ref))
        _print_format(objs, fmt)
        for ref in missing:
            print(f"Error: No such object: {ref}", file=sys.stderr)
        return 1 if missing else 0
    if verb == "image-inspect":
        opts, refs = _take(args, set(), {"--format", "-f"})
        objs = [find_image(r) for r in refs]
        _print_format([o for o in objs if o], (opts.get("--format") or opts.get("-f") or [None])[0])
        for ref, obj in zip(refs, objs):
            if obj is None:
                print(f"Error response from daemon: No such image: {ref}", file=sys.stderr)
        return 1 if None in objs else 0
    if verb == "logs":
        opts, refs = _take(args, {"-f", "--follow", "-t", "--timestamps"}, {"--tail", "-n", "--since"})
        c = must_container(refs[0])
        try:
            data = open(c["LogPath"], "rb").read()
        except FileNotFoundError:
            data = b""
        tail = (opts.get("--tail") or opts.get("-n") or ["all"])[0]
        if tail != "all":
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-int(tail):]) if int(tail) > 0 else b""
        sys.stdout.buffer.write(data)
        return 0
    if verb in ("stop", "kill"):
        opts, refs = _take(args, set(), {"-t", "--time", "-s", "--signal"})
        if not refs:
            raise DockerError(f'"docker {verb}" requires at least 1 argument.\nSee \'docker {verb} --help\'.')
        timeout_text = (opts.get("-t") or opts.get("--time") or ["10"])[0]
        try:
            timeout = float(timeout_text)
        except ValueError:
            raise DockerError(f'invalid argument "{timeout_text}" for "-t, --time" flag: strconv.ParseInt: '
                              f'parsing "{timeout_text}": invalid syntax') from None
        sig = parse_signal((opts.get("-s") or opts.get("--signal") or ["KILL"])[0])
        code = 0
        for ref in refs:
            # Like docker: every container is tried, each failure is one line on stderr, and the exit code is 1.
            try:
                c = must_container(ref)
                stop(c, timeout) if verb == "stop" else kill(c, sig)
            except DockerError as exc:
                print(str(exc), file=sys.stderr)
                code = 1
                continue
            print(ref)
        return code
    if verb in ("start", "restart"):
        for ref in [a for a in args if not a.startswith("-")]:
            c = must_container(ref)
            if verb == "restart":
                stop(c)
                c = must_container(ref)
            if not c["State"]["Running"]:
                start(c, detach=True)
            print(ref)
        return 0
    if verb == "rm":
        opts, refs = _take(args, {"-f", "--force", "-v", "--volumes"}, set())
        code = 0
        for ref in refs:
            c = find_container(ref)
            if c is None:
                print(f"Error response from daemon: No such container: {ref}", file=sys.stderr)
                code = 1
                continue
            remove(c, bool(opts.get("-f") or opts.get("--force")))
            print(ref)
        return code
    if verb in ("pause", "unpause"):
        for ref in args:
            c = must_container(ref)
            cdir = os.path.dirname(c["LogPath"])
            if not c["State"]["Running"]:
                raise DockerError(f"Error response from daemon: container {c['Id']} is not running")
            paused = os.path.exists(os.path.join(cdir, "paused"))
            if verb == "pause" and paused:
                raise DockerError(f"Error response from daemon: container {c['Id']} is already paused")
            if verb == "unpause" and not paused:
                raise DockerError(f"Error response from daemon: container {c['Id']} is not paused")
            proc = container_process(cdir)
            if proc is None or not proc.signal_group(signal.SIGSTOP if verb == "pause" else signal.SIGCONT):
                raise DockerError(f"Error response from daemon: container {c['Id']} is not running")
            if verb == "pause":
                open(os.path.join(cdir, "paused"), "w").close()
            else:
                os.unlink(os.path.join(cdir, "paused"))
            print(ref)
        return 0
    if verb == "exec":
        i = 0
        env = []
        while i < len(args) and args[i].startswith("-"):
            if args[i] in ("-e", "--env"):
                env.append(args[i + 1])
                i += 2
            else:
                i += 1
        c = must_container(args[i])
        if not c["State"]["Running"]:
            raise DockerError(f"Error response from daemon: container {c['Id']} is not running", 1)
        full_env = c["Config"]["Env"] + env
        ns = ["-m"] + (["-n"] if c["HostConfig"]["NetworkMode"] == "none" else [])
        proc = subprocess.run(["nsenter", "-t", str(c["State"]["Pid"]), *ns, "-r", "-w", "--",
                               "/usr/bin/env", "-i", *full_env, *args[i + 1:]])
        return proc.returncode
    if verb == "build":
        opts, rest = _take(args, {"-q", "--quiet", "--no-cache", "--pull"}, {"-t", "--tag", "-f", "--file",
                                                                          "--build-arg", "--label"})
        if len(rest) != 1:
            raise DockerError('"docker build" requires exactly 1 argument.')
        build_args = dict(a.split("=", 1) for a in opts.get("--build-arg", []) if "=" in a)
        image_id = build(rest[0], opts.get("-t", []) + opts.get("--tag", []),
                         (opts.get("-f") or opts.get("--file") or [None])[0], build_args,
                         bool(opts.get("-q") or opts.get("--quiet")))
        if opts.get("-q") or opts.get("--quiet"):
            print(image_id)
        return 0
    if verb == "images":
        opts, _ = _take(args, {"-q", "--quiet", "-a", "--no-trunc"}, {"--format", "--filter", "-f"})
        fmt = (opts.get("--format") or [None])[0]
        for tag, image_id in sorted(_repos().items()):
            repo, _, t = tag.rpartition(":")
            row = {"Repository": repo, "Tag": t, "ID": image_id[7:19], "CreatedAt": "", "Size": "0B",
                   "Digest": "<none>"}
            print(render(fmt, row) if fmt else (image_id[7:19] if opts.get("-q") else f"{repo:<40}{t:<24}{image_id[7:19]}"))
        return 0
    if verb == "tag":
        image = find_image(args[0])
        if image is None:
            raise DockerError(f"Error response from daemon: No such image: {args[0]}")
        save_image(image, [args[1]])
        return 0
    if verb == "rmi":
        opts, refs = _take(args, {"-f", "--force"}, set())
        repos = _repos()
        for ref in refs:
            tag = _normalize_tag(ref)
            if tag in repos:
                image_id = repos.pop(tag)
                print(f"Untagged: {tag}")
            else:
                image = find_image(ref)
                if image is None:
                    raise DockerError(f"Error response from daemon: No such image: {ref}")
                image_id = image["Id"]
                for t in [t for t, i in repos.items() if i == image_id]:
                    repos.pop(t)
            in_use = [c for c in all_containers() if c["Image"] == image_id]
            if in_use and image_id not in repos.values() and not opts:
                pass
            _write_json(os.path.join(ROOT, "repositories.json"), repos)
            if image_id not in repos.values() and not in_use:
                shutil.rmtree(os.path.join(ROOT, "images", image_id[7:]), ignore_errors=True)
                try:
                    os.unlink(os.path.join(ROOT, "images", image_id[7:] + ".json"))
                except FileNotFoundError:
                    pass
                print(f"Deleted: {image_id}")
        return 0
    raise DockerError(f"docker: '{verb}' is not a docker command supported by the testbed stand-in.\n"
                      "See 'docker --help'")


def volume_cli(sub: str, args: list[str]) -> int:
    if sub == "create":
        opts, rest = _take(args, set(), {"--driver", "-d", "--opt", "-o", "--label"})
        name = rest[0] if rest else uuid.uuid4().hex
        vol_opts = dict(o.split("=", 1) for o in opts.get("--opt", []) + opts.get("-o", []))
        labels = dict(l.split("=", 1) for l in opts.get("--label", []) if "=" in l)
        volume_create(name, (opts.get("--driver") or opts.get("-d") or ["local"])[0], vol_opts, labels)
        print(name)
        return 0
    if sub == "inspect":
        opts, refs = _take(args, set(), {"--format", "-f"})
        objs = [volume_inspect(r) for r in refs]
        _print_format([o for o in objs if o], (opts.get("--format") or opts.get("-f") or [None])[0])
        for ref, obj in zip(refs, objs):
            if obj is None:
                print(f"Error response from daemon: get {ref}: no such volume", file=sys.stderr)
        return 1 if None in objs else 0
    if sub in ("ls", "list"):
        opts, _ = _take(args, {"-q", "--quiet"}, {"--format", "--filter", "-f"})
        fmt = (opts.get("--format") or [None])[0]
        for name in sorted(os.listdir(_dir("volumes"))):
            vol = volume_inspect(name)
            if vol:
                print(render(fmt, vol) if fmt else (name if opts.get("-q") else f"{vol['Driver']:<10}{name}"))
        return 0
    if sub == "rm":
        for name in [a for a in args if not a.startswith("-")]:
            if any(m.get("Name") == name for c in all_containers() for m in c["Mounts"]):
                raise DockerError(f"Error response from daemon: remove {name}: volume is in use")
            if not volume_inspect(name):
                raise DockerError(f"Error response from daemon: get {name}: no such volume")
            shutil.rmtree(os.path.join(ROOT, "volumes", name))
            print(name)
        return 0
    raise DockerError(f"docker volume {sub}: not supported by the testbed stand-in")


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except DockerError as exc:
        print(str(exc), file=sys.stderr)
        sys.exit(exc.code)
    except BrokenPipeError:
        sys.exit(0)
    except OSError as exc:
        # What the machine refused (a file, a process): one line, as the daemon's errors are.
        print(f"Error response from daemon: {exc}", file=sys.stderr)
        sys.exit(1)
