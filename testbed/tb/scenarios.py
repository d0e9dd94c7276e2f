"""Scenarios: what each testbed host looks like after `up`.

`clean`: every host quiet and empty (engram dirs empty, no stale shards, no desktop, no extra containers).
`seed`: FLEET.md section 1 -- empty engram dirs; spark2 holds stale TP2 shards outside its engram dir and
its /home volume is too small for its TP3 shards until they are relocated; spark3 runs a desktop (gdm,
graphical.target) and 19 unrelated containers; a dashboard polls nvidia-smi every 2 s on the head;
every host has the clock-lock unit enabled; autotune caches that disagree across ranks.
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


def host_specs(count: int, scenario: str) -> list[dict]:
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
        specs.append(spec)
    return specs


SCENARIOS = {"clean", "seed"}
