#!/usr/bin/python3
"""Start one container of the testbed's docker stand-in. Runs inside a fresh mount namespace (and a
fresh network namespace for --network none); usage: container_init.py CONTAINER_DIR.

The root is the container's own copy of the image files; the host's /usr, /etc (read-only), /dev,
/proc and /sys are bound in (the hosts share one Python and one libc, as images built FROM the same
base would); then each requested volume; then chroot and exec the entrypoint with the container env.
The hidden /.testbed folder shows the host's testbed facts (load, GPU stand-in state) to the engine
simulator: it stands in for what a real GPU would feel (contention), nothing a role reads.
"""
import json
import os
import socket
import subprocess
import sys


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)


def bind(source: str, target: str, readonly: bool = False, recursive: bool = False) -> None:
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            open(target, "w").close()
    sh("mount", "--rbind" if recursive else "--bind", source, target)
    if readonly:
        sh("mount", "-o", "remount,bind,ro", target)


def write_atomic(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as fh:
        fh.write(text)
    os.replace(path + ".tmp", path)


def main() -> None:
    cdir = sys.argv[1]
    spec = json.load(open(os.path.join(cdir, "spec.json")))
    os.setsid()
    # The docker stand-in signals this session's process group. Its start time comes first: a pid file is
    # there only with it, and it tells this process from a later one that reuses the pid.
    with open("/proc/self/stat") as fh:
        start_time = fh.read().rsplit(")", 1)[1].split()[19]
    write_atomic(os.path.join(cdir, "pidstart"), start_time)
    write_atomic(os.path.join(cdir, "pid"), str(os.getpid()))
    root = os.path.join(cdir, "rootfs")
    sh("mount", "--bind", root, root)
    for top in ("usr", "dev", "proc", "sys"):
        bind(f"/{top}", os.path.join(root, top), recursive=True)
    bind("/etc", os.path.join(root, "etc"), readonly=True)
    for name in ("bin", "sbin", "lib", "lib64"):
        path = os.path.join(root, name)
        if os.path.islink(f"/{name}") and not os.path.lexists(path):
            os.symlink(os.readlink(f"/{name}"), path)
    for top in ("tmp", "run"):
        os.makedirs(os.path.join(root, top), exist_ok=True)
        sh("mount", "-t", "tmpfs", "tmpfs", os.path.join(root, top))
    os.makedirs(os.path.join(root, "root"), exist_ok=True)
    if os.path.isdir("/run/testbed"):
        bind("/run/testbed", os.path.join(root, ".testbed"), readonly=True)
        bind("/var/lib/docker/containers", os.path.join(root, ".testbed-containers"), readonly=True)
    for mount in spec["mounts"]:
        target = os.path.join(root, mount["target"].lstrip("/"))
        bind(mount["source"], target, readonly=mount["ro"])
    if spec.get("network") == "none":
        subprocess.run(["ip", "link", "set", "lo", "up"], check=False)
    os.chroot(root)
    os.chdir(spec["workdir"] or "/")
    env = dict(item.split("=", 1) for item in spec["env"])
    env.setdefault("HOME", "/root")
    env.setdefault("HOSTNAME", socket.gethostname())
    argv = spec["argv"]
    try:
        os.execvpe(argv[0], argv, env)
    except FileNotFoundError:
        print(f"docker: Error response from daemon: failed to create task for container: exec: "
              f"\"{argv[0]}\": executable file not found in $PATH", file=sys.stderr)
        sys.exit(127)
    except PermissionError:
        print(f"docker: Error response from daemon: exec: \"{argv[0]}\": permission denied", file=sys.stderr)
        sys.exit(126)


if __name__ == "__main__":
    main()
