"""engram_relocate: archive stale shards on another volume, verified; remove only on request."""
import hashlib
import os
import subprocess
import uuid

import pytest

from ansible.module_utils import engram_relocate as er
from tests.conftest import load_module
from tests.unit.module_harness import run_module

module = load_module("engram_relocate")


@pytest.fixture
def volumes(tmp_path):
    """Two real filesystems: the source dir on tmp_path's, the archive on a small tmpfs."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    archive = tmp_path / "archive"
    archive.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(archive)], check=True)
    src = tmp_path / "old"
    src.mkdir()
    yield src, archive
    subprocess.run(["umount", str(archive)], check=True)


def make_shard(path, layer=1, rank=1, tp=2, size=200_000):
    data = hashlib.sha256(str(path).encode()).digest() * (size // 32)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def args(src, archive, **kw):
    base = {"stale_paths": [str(src)], "archive_dir": str(archive / "sparkfleet"), "margin_bytes": 65536}
    base.update(kw)
    return base


def test_check_mode_plans_and_writes_nothing(volumes):
    src, archive = volumes
    make_shard(src / "engram-l1-r1of2.bin")
    out = run_module(module, args(src, archive, remove_source=True), check_mode=True, diff=True)
    assert not out.failed and out.result["changed"]
    assert out.result["freed_bytes"] == 200_000 - 200_000 % 32
    assert out.result["files"][0]["action"] == "copy+remove"
    assert "removed" in out.result["diff"]["after"]
    assert os.listdir(archive) == [] and (src / "engram-l1-r1of2.bin").exists()


def test_copy_without_removal_keeps_source_and_frees_nothing(volumes):
    src, archive = volumes
    sha = make_shard(src / "engram-l14-r1of2.bin")
    out = run_module(module, args(src, archive))
    assert out.result["changed"] and out.result["freed_bytes"] == 0
    copy = archive / "sparkfleet" / str(src).lstrip("/") / "engram-l14-r1of2.bin"
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == sha
    assert (src / "engram-l14-r1of2.bin").exists()
    again = run_module(module, args(src, archive))
    assert not again.result["changed"]


def test_relocation_with_removal_is_verified_and_idempotent(volumes):
    src, archive = volumes
    sha = make_shard(src / "engram-l1-r1of2.bin")
    out = run_module(module, args(src, archive, remove_source=True))
    assert out.result["changed"] and out.result["files"][0]["sha256"] == sha
    assert not (src / "engram-l1-r1of2.bin").exists()
    assert not list((archive / "sparkfleet").rglob("*.partial"))
    again = run_module(module, args(src, archive, remove_source=True))
    assert not again.result["changed"] and again.result["files"] == []


def test_other_tp_shards_in_the_engram_dir_are_stale_but_current_ones_are_not(volumes):
    src, archive = volumes
    make_shard(src / "engram-l1-r1of2.bin")
    make_shard(src / "engram-l1-r1of3.bin")
    plan = er.plan([], str(archive / "a"), remove_source=False, engram_dir=str(src), tp=3, margin_bytes=0)
    assert [os.path.basename(f.source) for f in plan.files] == ["engram-l1-r1of2.bin"]
    assert "TP2" in plan.files[0].reason


def test_refuses_an_archive_on_the_same_volume(tmp_path):
    (tmp_path / "old").mkdir()
    make_shard(tmp_path / "old" / "engram-l1-r1of2.bin")
    out = run_module(module, {"stale_paths": [str(tmp_path / "old")], "archive_dir": str(tmp_path / "arch")})
    assert out.failed and "same volume" in out.result["msg"]
    assert not (tmp_path / "arch").exists()


def test_refuses_when_the_archive_is_too_small(volumes):
    src, archive = volumes
    make_shard(src / "engram-l1-r1of2.bin", size=8 * 1024 * 1024)
    out = run_module(module, args(src, archive, remove_source=True))
    assert out.failed and out.result["required_bytes"] == 8 * 1024 * 1024
    assert (src / "engram-l1-r1of2.bin").exists() and os.listdir(archive) == []


def test_a_different_file_already_in_the_archive_is_never_overwritten(volumes):
    src, archive = volumes
    make_shard(src / "engram-l1-r1of2.bin")
    target = archive / "sparkfleet" / str(src).lstrip("/")
    target.mkdir(parents=True)
    (target / "engram-l1-r1of2.bin").write_bytes(b"something else " + uuid.uuid4().bytes)
    out = run_module(module, args(src, archive, remove_source=True))
    assert out.failed and "different file" in out.result["msg"]
    assert (src / "engram-l1-r1of2.bin").exists()
