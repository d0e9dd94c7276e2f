"""The main job on the seed testbed: plan gate, relocation, packing, byte-exactness, idempotence."""
from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest

from tests.integration.conftest import state_dir

pytestmark = pytest.mark.testbed
HOSTS = {"spark1": (0, "/home/mia/dsv41-engram"), "spark2": (1, "/home/zurih/dsv41-3x-spark/engram"),
         "spark3": (2, "/home/zurih/dsv41-3x-spark/engram")}
RELOCATE = {"engram_relocate_stale": True, "engram_relocate_remove_source": True, "engram_restart_engine": True}


def reference_shard(checkpoint: Path, layer: int, rank: int, tp: int) -> bytes:
    """docs/reference.md section 3, written independently of the packer: header, then weight+scale per row."""
    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())["weight_map"]
    parts = {}
    for kind in ("weight", "scale"):
        name = f"layers.{layer}.engram.embed.{kind}"
        data = (checkpoint / index[name]).read_bytes()
        (hlen,) = struct.unpack("<Q", data[:8])
        meta = json.loads(data[8:8 + hlen])[name]
        begin, end = meta["data_offsets"]
        parts[kind] = (meta["shape"], data[8 + hlen + begin:8 + hlen + end])
    (n, width), weights = parts["weight"]
    (_, sw), scales = parts["scale"]
    lo, hi = n * rank // tp, n * (rank + 1) // tp
    header = struct.pack("<6Q", 0x31344E4531565344, layer, lo, hi, n, 264).ljust(4096, b"\0")
    rows = b"".join(weights[r * width:(r + 1) * width] + scales[r * sw:(r + 1) * sw] for r in range(lo, hi))
    return header + rows


def shard_files(host, path):
    out = host.run(f"ls {path}")
    return sorted(n for n in out.stdout.split() if n.startswith("engram-") and (".bin" in n or ".partial" in n))


def test_refuses_for_space_before_any_host_writes(fresh_testbed, run_playbook, host):
    run = run_playbook("pack_engram.yml")
    assert run.rc != 0
    refusal = [r for r in run.results(task="Refuse before any host writes") if r["_event"] == "runner_on_failed"]
    assert refusal, run.stdout[-3000:]
    msg = refusal[0]["msg"]
    assert "spark2" in msg and "/home/zurih/dsv41-3x-spark/engram" in msg
    assert "spark1:" not in msg and "spark3:" not in msg
    assert "needs 19016456 bytes" in msg and "has " in msg and "available" in msg
    for name, (_, dest) in HOSTS.items():
        assert shard_files(host(name), dest) == [], f"{name} was written to"
    assert host("spark2").file("/home/zurih/dsv41-engram/engram-l1-r1of2.bin").exists


def test_copy_without_removal_frees_nothing_so_still_refuses(fresh_testbed, run_playbook, host):
    run = run_playbook("pack_engram.yml", extravars={"engram_relocate_stale": True})
    assert run.rc != 0
    assert "Refuse before any host writes" in run.stdout
    assert host("spark2").file("/home/zurih/dsv41-engram/engram-l14-r1of2.bin").exists
    assert not host("spark2").file("/srv/archive/sparkfleet").exists


def test_relocates_packs_and_is_exact_and_idempotent(fresh_testbed, run_playbook, host):
    stale = "/home/zurih/dsv41-engram/engram-l1-r1of2.bin"
    stale_sha = host("spark2").file(stale).sha256sum
    run = run_playbook("pack_engram.yml", extravars=RELOCATE)
    assert run.rc == 0, run.stdout[-3000:]
    archived = host("spark2").file("/srv/archive/sparkfleet" + stale)
    assert archived.exists and archived.sha256sum == stale_sha
    assert not host("spark2").file(stale).exists
    checkpoint = state_dir() / "checkpoint"
    for name, (rank, dest) in HOSTS.items():
        h = host(name)
        assert shard_files(h, dest) == sorted([f"engram-l1-r{rank}of3.bin", f"engram-l14-r{rank}of3.bin"])
        for layer in (1, 14):
            expected = hashlib.sha256(reference_shard(checkpoint, layer, rank, 3)).hexdigest()
            assert h.file(f"{dest}/engram-l{layer}-r{rank}of3.bin").sha256sum == expected, (name, layer)
    record = run.record()
    packs = [r for r in record["results"] if r["module"] == "engram_pack" and r["status"] == "ok"]
    assert packs, "the run record keeps the pack results"
    # The restarted engine loaded packed shards: six packed=True lines (two layers x three ranks).
    packed = []
    for log in sorted(Path(run.run_dir, "boot-logs").glob("*.log")):
        packed += [line for line in log.read_text().splitlines() if "Exact nvme Engram" in line]
    assert len(packed) == 6 and all(line.endswith("packed=True") for line in packed), packed
    statuses = [r for r in run.results(module="engram_status_info") if r["_event"] == "runner_on_ok"]
    assert {r["_host"] for r in statuses if r.get("all_packed")} >= set(HOSTS)

    again = run_playbook("pack_engram.yml", extravars=RELOCATE)
    assert again.rc == 0
    assert [c for c in again.changed() if c[0] != "localhost"] == []

    check = run_playbook("pack_engram.yml", check=True, diff=True)
    assert check.rc == 0 and check.changed() == []


def test_inventory_mismatch_fails_before_touching_hosts(testbed, run_playbook):
    run = run_playbook("pack_engram.yml", extravars={"engram_tp": 4})
    assert run.rc != 0
    assert "engram_tp=4 (inventory fleet_tp_size=3)" in run.stdout
    assert not run.results(module="engram_pack")
