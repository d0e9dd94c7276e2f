"""engram_relocate never deletes the only copy (issue 19, items 1-4): archive paths that lead back to the
source (symlinks, bind mounts, a same-inode copy), damaged copies behind a stale record, hostile
`.partial` files, and a real ENOSPC in the middle of a run, which must say exactly what it did."""
import hashlib
import os
import subprocess

import pytest

from ansible.module_utils import engram_relocate as er
from tests.conftest import load_module
from tests.unit.module_harness import run_module

module = load_module("engram_relocate")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs or a bind mount needs root")


def _mount(*argv):
    subprocess.run(["mount", *argv], check=True)


@pytest.fixture
def volumes(tmp_path):
    """The source dir on tmp_path's filesystem, the archive on a real tmpfs of 4 MiB."""
    archive = tmp_path / "archive"
    archive.mkdir()
    mounts = [archive]
    _mount("-t", "tmpfs", "-o", "size=4m", "tmpfs", str(archive))
    src = tmp_path / "old"
    src.mkdir()
    yield src, archive, mounts
    for path in reversed(mounts):
        subprocess.run(["umount", "-l", str(path)], check=True)


def make_shard(path, size=200_000, salt=b""):
    data = (hashlib.sha256(str(path).encode() + salt).digest() * (size // 32 + 1))[:size]
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def args(src, archive, **kw):
    base = {"stale_paths": [str(src)], "archive_dir": str(archive / "sparkfleet"), "margin_bytes": 0,
            "remove_source": True}
    base.update(kw)
    return base


def archive_dir_of(src, archive):
    return archive / "sparkfleet" / str(src).lstrip("/")


# Item 1: an archive path that resolves onto the source is refused before anything is copied.

def test_a_symlink_below_the_archive_root_back_to_the_source_dir_is_refused(volumes):
    src, archive, _ = volumes
    digest = make_shard(src / "engram-l1-r1of2.bin")
    target = archive_dir_of(src, archive)
    target.parent.mkdir(parents=True)
    target.symlink_to(src)
    out = run_module(module, args(src, archive))
    assert out.failed and "symlink" in out.result["msg"] and str(target) in out.result["msg"]
    assert sha(src / "engram-l1-r1of2.bin") == digest


def test_a_subtree_symlinked_back_to_the_source_volume_is_refused(volumes):
    src, archive, _ = volumes
    digest = make_shard(src / "engram-l1-r1of2.bin")
    top = str(src).lstrip("/").split("/")[0]
    (archive / "sparkfleet").mkdir()
    (archive / "sparkfleet" / top).symlink_to("/" + top)
    out = run_module(module, args(src, archive))
    assert out.failed and "symlink" in out.result["msg"]
    assert sha(src / "engram-l1-r1of2.bin") == digest
    assert not out.result.get("changed")


def test_an_archive_file_that_is_a_symlink_to_its_source_is_refused(volumes):
    src, archive, _ = volumes
    digest = make_shard(src / "engram-l1-r1of2.bin")
    target = archive_dir_of(src, archive)
    target.mkdir(parents=True)
    (target / "engram-l1-r1of2.bin").symlink_to(src / "engram-l1-r1of2.bin")
    out = run_module(module, args(src, archive))
    assert out.failed and "symlink" in out.result["msg"]
    assert sha(src / "engram-l1-r1of2.bin") == digest


def test_a_bind_mount_of_the_source_below_the_archive_root_is_refused(volumes):
    src, archive, mounts = volumes
    digest = make_shard(src / "engram-l1-r1of2.bin")
    target = archive_dir_of(src, archive)
    target.mkdir(parents=True)
    _mount("--bind", str(src), str(target))
    mounts.append(target)
    out = run_module(module, args(src, archive))
    assert out.failed and "mount" in out.result["msg"] and str(target) in out.result["msg"]
    assert sha(src / "engram-l1-r1of2.bin") == digest


def test_a_copy_that_is_the_same_inode_as_its_source_is_no_copy(volumes):
    """Same volume through a bind mount of the whole archive root: (st_dev, st_ino) are compared."""
    src, archive, mounts = volumes
    digest = make_shard(src / "engram-l1-r1of2.bin")
    bind = src.parent / "bindroot"
    bind.mkdir()
    _mount("--bind", "/", str(bind))
    mounts.append(bind)
    source = str(src / "engram-l1-r1of2.bin")
    # a plan as if the archive root were that bind mount (plan() itself refuses it for its volume first)
    item = er.StaleFile(source=source, archive=str(bind) + source, bytes=200_000, reason="test", state="copied",
                        action="remove")
    plan = er.Plan(files=[item], archive_root=str(bind), archive_dev=os.stat(bind).st_dev, archive_dir=str(bind))
    with pytest.raises(er.RelocateError) as exc:
        er.apply(plan)
    assert "same file" in exc.value.msg and exc.value.extra["removed_sources"] == []
    assert sha(src / "engram-l1-r1of2.bin") == digest


# Item 2: a record file is never proof; the copy is re-hashed before its source is removed.

def test_a_damaged_copy_behind_a_stale_record_never_costs_the_source(volumes):
    src, archive, _ = volumes
    digest = make_shard(src / "engram-l1-r1of2.bin")
    first = run_module(module, args(src, archive, remove_source=False))
    assert first.result["changed"] and not first.failed
    copy = archive_dir_of(src, archive) / "engram-l1-r1of2.bin"
    damaged = bytearray(copy.read_bytes())
    damaged[100_000] ^= 0xFF
    copy.write_bytes(bytes(damaged))   # same size; the .sha256 record still matches the source's stamp
    out = run_module(module, args(src, archive))
    assert out.failed, out.result
    assert "sha256" in out.result["msg"] and str(copy) in out.result["msg"]
    assert sha(src / "engram-l1-r1of2.bin") == digest
    assert out.result["removed_sources"] == []


# Item 3: .partial files never follow a link nor write into a file that has other names.

def test_a_partial_that_is_a_symlink_is_refused_and_its_target_untouched(volumes):
    src, archive, _ = volumes
    digest = make_shard(src / "engram-l1-r1of2.bin")
    victim = src.parent / "victim"
    victim.write_bytes(b"precious")
    target = archive_dir_of(src, archive)
    target.mkdir(parents=True)
    (target / "engram-l1-r1of2.bin.partial").symlink_to(victim)
    out = run_module(module, args(src, archive))
    assert out.failed and ".partial" in out.result["msg"]
    assert victim.read_bytes() == b"precious"
    assert sha(src / "engram-l1-r1of2.bin") == digest


def test_a_partial_with_another_name_is_refused_and_that_file_untouched(volumes):
    src, archive, _ = volumes
    digest = make_shard(src / "engram-l1-r1of2.bin")
    victim = archive / "victim"
    victim.write_bytes(b"precious")
    target = archive_dir_of(src, archive)
    target.mkdir(parents=True)
    os.link(victim, target / "engram-l1-r1of2.bin.partial")
    out = run_module(module, args(src, archive))
    assert out.failed and "links" in out.result["msg"]
    assert victim.read_bytes() == b"precious"
    assert sha(src / "engram-l1-r1of2.bin") == digest


def test_a_leftover_partial_of_an_interrupted_copy_is_replaced_not_truncated(volumes):
    src, archive, _ = volumes
    digest = make_shard(src / "engram-l1-r1of2.bin")
    target = archive_dir_of(src, archive)
    target.mkdir(parents=True)
    (target / "engram-l1-r1of2.bin.partial").write_bytes(b"x" * 1000)
    old_inode = os.stat(target / "engram-l1-r1of2.bin.partial").st_ino
    keep = os.open(target / "engram-l1-r1of2.bin.partial", os.O_RDONLY)
    try:
        out = run_module(module, args(src, archive))
        assert not out.failed, out.result
        assert os.fstat(keep).st_size == 1000   # the old inode was unlinked, never truncated
    finally:
        os.close(keep)
    assert os.stat(target / "engram-l1-r1of2.bin").st_ino != old_inode
    assert sha(target / "engram-l1-r1of2.bin") == digest
    assert not (src / "engram-l1-r1of2.bin").exists()


def test_a_directory_swapped_for_a_symlink_after_planning_is_not_followed(volumes):
    src, archive, _ = volumes
    digest = make_shard(src / "engram-l1-r1of2.bin")
    outside = src.parent / "outside"
    outside.mkdir()
    plan = er.plan([str(src)], str(archive / "sparkfleet"), remove_source=True, margin_bytes=0)
    target = archive_dir_of(src, archive)
    target.parent.mkdir(parents=True)
    target.symlink_to(outside)
    with pytest.raises(er.RelocateError) as exc:
        er.apply(plan)
    assert "symlink" in exc.value.msg
    assert os.listdir(outside) == []
    assert sha(src / "engram-l1-r1of2.bin") == digest


# Item 4: a real ENOSPC in the middle of a run reports what was removed, verified and left.

def test_archive_full_in_the_middle_reports_exactly_what_it_did(tmp_path):
    archive = tmp_path / "archive"
    archive.mkdir()
    _mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(archive))
    try:
        src = tmp_path / "old"
        src.mkdir()
        # 4 x (63 pages + 1 byte): 1,032,196 bytes pass the byte-count space check of a 1 MiB tmpfs, but
        # each copy takes 64 pages and its record one more, so the 4th copy hits a real ENOSPC.
        size = 63 * 4096 + 1
        digests = {f"engram-l{n}-r1of2.bin": make_shard(src / f"engram-l{n}-r1of2.bin", size) for n in (1, 2, 3, 4)}
        out = run_module(module, args(src, archive))
        assert out.failed
        assert out.result["changed"] is True
        assert "No space left" in out.result["msg"] or "ENOSPC" in out.result["msg"]
        removed = [str(src / f"engram-l{n}-r1of2.bin") for n in (1, 2, 3)]
        assert out.result["removed_sources"] == removed
        assert out.result["freed_bytes"] == 3 * size
        assert out.result["left"] == [str(src / "engram-l4-r1of2.bin")]
        assert sorted(out.result["verified_copies"]) == sorted(
            str(archive_dir_of(src, archive) / os.path.basename(p)) for p in removed)
        for name in removed[0:3]:
            assert not os.path.exists(name)
            assert sha(archive_dir_of(src, archive) / os.path.basename(name)) == digests[os.path.basename(name)]
        assert sha(src / "engram-l4-r1of2.bin") == digests["engram-l4-r1of2.bin"]
        states = {os.path.basename(f["source"]): f["state"] for f in out.result["files"]}
        assert states == {"engram-l1-r1of2.bin": "relocated", "engram-l2-r1of2.bin": "relocated",
                          "engram-l3-r1of2.bin": "relocated", "engram-l4-r1of2.bin": "failed"}
        assert not list(archive.rglob("*.partial"))
    finally:
        subprocess.run(["umount", str(archive)], check=True)
