"""Scenarios: what each testbed host looks like after `up`.

`clean`: every host quiet and empty (engram dirs empty, no stale shards, no desktop, no extra containers).
`seed`: docs/reference.md section 1 -- empty engram dirs; spark2 holds stale TP2 shards outside its engram dir and
its /home volume is too small for its TP3 shards until they are relocated; spark3 runs a desktop (gdm,
graphical.target) and 19 unrelated containers; a dashboard polls nvidia-smi every 2 s on the head;
every host has the clock-lock unit enabled; autotune caches that disagree across ranks.

Every scenario gives each host what the preflight (library/node_preflight_info) reads, with good values: kernel
7.0.0-1019-nvidia booted with kho=off, the open 580.159.03 driver, an unfragmented buddy allocator, clean
kernel logs of this boot and the previous one, eth0 at MTU 9000 holding the host's address, the RoCE v2 GID
of that address at index 3 of rocep1s0f0, no swap, a 64 GiB /dev/shm. Knobs (`testbed/fleet up --knob
HOST:KNOB`, see KNOBS) break one thing on one host, each the way docs/reference.md section 11 describes.
"""
from __future__ import annotations

from .common import host_addr, host_name

# The synthetic checkpoint (testbed/checkpoint.py): two Engram layers with different row counts,
# deliberately not divisible by 3, 4 or 8.
CHECKPOINT_ROWS = {1: 120_003, 14: 96_001}
ROW_BYTES = 264
HEADER_BYTES = 4096
# The testbed scales the 1 GiB default packing margin down with the checkpoint (inventory/testbed).
TESTBED_MARGIN_BYTES = 8 * 1024 * 1024
MIB = 1024 * 1024
GIB = 1024 * MIB

# GB10 unified memory as /proc/meminfo shows it (kB); MemAvailable before the engine starts.
MEMTOTAL_KB = 127_587_400
QUIET_AVAILABLE_KB = 124_900_000
BUSY_AVAILABLE_KB = 122_700_000   # desktop and 19 containers take ~2.1 GiB

BACKGROUND_CONTAINERS = [
    ("jupyter-lab", "jupyter/base-notebook:latest"), ("grafana", "grafana/grafana:11.2.0"),
    ("prometheus", "prom/prometheus:v2.54.1"), ("node-exporter", "prom/node-exporter:v1.8.2"),
    ("portainer", "portainer/portainer-ce:2.21.0"), ("open-webui", "ghcr.io/open-webui/open-webui:main"),
    ("comfyui", "comfyui/comfyui:latest"), ("ollama", "ollama/ollama:0.3.12"),
    ("code-server", "codercom/code-server:4.92.2"), ("redis", "redis:7.4"),
    ("postgres", "postgres:16"), ("minio", "minio/minio:latest"), ("nginx-proxy", "nginx:1.27"),
    ("watchtower", "containrrr/watchtower:1.7.1"), ("uptime-kuma", "louislam/uptime-kuma:1"),
    ("filebrowser", "filebrowser/filebrowser:v2"), ("syncthing", "syncthing/syncthing:1.27"),
    ("netdata", "netdata/netdata:stable"), ("tensorboard", "tensorflow/tensorflow:2.17.0"),
]


def row_range(n: int, rank: int, tp: int) -> tuple[int, int]:
    return n * rank // tp, n * (rank + 1) // tp


def shard_bytes(n: int, rank: int, tp: int) -> int:
    lo, hi = row_range(n, rank, tp)
    return HEADER_BYTES + (hi - lo) * ROW_BYTES


def rank_bytes(rank: int, tp: int) -> int:
    return sum(shard_bytes(n, rank, tp) for n in CHECKPOINT_ROWS.values())


# Knob name -> (what it does, which hosts may take it: "any" or "worker").
KNOBS = {
    "no_kho": ("boots kernel 7.0.0-1019-nvidia without kho=off: CmaFree above CmaTotal (Kexec HandOver)", "any"),
    "fragmented": ("no free blocks of 2 MiB or more left in /proc/buddyinfo (hours of serving)", "any"),
    "wedge": ("this boot's kernel log shows NVRM NV_ERR_NO_MEMORY (0x51) and Xid 79: the node is wedged", "any"),
    "wedge_previous": ("the previous boot's kernel log shows the wedge; this boot is clean", "any"),
    "mtu1500": ("eth0 back at MTU 1500 (a firmware reboot reset it)", "any"),
    "gid_moved": ("an extra IPv6 GID pair moves the RoCE v2 GID of the host's address from index 3 to 5", "any"),
    "kernel_unlisted": ("boots kernel 7.0.0-1023-nvidia (not in the allow-list; kho=off is on its command line)",
                        "any"),
    "driver_proprietary": ("the loaded NVIDIA kernel module is the proprietary flavour of 580.159.03", "any"),
    "swap_on": ("an 8 GiB swap file is active", "any"),
    "oom_daemon": ("earlyoom runs", "any"),
    "small_shm": ("/dev/shm is 8 GiB", "any"),
    "clocks_lost": ("the clock-lock unit is enabled but the lock is gone (power cycle)", "any"),
    "corrupt_checkpoint": ("this host's view of the checkpoint has one flipped byte in model-00004-of-00048"
                           ".safetensors (a private copy; other hosts keep the good one)", "any"),
    "export_unreadable": ("the head's NFS export is not readable from this worker: its dsv41-weights volume "
                          "fails to mount (dockerd: its bind source is missing)", "worker"),
}
KERNEL = "7.0.0-1019-nvidia"
DRIVER = "580.159.03"
CORRUPT_FILE = "model-00004-of-00048.safetensors"


def parse_knobs(values: list[str], count: int) -> list[list[str]]:
    """`HOST:KNOB` strings to sorted [host, knob] pairs; unknown hosts or knobs are an error."""
    hosts = {host_name(i): i for i in range(1, count + 1)}
    pairs = set()
    for value in values:
        host, sep, knob = value.partition(":")
        if not sep or host not in hosts or knob not in KNOBS:
            problem = (f"unknown host {host!r} (hosts: {', '.join(hosts)})" if sep and host not in hosts
                       else f"unknown knob {knob!r}" if sep else "expected HOST:KNOB")
            raise ValueError(f"--knob {value!r}: {problem}; known knobs: {', '.join(KNOBS)} "
                             "(`testbed/fleet knobs` says what each does)")
        if KNOBS[knob][1] == "worker" and hosts[host] == 1:
            raise ValueError(f"--knob {value!r}: {knob} applies to a worker (spark2..), not the head")
        pairs.add((host, knob))
    return [list(p) for p in sorted(pairs)]


def _preflight_defaults(spec: dict) -> None:
    """What the preflight reads on a healthy node (hostinit.py writes and binds it)."""
    spec.update({
        "kernel_release": KERNEL,
        "cmdline": f"BOOT_IMAGE=/boot/vmlinuz-{KERNEL} root=UUID=5b1c7f3e-2d4a-4e8b-9c61-0f3a7d2e9b14 ro quiet "
                   "splash kho=off vt.handoff=7",
        "cma_kb": [65536, 61440],            # CmaTotal, CmaFree
        "buddy": "healthy",
        "driver": DRIVER, "driver_flavour": "open",
        "kmsg_current": "clean", "kmsg_previous": "clean",
        "mtu": 9000,
        "gid_extra_pairs": 0,
        "hca_fw": "28.45.1200", "bios_version": "5.36_0ACUM018",
        "swap_kb": 0, "shm_size": "64g", "oom_daemon": False, "clocks_lost": False,
        "checkpoint_corrupt": None, "export_unreadable": False,
    })


def apply_knob(spec: dict, knob: str) -> None:
    if knob == "no_kho":
        spec["cmdline"] = spec["cmdline"].replace(" kho=off", "")
        spec["cma_kb"] = [65536, 9_503_744]
    elif knob == "fragmented":
        spec["buddy"] = "fragmented"
    elif knob == "wedge":
        spec["kmsg_current"] = "wedge"
    elif knob == "wedge_previous":
        spec["kmsg_previous"] = "wedge"
    elif knob == "mtu1500":
        spec["mtu"] = 1500
    elif knob == "gid_moved":
        spec["gid_extra_pairs"] = 1
    elif knob == "kernel_unlisted":
        spec["kernel_release"] = "7.0.0-1023-nvidia"
        spec["cmdline"] = spec["cmdline"].replace(KERNEL, "7.0.0-1023-nvidia")
    elif knob == "driver_proprietary":
        spec["driver_flavour"] = "proprietary"
    elif knob == "swap_on":
        spec["swap_kb"] = 8 * 1024 * 1024
    elif knob == "oom_daemon":
        spec["oom_daemon"] = True
    elif knob == "small_shm":
        spec["shm_size"] = "8g"
    elif knob == "clocks_lost":
        spec["clocks_lost"] = True
    elif knob == "corrupt_checkpoint":
        spec["checkpoint_corrupt"] = {"file": CORRUPT_FILE}
    elif knob == "export_unreadable":
        spec["export_unreadable"] = True
    else:  # parse_knobs keeps this unreachable
        raise ValueError(f"unknown knob {knob}")


def host_specs(count: int, scenario: str, knobs: list | None = None) -> list[dict]:
    seed = scenario == "seed"
    tp = count
    head = host_addr(1)
    specs = []
    for index in range(1, count + 1):
        name, rank = host_name(index), index - 1
        user = "mia" if rank == 0 else "zurih"
        engram_dir = "/home/mia/dsv41-engram" if rank == 0 else "/home/zurih/dsv41-3x-spark/engram"
        spec = {
            "name": name, "rank": rank, "tp": tp, "address": host_addr(index), "head_address": head,
            "user": user, "engram_dir": engram_dir, "home_size": 256 * MIB, "archive_size": 256 * MIB,
            "stale_shards": [], "desktop": False, "background_containers": [],
            "clock_lock_unit": seed, "gpu_dashboard_poll_ms": 0,
            "mem_available_kb": QUIET_AVAILABLE_KB, "autotune_seed": "",
        }
        if seed and index == 2:
            stale = [{"path": f"/home/zurih/dsv41-engram/engram-l{layer}-r1of2.bin", "layer": layer,
                      "rank": 1, "tp": 2, "n": n} for layer, n in CHECKPOINT_ROWS.items()]
            stale_bytes = sum(shard_bytes(s["n"], 1, 2) for s in stale)
            needed = rank_bytes(rank, tp) + TESTBED_MARGIN_BYTES
            # Too small to pack now; enough once the stale shards are moved to the archive volume.
            spec["home_size"] = ((needed + stale_bytes // 2) // MIB + 1) * MIB
            spec["stale_shards"] = stale
        if seed and index == 3:
            spec["desktop"] = True
            spec["background_containers"] = BACKGROUND_CONTAINERS
            spec["mem_available_kb"] = BUSY_AVAILABLE_KB
        if seed and index == 1:
            spec["gpu_dashboard_poll_ms"] = 2000
        if seed:
            # Each rank's cache was tuned in a different boot: the digests disagree at the next boot.
            spec["autotune_seed"] = f"boot-{index}"
        _preflight_defaults(spec)
        spec["knobs"] = sorted(k for h, k in (knobs or []) if h == name)
        for knob in spec["knobs"]:
            apply_knob(spec, knob)
        specs.append(spec)
    return specs


SCENARIOS = {"clean", "seed"}
