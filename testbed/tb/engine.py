"""The testbed's container engine: a real Debian `dockerd` per host (issue 22).

Every host gets its own `dockerd` (docker.io, daemon 20.10) started inside the host's network, mount and UTS
namespaces (`testbed/fleet up`; `--engine docker` and `SPARKFLEET_TESTBED_ENGINE=docker` name the only engine):

- data-root /var/lib/docker on a tmpfs of the host's own (hostinit mounts it), exec-root /run/docker and the socket at the
  standard /var/run/docker.sock on the host's private /run tmpfs, pidfile /run/docker.pid;
- `--bridge=none --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false`: no bridge, no
  iptables rule in any namespace; containers run `--network host` (the host's namespace) or `none`;
- `--storage-driver=overlay2` (copy-on-write; its upper folders cannot sit on overlayfs, hence the tmpfs data-root:
  vfs copied the whole root at every build step) and a distinct `--cgroup-parent`
  (sparkfleet-tb<k>-<host>, removed by `down`);
- PATH starts with the host's /usr/local/bin, where hostinit links the stand-in `nvidia-container-runtime-hook`:
  dockerd registers its `--gpus` device driver only when it finds that hook.

Images are made locally, no registry: a base root filesystem (the machine's Python 3 and the few binaries and
libraries it needs) and a tiny one (`sleep`, `sh` and libc) are packed once into tarballs under the testbed's
cache folder (.cache/sparkfleet-testbed, kept by `down`) and `docker import`ed on every host by provisioning.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from .common import REPO, TESTBED_ID, TestbedError, log

ENGINES = ("docker",)
DAEMON_TOOLS = {"/usr/sbin/dockerd": "docker.io", "/usr/bin/docker": "docker.io", "/usr/bin/containerd": "containerd",
                "/usr/sbin/runc": "runc"}
# Bumped when what goes into a root filesystem changes: the cached tarballs are rebuilt.
ROOTFS_RECIPE = 2
PYTHON_SKIP = ("test", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip", "pydoc_data", "distutils",
               "site-packages", "dist-packages")
TINY_BINARIES = ("/bin/sleep", "/bin/sh", "/bin/cat", "/bin/true", "/bin/ls")
BASE_BINARIES = TINY_BINARIES + ("/usr/bin/env", "/bin/rm", "/bin/mkdir")
DAEMON_START_S = 60.0


def engine_from_env(value: str | None = None) -> str:
    engine = (value or os.environ.get("SPARKFLEET_TESTBED_ENGINE") or "docker").strip()
    if engine == "standin":
        raise TestbedError("the docker CLI stand-in was removed (issue 22): every testbed host runs a real dockerd; "
                           "unset SPARKFLEET_TESTBED_ENGINE or set it to docker")
    if engine not in ENGINES:
        raise TestbedError(f"unknown testbed engine {engine!r}; known: {', '.join(ENGINES)} "
                           "(SPARKFLEET_TESTBED_ENGINE or testbed/fleet up --engine)")
    return engine


def preflight() -> None:
    missing = sorted({pkg for tool, pkg in DAEMON_TOOLS.items() if not os.access(tool, os.X_OK)})
    if missing:
        raise TestbedError(f"the docker engine needs Debian packages {' '.join(missing)}: run `make deps` "
                           f"(apt-get install -y docker.io)")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(REPO / ".cache")
    return Path(base) / "sparkfleet-testbed"


def cgroup_parent(host: str) -> str:
    return f"sparkfleet-tb{TESTBED_ID}-{host}"


# ---------------------------------------------------------------- root filesystems

def _ldd(path: str) -> list[str]:
    out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        for part in parts:
            if part.startswith("/") and os.path.exists(part):
                libs.append(part)
    return libs


def _python_files() -> list[str]:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    # The hosts' /usr/bin/python3 (not the venv's interpreter that may run this).
    real = os.path.realpath("/usr/bin/python3")
    stdlib = f"/usr/lib/{version}"
    files = [real]
    for dirpath, dirnames, filenames in os.walk(stdlib):
        rel = os.path.relpath(dirpath, stdlib)
        if rel == ".":
            dirnames[:] = [d for d in dirnames if d not in PYTHON_SKIP and not d.startswith("config-")]
        files += [os.path.join(dirpath, f) for f in filenames]
    return files


def _closure(paths: list[str]) -> list[str]:
    seen: dict[str, None] = {}
    for path in paths:
        seen.setdefault(path, None)
        if path.endswith(".so") or ".so." in path or os.access(path, os.X_OK) and not os.path.isdir(path):
            for lib in _ldd(path):
                seen.setdefault(lib, None)
    return list(seen)


def _add_file(tar: tarfile.TarFile, path: str) -> None:
    """path and, when it is a link, what it points to, under the same names as on the machine."""
    name = path.lstrip("/")
    # /bin, /lib and /lib64 are links into /usr on Debian 12: store the /usr path, and the link itself.
    real_dir = os.path.realpath(os.path.dirname(path))
    if real_dir != os.path.dirname(path):
        name = os.path.join(real_dir, os.path.basename(path)).lstrip("/")
    if name in tar.getnames():
        return
    info = tar.gettarinfo(path, arcname=name)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
    if info.issym():
        tar.addfile(info)
        target = os.path.join(os.path.dirname(path), os.readlink(path))
        _add_file(tar, os.path.normpath(target))
        return
    with open(path, "rb") as fh:
        tar.addfile(info, fh)


def _add_text(tar: tarfile.TarFile, name: str, text: str, mode: int = 0o644) -> None:
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, 0
    tar.addfile(info)


def _write_rootfs(path: Path, files: list[str], python: bool) -> None:
    tmp = path.with_suffix(".partial")
    with tarfile.open(tmp, "w") as tar:
        for top in ("usr", "usr/bin", "usr/lib", "usr/lib64", "etc", "tmp", "root", "proc", "sys", "dev", "run",
                    "var", "var/tmp"):
            _add_dir(tar, top, 0o1777 if top in ("tmp", "var/tmp") else 0o755)
        for link, target in (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
            info = tarfile.TarInfo(link)
            info.type, info.linkname, info.mtime = tarfile.SYMTYPE, target, 0
            tar.addfile(info)
        _add_dir(tar, "usr/sbin")
        for file in sorted(set(files)):
            _add_file(tar, file)
        if python:
            version = f"python{sys.version_info.major}.{sys.version_info.minor}"
            info = tarfile.TarInfo("usr/bin/python3")
            info.type, info.linkname, info.mtime = tarfile.SYMTYPE, version, 0
            tar.addfile(info)
        _add_text(tar, "etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n")
        _add_text(tar, "etc/group", "root:x:0:\nnogroup:x:65534:\n")
        _add_text(tar, "etc/hosts", "127.0.0.1 localhost\n")
    os.replace(tmp, path)


def rootfs_tarballs() -> dict[str, Path]:
    """The base (python) and tiny root filesystems as tarballs in the cache, built when missing or stale."""
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(json.dumps([ROOTFS_RECIPE, sys.version, os.path.realpath("/usr/bin/python3"),
                                     os.stat("/usr/bin/python3").st_mtime_ns]).encode()).hexdigest()[:12]
    out = {"base": cache / f"rootfs-base-{key}.tar", "tiny": cache / f"rootfs-tiny-{key}.tar"}
    if not out["tiny"].exists():
        _write_rootfs(out["tiny"], _closure(list(TINY_BINARIES)), python=False)
    if not out["base"].exists():
        started = time.monotonic()
        _write_rootfs(out["base"], _closure(list(BASE_BINARIES) + _python_files()), python=True)
        log(f"base root filesystem cached: {out['base']} ({out['base'].stat().st_size // 2**20} MiB, "
            f"{time.monotonic() - started:.1f} s)")
    return out


def engine_tarball(base: Path) -> Path:
    """The base root filesystem plus the rank simulator at /opt/sglang-sim/engine (and /sgl-workspace): the
    root of the engine's base image, cached by the simulator's content (one import per host, one layer)."""
    source = REPO / "testbed" / "engine"
    files = sorted(p for p in source.rglob("*.py") if "__pycache__" not in p.parts)
    digest = hashlib.sha256(base.name.encode())
    for path in files:
        digest.update(str(path.relative_to(source)).encode() + b"\0" + path.read_bytes())
    out = base.with_name(f"rootfs-engine-{digest.hexdigest()[:12]}.tar")
    if out.exists():
        return out
    for old in base.parent.glob("rootfs-engine-*.tar"):
        old.unlink()
    tmp = out.with_suffix(".partial")
    shutil.copy(base, tmp)
    with tarfile.open(tmp, "a") as tar:
        for top in ("opt", "opt/sglang-sim", "opt/sglang-sim/engine", "sgl-workspace"):
            _add_dir(tar, top)
        for path in files:
            info = tar.gettarinfo(str(path), arcname=f"opt/sglang-sim/engine/{path.relative_to(source)}")
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
            with open(path, "rb") as fh:
                tar.addfile(info, fh)
    os.replace(tmp, out)
    return out


def stage_tarballs(state_dir: Path) -> None:
    """Hard links to the cached tarballs in the state folder, which every host sees (hostinit binds it)."""
    images = state_dir / "images"
    images.mkdir(parents=True, exist_ok=True)
    tarballs = rootfs_tarballs()
    tarballs["engine"] = engine_tarball(tarballs["base"])
    for kind, path in tarballs.items():
        target = images / f"rootfs-{kind}.tar"
        if target.exists():
            target.unlink()
        try:
            os.link(path, target)
        except OSError:
            shutil.copy(path, target)


# ---------------------------------------------------------------- daemons

def daemon_argv(host: str) -> list[str]:
    return ["/usr/sbin/dockerd", "--data-root", "/var/lib/docker", "--exec-root", "/run/docker",
            "-H", "unix:///var/run/docker.sock", "--pidfile", "/run/docker.pid",
            "--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false",
            "--userland-proxy=false", "--storage-driver=overlay2", "--cgroup-parent", cgroup_parent(host),
            "--exec-opt", "native.cgroupdriver=cgroupfs", "--log-level=warn"]


DAEMON_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
              "LANG": "C.UTF-8"}


def start_daemons(enter: dict[str, list[str]], logs: dict[str, Path], on_start=None) -> dict[str, int]:
    """Start one dockerd in every host (enter: host -> nsenter argv prefix); wait until `docker info` answers
    in each. Returns host -> dockerd pid. A daemon that does not answer names its host with its log."""
    procs = {}
    for host, prefix in enter.items():
        log_fh = open(logs[host], "w")
        procs[host] = subprocess.Popen(prefix + ["env", "-i"] + [f"{k}={v}" for k, v in DAEMON_ENV.items()]
                                       + daemon_argv(host), stdin=subprocess.DEVNULL, stdout=log_fh,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        log_fh.close()
    if on_start:
        on_start({host: proc.pid for host, proc in procs.items()})
    deadline = time.monotonic() + DAEMON_START_S
    pids = {}
    for host, proc in procs.items():
        while True:
            info = subprocess.run(enter[host] + ["/usr/bin/docker", "info", "--format", "{{.ServerVersion}}"],
                                  capture_output=True, text=True)
            if info.returncode == 0 and info.stdout.strip():
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = logs[host].read_text()[-1500:].strip() if logs[host].exists() else ""
                why = f"exited with {proc.returncode}" if proc.poll() is not None else \
                    f"did not answer `docker info` in {DAEMON_START_S:.0f} s"
                raise TestbedError(f"host {host}: dockerd {why}; its log ({logs[host]}):\n{tail}")
            time.sleep(0.2)
        # nsenter execs dockerd, so the pid of the child is the daemon's.
        pids[host] = proc.pid
    return pids


def stop_daemons(pids: dict[str, int], timeout: float = 20.0) -> None:
    """SIGTERM every dockerd by its pid (it stops its containers and its containerd), wait for them to go."""
    live = {}
    for host, pid in pids.items():
        try:
            os.kill(pid, signal.SIGTERM)
            live[host] = pid
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while live and time.monotonic() < deadline:
        for host, pid in list(live.items()):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = 0 if _alive(pid) else pid
            if done or not _alive(pid):
                live.pop(host)
        time.sleep(0.1)
    for host, pid in live.items():
        log(f"dockerd of {host} (pid {pid}) did not stop in {timeout:.0f} s: killed")
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _cgroup_tops() -> list[Path]:
    """This testbed's --cgroup-parent folders in every cgroup hierarchy (found by name: also after a crashed up)."""
    base = Path("/sys/fs/cgroup")
    tops = list(base.glob(f"sparkfleet-tb{TESTBED_ID}-spark*")) + list(base.glob(f"*/sparkfleet-tb{TESTBED_ID}-spark*"))
    return [top for top in tops if top.is_dir()]


def cgroup_pids() -> set[int]:
    """Every process in this testbed's container cgroups. A container with its own network namespace
    (`--network none`) shares no namespace with its host, and outlives its shim: only its cgroup finds it.
    Frozen (paused) containers are thawed first, or a signal would wait for their unpause."""
    pids: set[int] = set()
    for top in _cgroup_tops():
        for dirpath, _, filenames in os.walk(top):
            if "freezer.state" in filenames:
                try:
                    Path(dirpath, "freezer.state").write_text("THAWED")
                except OSError:
                    pass
            for name in ("cgroup.procs", "tasks"):
                if name in filenames:
                    try:
                        pids.update(int(p) for p in Path(dirpath, name).read_text().split())
                    except OSError:
                        pass
    return pids


def remove_cgroups() -> None:
    """The --cgroup-parent folders the daemons made in every cgroup hierarchy (deepest first)."""
    for top in _cgroup_tops():
        for dirpath, _, _ in sorted(os.walk(top), key=lambda item: -item[0].count("/")):
            try:
                os.rmdir(dirpath)
            except OSError:
                pass
