"""engram_relocate as a process under SIGKILL (issue 19, "Tests and figures"): the module runs as Ansible
runs it (its own Python process, arguments from a file), its whole process group is killed with SIGKILL at
a random moment, and then: nothing is lost (every source's bytes are at the source or in a complete archive
copy under its final name), nothing under a final name is wrong, and a rerun finishes with an archive
byte-identical (files and `.sha256` records) to an uninterrupted run's."""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")

# Small shards, several per run: each is copied, fsynced, renamed, hashed again, recorded and removed,
# so a run has many steps for a kill to land between, and a trial stays well under a second.
SIZES = [1_500_001, 700_000, 1_200_013, 300_007, 900_000, 1_100_000, 200_003, 650_000, 1_000_001, 400_000]
MTIME_NS = 1_764_000_000_123_456_789
BOOT = """import runpy, sys
import ansible.module_utils
ansible.module_utils.__path__.append(sys.argv[1])
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.fixture
def bed(tmp_path):
    archive = tmp_path / "archive"
    archive.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(archive)], check=True)
    src = tmp_path / "old"
    src.mkdir()
    (tmp_path / "boot.py").write_text(BOOT)
    yield tmp_path, src, archive
    subprocess.run(["umount", str(archive)], check=True)


def shard_bytes(n: int, size: int) -> bytes:
    return (hashlib.sha256(b"shard %d" % n).digest() * (size // 32 + 1))[:size]


def expected_shards():
    return {f"engram-l{n + 1}-r1of2.bin": shard_bytes(n, size) for n, size in enumerate(SIZES)}


def reset(src, archive, shards):
    for child in archive.iterdir():
        shutil.rmtree(child)
    for name in os.listdir(src):
        os.unlink(src / name)
    for name, data in shards.items():
        (src / name).write_bytes(data)
        os.utime(src / name, ns=(MTIME_NS, MTIME_NS))


def command(tmp_path, src, archive, remove_source):
    args = tmp_path / f"args-{remove_source}.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {
        "stale_paths": [str(src)], "archive_dir": str(archive / "sparkfleet"), "remove_source": remove_source,
        "margin_bytes": 0}}))
    return [sys.executable, str(tmp_path / "boot.py"), str(ROOT / "module_utils"),
            str(ROOT / "library" / "engram_relocate.py"), str(args)]


def tree(archive):
    """Every file under the archive: relative path -> sha256."""
    out = {}
    for dirpath, _, names in os.walk(archive):
        for name in names:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, archive)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return out


def check_nothing_lost(src, archive, shards):
    """Each shard whole at its source or under its archive name; nothing wrong under a final name.
    Returns what the kill left: sources removed, partial copies present."""
    copy_dir = archive / "sparkfleet" / str(src).lstrip("/")
    removed = 0
    for name, data in shards.items():
        digest = hashlib.sha256(data).hexdigest()
        source, copy = src / name, copy_dir / name
        if copy.exists():
            assert hashlib.sha256(copy.read_bytes()).hexdigest() == digest, f"{copy} is not a whole copy"
        if source.exists():
            assert hashlib.sha256(source.read_bytes()).hexdigest() == digest, f"{source} was modified"
        else:
            removed += 1
            assert copy.exists(), f"{source} removed without its archive copy: data lost"
        record = copy_dir / (name + ".sha256")
        if record.exists():
            assert record.read_text().split()[0] == digest, f"{record} records a wrong sha256"
    partials = len(list(archive.rglob("*.partial"))) if archive.exists() else 0
    return removed, partials


def run_trials(bed, trials: int, seed: int):
    tmp_path, src, archive = bed
    shards = expected_shards()
    rng = random.Random(seed)
    first_dir = archive / "sparkfleet"

    def wait_for_first_copy(proc, limit):
        # interpreter start and planning are a good share of a small run: most kills wait for the
        # archive dir (the first copy) to appear, then land at a random point of the copying
        started = time.monotonic()
        while proc.poll() is None and not first_dir.exists() and time.monotonic() - started < limit:
            time.sleep(0.001)
        return time.monotonic() - started

    reference, timing = {}, {}
    for remove_source in (True, False):
        reset(src, archive, shards)
        started = time.monotonic()
        proc = subprocess.Popen(command(tmp_path, src, archive, remove_source), stdout=subprocess.PIPE, text=True)
        before_copy = wait_for_first_copy(proc, 30)
        stdout, _ = proc.communicate()
        total = time.monotonic() - started
        timing[remove_source] = (total, max(total - before_copy, 0.01))
        assert proc.returncode == 0, stdout
        reference[remove_source] = tree(archive)
        assert len(reference[remove_source]) == 2 * len(shards)   # each copy and its record
        assert sorted(os.listdir(src)) == ([] if remove_source else sorted(shards))
    # what the last kill of a trial left: no copy yet, copies but no source removed yet, some sources
    # removed, all removed (the kill came at the end); partial_left counts trials with a .partial left
    outcomes = {"before_any_copy": 0, "copies_only": 0, "some_removed": 0, "all_removed": 0, "partial_left": 0,
                "double_kill": 0, "rerun_unchanged": 0}
    for trial in range(trials):
        remove_source = trial % 5 != 4
        reset(src, archive, shards)
        kills = 2 if trial % 4 == 3 else 1
        outcomes["double_kill"] += kills == 2
        for _ in range(kills):
            proc = subprocess.Popen(command(tmp_path, src, archive, remove_source), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
            total, copying = timing[remove_source]
            if trial % 4:
                wait_for_first_copy(proc, total * 5)
                time.sleep(rng.uniform(0.0, copying))
            else:
                time.sleep(rng.uniform(0.0, total))
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            removed, partials = check_nothing_lost(src, archive, shards)
        outcomes["partial_left"] += partials > 0
        copies = sum(1 for name in tree(archive) if name.endswith(".bin"))
        if removed == len(shards):
            outcomes["all_removed"] += 1
        elif removed:
            outcomes["some_removed"] += 1
        elif copies:
            outcomes["copies_only"] += 1
        else:
            outcomes["before_any_copy"] += 1
        rerun = subprocess.run(command(tmp_path, src, archive, remove_source), capture_output=True, text=True)
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        outcomes["rerun_unchanged"] += not json.loads(rerun.stdout)["changed"]
        check_nothing_lost(src, archive, shards)
        assert tree(archive) == reference[remove_source], "the rerun's archive differs from an uninterrupted run's"
        assert sorted(os.listdir(src)) == ([] if remove_source else sorted(shards))
    print(f"relocation SIGKILL trials: {trials}, uninterrupted run {timing} s, outcomes {outcomes}")
    return outcomes


def test_sigkill_at_random_moments_loses_nothing_and_reruns_byte_identical(bed):
    outcomes = run_trials(bed, trials=20, seed=20261201)
    # the kills did land in the middle of relocations, not only before or after them
    assert outcomes["some_removed"] + outcomes["copies_only"] >= 5, outcomes


@pytest.mark.slow
def test_sigkill_many_trials(bed):
    outcomes = run_trials(bed, trials=120, seed=19)
    assert outcomes["some_removed"] >= 20 and outcomes["copies_only"] >= 5 and outcomes["partial_left"] >= 1, outcomes
