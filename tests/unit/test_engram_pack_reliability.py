"""Reliability of the packer as a process: SIGKILL at random moments, ENOSPC in the middle of a shard,
a volume that is already full. The packer runs as its stand-alone CLI (as in the engine container)."""
from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tests.unit.test_engram_pack import _standalone, reference_shard, sha, tbc

TRIALS = 24
ROWS = {1: 60_001, 14: 40_003}


def cli(tmp_path, ckpt, dest, *extra):
    return [sys.executable, "-I", _standalone(tmp_path), "--checkpoint", ckpt, "--dest", str(dest), "--rank", "1",
            "--tp", "3", "--margin-bytes", "0", "--json"] + list(extra)


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def rel_ckpt(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("relckpt"))
    tbc.make_checkpoint(path, rows=ROWS, shards=8, seed=3)
    return path


def check_bins(dest, expected):
    """Every .bin present is complete and byte-identical to the reference; returns the names present."""
    present = []
    for name, digest in expected.items():
        path = os.path.join(str(dest), name)
        if os.path.exists(path):
            assert sha(path) == digest, "%s exists but is not the complete, valid shard" % name
            present.append(name)
    return present


@pytest.mark.slow
@pytest.mark.parametrize("trials", [TRIALS, pytest.param(60, marks=pytest.mark.slow)])
def test_sigkill_at_random_moments_never_leaves_a_bad_bin(rel_ckpt, tmp_path, trials):
    expected = {"engram-l%d-r1of3.bin" % layer: hashlib.sha256(reference_shard(rel_ckpt, layer, 1, 3)).hexdigest()
                for layer in ROWS}
    dest = tmp_path / "engram"
    dest.mkdir()
    # Small chunks: many chunk boundaries, syncs and progress writes to land a kill in. Two trials in
    # three skip the sampled verification so that more kills land while rows are being written; the
    # others also cover verification, rename and directory fsync.
    modes = {"none": ("--chunk-rows", "128", "--verify", "none"), "sample": ("--chunk-rows", "128")}

    def wait_for_partial(proc, limit):
        started = time.monotonic()
        while proc.poll() is None and time.monotonic() - started < limit and not any(
                n.endswith(".partial") for n in os.listdir(str(dest))):
            time.sleep(0.001)
        return time.monotonic() - started

    # Uninterrupted runs give the reference bytes and the timing: whole run, and from the first partial on.
    full, writing = {}, {}
    for mode, extra in modes.items():
        started = time.monotonic()
        proc = subprocess.Popen(cli(tmp_path, rel_ckpt, dest, *extra), stdout=subprocess.DEVNULL)
        first_partial = wait_for_partial(proc, 30)
        assert proc.wait() == 0
        full[mode] = time.monotonic() - started
        writing[mode] = max(full[mode] - first_partial, 0.01)
        assert check_bins(dest, expected) == sorted(expected)
        for name in os.listdir(str(dest)):
            os.unlink(os.path.join(str(dest), name))
    rng = random.Random(20261129)
    outcomes = {"resumed": 0, "finished_partial": 0, "restarted": 0, "bins_after_kill": 0, "double_kill": 0}

    def kill_at_random(mode, trial):
        proc = subprocess.Popen(cli(tmp_path, rel_ckpt, dest, *modes[mode]), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        if trial % 4:
            # most kills land while shards are being written: interpreter start and planning take a good
            # share of a small pack, so wait for the first partial, then kill at a random point after it
            wait_for_partial(proc, full[mode] * 3)
            time.sleep(rng.uniform(0.0, writing[mode]))
        else:
            time.sleep(rng.uniform(0.0, full[mode]))
        proc.send_signal(signal.SIGKILL)
        proc.communicate()

    for trial in range(trials):
        for name in os.listdir(str(dest)):
            os.unlink(os.path.join(str(dest), name))
        mode = "sample" if trial % 3 == 0 else "none"
        kills = 2 if trial % 4 == 3 else 1
        for _ in range(kills):
            kill_at_random(mode, trial)
            outcomes["bins_after_kill"] += len(check_bins(dest, expected))
        outcomes["double_kill"] += kills == 2
        done = subprocess.run(cli(tmp_path, rel_ckpt, dest, *modes[mode]), capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        result = last_json(done.stdout)
        outcomes["resumed"] += any(s["action"] == "resume" and s["resume_rows"] > 0 for s in result["shards"])
        outcomes["finished_partial"] += any(s["action"] == "finish" for s in result["shards"])
        outcomes["restarted"] += any(s["action"] == "write" for s in result["shards"])
        assert check_bins(dest, expected) == sorted(expected)
        assert not [n for n in os.listdir(str(dest)) if n.endswith(".partial")]
    print("SIGKILL trials: %d, uninterrupted pack %s s (writing %s s), outcomes %s" % (trials, full, writing, outcomes))
    assert outcomes["resumed"] >= 3  # kills did land mid-shard, and the reruns resumed them


def _mount_tmpfs(path, size):
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    os.makedirs(path, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%s" % size, "tmpfs", path], capture_output=True)
    if proc.returncode != 0:
        pytest.skip("cannot mount a tmpfs here: %s" % proc.stderr.decode().strip())


def _umount(path):
    subprocess.run(["umount", path], capture_output=True)


# Runs the CLI in a child Python whose writes fill the volume after a few chunks, as another writer
# on the same volume would: the free-space check passes, then ENOSPC arrives in the middle of the shard.
_FILL_AFTER = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
import engram_packer as ep
import engram_packer_write as epw
real, calls = epw.write_chunk, [0]
def write_then_fill(fd, buf, rows, offset):
    calls[0] += 1
    if calls[0] == 5:
        fill = os.open(os.path.join(sys.argv[2], "other-writer.fill"), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            while True:
                os.write(fill, b"\xAB" * 65536)
        except OSError:
            pass
        os.close(fill)
    return real(fd, buf, rows, offset)
epw.write_chunk = write_then_fill
sys.exit(ep.main(sys.argv[3:]))
"""


@pytest.mark.slow
def test_enospc_in_the_middle_fails_clearly_and_resumes(rel_ckpt, tmp_path):
    mount = tempfile.mkdtemp(prefix="sparkfleet-enospc-", dir="/tmp")
    _mount_tmpfs(mount, "24m")
    try:
        ckpt_before = {n: sha(os.path.join(rel_ckpt, n)) for n in os.listdir(rel_ckpt)}
        packer_dir = os.path.dirname(_standalone(tmp_path))
        argv = ["--checkpoint", rel_ckpt, "--dest", mount, "--rank", "1", "--tp", "3", "--layers", "1",
                "--margin-bytes", "0", "--chunk-rows", "1024", "--host-label", "spark2", "--json"]
        proc = subprocess.run([sys.executable, "-I", "-c", _FILL_AFTER, packer_dir, mount] + argv,
                              capture_output=True, text=True)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        result = last_json(proc.stdout)
        msg = result["msg"]
        assert result["failed"] is True
        assert "No space left on spark2 while writing %s/engram-l1-r1of3.partial" % mount in msg
        assert "the partial is kept and the pack resumes from it" in msg
        assert result["required_bytes"] == 4096 + 20000 * 264 and isinstance(result["available_bytes"], int)
        assert result["shards"][0]["state_after"] == "partial"
        names = sorted(os.listdir(mount))
        assert "engram-l1-r1of3.partial" in names and "engram-l1-r1of3.bin" not in names
        assert {n: sha(os.path.join(rel_ckpt, n)) for n in os.listdir(rel_ckpt)} == ckpt_before
        with open(os.path.join(mount, "engram-l1-r1of3.progress.json")) as handle:
            assert json.load(handle)["rows_total"] == 20000  # whole JSON, even with the volume full
        # the other writer frees its space: the rerun resumes the partial and finishes byte-identical
        os.unlink(os.path.join(mount, "other-writer.fill"))
        proc = subprocess.run(cli(tmp_path, rel_ckpt, mount, "--layers", "1", "--chunk-rows", "1024"),
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout
        shard = last_json(proc.stdout)["shards"][0]
        # resumes from the chunks its source record lists: once the volume is full the record cannot be
        # rewritten either, so what it keeps is the chunks recorded before (at least the first)
        assert shard["action"] == "resume" and shard["resume_rows"] >= 1024
        with open(os.path.join(mount, "engram-l1-r1of3.bin"), "rb") as handle:
            assert handle.read() == reference_shard(rel_ckpt, 1, 1, 3)
    finally:
        _umount(mount)
        os.rmdir(mount)


def test_full_volume_is_refused_before_writing(rel_ckpt, tmp_path):
    mount = tempfile.mkdtemp(prefix="sparkfleet-full-", dir="/tmp")
    _mount_tmpfs(mount, "2m")
    try:
        (open(os.path.join(mount, "operator.txt"), "w")).write("keep me")
        proc = subprocess.run(cli(tmp_path, rel_ckpt, mount, "--host-label", "spark2"), capture_output=True, text=True)
        assert proc.returncode == 1
        result = last_json(proc.stdout)
        assert "Not enough free space on spark2" in result["msg"] and mount in result["msg"]
        assert result["required_bytes"] == (4096 + 20000 * 264) + (4096 + 13334 * 264)
        assert 0 < result["available_bytes"] <= 2 << 20
        assert str(result["required_bytes"]) in result["msg"] and str(result["available_bytes"]) in result["msg"]
        assert sorted(os.listdir(mount)) == ["operator.txt"]
    finally:
        _umount(mount)
        os.rmdir(mount)


def test_progress_file_is_always_whole_json_while_packing(rel_ckpt, tmp_path):
    """A play polls the progress file: every read sees a whole JSON document with rows moving forward."""
    dest = tmp_path / "engram"
    dest.mkdir()
    proc = subprocess.Popen(cli(tmp_path, rel_ckpt, dest, "--layers", "1", "--chunk-rows", "256"),
                            stdout=subprocess.PIPE)
    path = dest / "engram-l1-r1of3.progress.json"
    seen = []
    while proc.poll() is None:
        if path.exists():
            doc = json.loads(path.read_text())
            seen.append((doc["state"], doc["rows_done"]))
        time.sleep(0.002)
    proc.communicate()
    doc = json.loads(path.read_text())
    assert doc["state"] == "done" and doc["rows_done"] == doc["rows_total"] == 20000
    rows = [r for _, r in seen]
    assert rows == sorted(rows)
