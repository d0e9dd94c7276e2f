#!/usr/bin/python3
"""Provision one testbed host from its scenario spec (runs inside the host, as root, once per `up`).

Makes what docs/reference.md section 1 describes for this host: the serving user and its recipe checkout,
the engram dir, stale shards, the GPU stand-in's state, systemd units (clock lock, desktop, GPU
dashboard), the engine images (imported from the testbed's root filesystems, then `docker build` of the
recipe checkout on the host's own dockerd), the workers' weights volume (bind-backed, the fleet's NFS volume's
name and mount point), background containers and the autotune caches of an earlier boot.
Usage: provision.py HOST_SPEC_JSON
"""
from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import struct
import subprocess
import sys
import time

TESTBED = "/usr/lib/sparkfleet-testbed"
UNIT_DIR = "/etc/systemd/system"
MAGIC = 0x31344E4531565344


sys.path.insert(0, TESTBED)
from engine import autotune as sim_autotune  # noqa: E402


def sh(*argv: str) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"`{' '.join(argv)}` failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()[-600:]}")
    return proc.stdout


def write(path: str, text: str, mode: int = 0o644, owner: str | None = None) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)
    os.chmod(path, mode)
    if owner:
        chown(path, owner)


def chown(path: str, user: str) -> None:
    pw = pwd.getpwnam(user)
    os.chown(path, pw.pw_uid, pw.pw_gid)


def makedirs(path: str, user: str) -> None:
    """Create path and every missing parent below /home/<user>, owned by the user."""
    parts = path.strip("/").split("/")
    current = ""
    for part in parts:
        current += "/" + part
        if not os.path.isdir(current):
            os.mkdir(current)
            if current.startswith(f"/home/{user}"):
                chown(current, user)


def users(spec: dict) -> None:
    user = spec["user"]
    try:
        pwd.getpwnam(user)
    except KeyError:
        sh("useradd", "--create-home", "--home-dir", f"/home/{user}", "--shell", "/bin/bash", user)
    makedirs(f"/home/{user}/.cache", user)


def stale_shards(spec: dict) -> None:
    """Old TP2 shards: valid headers and the exact size; row bytes are a fixed pattern."""
    for shard in spec["stale_shards"]:
        n, rank, tp = shard["n"], shard["rank"], shard["tp"]
        lo, hi = n * rank // tp, n * (rank + 1) // tp
        makedirs(os.path.dirname(shard["path"]), spec["user"])
        header = struct.pack("<6Q", MAGIC, shard["layer"], lo, hi, n, 264).ljust(4096, b"\0")
        row_block = hashlib.sha256(shard["path"].encode()).digest() * (264 * 256 // 32)
        with open(shard["path"], "wb") as fh:
            fh.write(header)
            rows = hi - lo
            while rows > 0:
                take = min(rows, 256)
                fh.write(row_block[: take * 264])
                rows -= take
        chown(shard["path"], spec["user"])


def recipe_checkout(spec: dict) -> str:
    """The operator's recipe checkout on this node, with the engine image's build context."""
    user = spec["user"]
    base = f"/home/{user}/dsv41-3x-spark"
    makedirs(base, user)
    shutil.copytree(f"{TESTBED}/image", base, dirs_exist_ok=True)
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            chown(os.path.join(dirpath, name), user)
    makedirs(spec["engram_dir"], user)
    makedirs(f"{base}/state", user)
    return base


# ---------------------------------------------------------------- images, volume and containers on the host's dockerd

ENGINE_ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH=/opt/sglang-sim",
              "SGLANG_VERSION=0.5.4.post2+dsv41", "NCCL_VERSION=2.27.7-1"]
ENGINE_LABELS = {"org.opencontainers.image.title": "sglang", "engine.version": "0.5.4.post2+dsv41",
                 "flashinfer.version": "0.5.2"}
IMAGES = "/usr/lib/sparkfleet-testbed-state/images"
SLEEPER = "trap 'exit 0' TERM; sleep infinity & wait"


def images(spec: dict, checkout: str) -> None:
    """The engine's base image imported from a local root filesystem (the rank simulator inside, one layer), then the recipe's image built from the operator's checkout with
    `docker build` exactly as the recipe builds it; a tiny image for the sleepers."""
    changes = [f"ENV {item}" for item in ENGINE_ENV]
    changes += ["LABEL " + " ".join(f"{k}={json.dumps(v)}" for k, v in ENGINE_LABELS.items()),
                "WORKDIR /sgl-workspace", 'CMD ["python3", "-m", "engine.sim", "--help"]']
    step("import engine base", sh, "docker", "import", *[arg for change in changes for arg in ("--change", change)],
         f"{IMAGES}/rootfs-engine.tar", "lmsysorg/sglang:dev-dsv41")
    # PID 1 of a container gets no SIGTERM it has no handler for: a bare `sleep` made every `docker stop` (and each
    # daemon's shutdown at `down`) wait out its timeout. The shell's trap ends it at once, as a service would.
    step("import sleeper", sh, "docker", "import", "--change", f"CMD {json.dumps(['sh', '-c', SLEEPER])}",
         f"{IMAGES}/rootfs-tiny.tar",
         "sparkfleet/sleeper:latest")
    step("build dsv41-3x-spark:local", sh, "docker", "build", "-q", "-t", "dsv41-3x-spark:local", checkout)


def weights_volume(spec: dict) -> None:
    """The workers' dsv41-weights: an NFS volume on the fleet; here a bind-backed local volume of the same
    name onto the head's export as this host sees it (hostinit binds it)."""
    if spec["rank"] == 0:
        return
    options = spec.get("weights_volume_options") or {
        "type": "none", "o": "bind", "device": f"/run/testbed/nfs/{spec['head_address']}/srv/models/DeepSeek-V4.1-Flash"}
    argv = ["docker", "volume", "create", "--driver", "local"]
    for key, value in options.items():
        argv += ["--opt", f"{key}={value}"]
    sh(*argv, "dsv41-weights")


def background_containers(spec: dict) -> None:
    """spark3's non-serving containers, started in parallel (19 serial `docker run`s take long)."""
    procs = []
    for name, image_ref in spec["background_containers"]:
        sh("docker", "tag", "sparkfleet/sleeper:latest", image_ref)
        procs.append((name, subprocess.Popen(
            ["docker", "run", "-d", "--name", name, "--restart", "unless-stopped", "--network", "none",
             "--label", f"owner={spec['user']}", "--label", "com.docker.compose.project=homelab", image_ref],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    failed = []
    for name, proc in procs:
        out, err = proc.communicate()
        if proc.returncode != 0:
            failed.append(f"{name}: {err.strip()}")
    if failed:
        raise SystemExit("docker run failed: " + "; ".join(failed))


def units(spec: dict) -> None:
    wants = f"{UNIT_DIR}/multi-user.target.wants"
    os.makedirs(wants, exist_ok=True)
    if spec["clock_lock_unit"]:
        write(f"{UNIT_DIR}/nvidia-clock-lock.service", "\n".join([
            "[Unit]", "Description=Lock NVIDIA GPU clocks", "After=nvidia-persistenced.service", "",
            "[Service]", "Type=oneshot", "RemainAfterExit=yes", "ExecStart=/usr/bin/nvidia-smi -lgc 0,2200", "",
            "[Install]", "WantedBy=multi-user.target", ""]))
        os.symlink(f"{UNIT_DIR}/nvidia-clock-lock.service", f"{wants}/nvidia-clock-lock.service")
    if spec["desktop"]:
        write(f"{UNIT_DIR}/gdm.service", "\n".join([
            "[Unit]", "Description=GNOME Display Manager (testbed stand-in)", "", "[Service]", "Type=simple",
            f"ExecStart={TESTBED}/standins/fake_gdm.py", "", "[Install]", "Alias=display-manager.service", ""]))
        os.symlink(f"{UNIT_DIR}/gdm.service", f"{UNIT_DIR}/display-manager.service")
    if spec["gpu_dashboard_poll_ms"]:
        write("/etc/default/gpu-dashboard", f"# GPU dashboard polling interval\nPOLL_MS={spec['gpu_dashboard_poll_ms']}\n")
        write(f"{UNIT_DIR}/gpu-dashboard.service", "\n".join([
            "[Unit]", "Description=GPU dashboard (polls nvidia-smi)", "", "[Service]", "Type=simple",
            "EnvironmentFile=-/etc/default/gpu-dashboard", f"ExecStart={TESTBED}/standins/gpu_dashboard.py", "",
            "[Install]", "WantedBy=multi-user.target", ""]))
        os.symlink(f"{UNIT_DIR}/gpu-dashboard.service", f"{wants}/gpu-dashboard.service")
    if spec.get("oom_daemon"):
        # A user-space OOM killer (knob oom_daemon): its process is named earlyoom, like the real one.
        if not os.path.lexists("/usr/local/bin/earlyoom"):
            os.symlink("/bin/sleep", "/usr/local/bin/earlyoom")
        write(f"{UNIT_DIR}/earlyoom.service", "\n".join([
            "[Unit]", "Description=Early OOM Daemon (testbed stand-in)", "", "[Service]", "Type=simple",
            "ExecStart=/usr/local/bin/earlyoom infinity", "", "[Install]", "WantedBy=multi-user.target", ""]))
        os.symlink(f"{UNIT_DIR}/earlyoom.service", f"{wants}/earlyoom.service")
    target = "graphical.target" if spec["desktop"] else "multi-user.target"
    link = f"{UNIT_DIR}/default.target"
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(f"/lib/systemd/system/{target}", link)
    # What the boot would have started.
    if spec["clock_lock_unit"] and not spec.get("clocks_lost"):   # knob clocks_lost: a power cycle lost it
        sh("systemctl", "start", "nvidia-clock-lock.service")
    if spec["desktop"]:
        sh("systemctl", "start", "gdm.service")
    if spec["gpu_dashboard_poll_ms"]:
        sh("systemctl", "start", "gpu-dashboard.service")
    if spec.get("oom_daemon"):
        sh("systemctl", "start", "earlyoom.service")


def node_packages(spec: dict) -> None:
    """dpkg records of the kernel, driver and firmware packages this node runs (roles/package_holds holds them)."""
    if not spec.get("kernel_release"):
        return
    arch = sh("dpkg", "--print-architecture").strip()
    kernel, driver = spec["kernel_release"], spec["driver"]
    flavour = "-open" if spec.get("driver_flavour", "open") == "open" else ""
    major = driver.split(".")[0]
    base, abi = (kernel.split("-") + ["0"])[:2]
    kversion = f"{base}-{abi}.{int(abi) % 100 if abi.isdigit() else 1}"     # 7.0.0-1019-nvidia -> 7.0.0-1019.19
    packages = [
        (f"linux-image-{kernel}", kversion, "kernel", "Signed kernel image nvidia"),
        (f"linux-modules-{kernel}", kversion, "kernel", "Linux kernel extra modules"),
        (f"nvidia-driver-{major}{flavour}", f"{driver}-0ubuntu1", "restricted/misc", "NVIDIA driver metapackage"),
        (f"nvidia-kernel-common-{major}", f"{driver}-0ubuntu1", "restricted/misc", "Shared files used with the kernel module"),
        ("linux-firmware", "20250901.git6b0c4f8a-0ubuntu1", "misc", "Firmware for Linux kernel drivers"),
    ]
    with open("/var/lib/dpkg/status", "a") as fh:
        for name, version, section, what in packages:
            fh.write(f"\nPackage: {name}\nStatus: install ok installed\nPriority: optional\nSection: {section}\n"
                     f"Installed-Size: 1024\nMaintainer: Ubuntu Kernel Team <kernel-team@lists.ubuntu.com>\n"
                     f"Architecture: {arch}\nVersion: {version}\nDescription: {what} (testbed stand-in)\n")


def autotune_caches(spec: dict) -> None:
    """Caches of an earlier boot whose per-rank digests disagree (each rank tuned in another boot)."""
    if not spec["autotune_seed"]:
        return
    home = f"/home/{spec['user']}"
    for kind in ("target", "draft"):
        path = sim_autotune.cache_path(home + "/.cache", spec["rank"], spec["tp"], kind)
        makedirs(os.path.dirname(path), spec["user"])
        write(path, json.dumps(sim_autotune.tactics(kind, spec["autotune_seed"]), indent=1), owner=spec["user"])


STARTED = time.monotonic()


def step(name: str, func, *args):
    """Run one provisioning step; its time goes to provision.log (the profile of `up`)."""
    began = time.monotonic()
    result = func(*args)
    print(f"{spec_name}: {name} {time.monotonic() - began:.2f} s (at {time.monotonic() - STARTED:.2f} s)", flush=True)
    return result


spec_name = "?"


def main() -> None:
    global spec_name
    spec = json.loads(sys.argv[1])
    spec_name = spec["name"]
    with open("/run/testbed/gpu.json", "w") as fh:
        json.dump({"driver_version": spec["driver"]} if spec.get("driver") else {}, fh)
    step("users", users, spec)
    checkout = step("recipe checkout", recipe_checkout, spec)
    step("stale shards", stale_shards, spec)
    step("units", units, spec)
    step("images", images, spec, checkout)
    step("weights volume", weights_volume, spec)
    step("background containers", background_containers, spec)
    step("autotune caches", autotune_caches, spec)
    step("node packages", node_packages, spec)
    print(f"{spec['name']}: provisioned")


if __name__ == "__main__":
    main()
