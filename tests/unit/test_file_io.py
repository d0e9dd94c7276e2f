"""module_utils/file_io: the crash-safe write and the file hash the modules share (reports, provenance, bundles)."""
from __future__ import annotations

import os
import stat

import pytest

from ansible.module_utils import file_io


def test_replaces_content_and_mode_and_syncs_the_directory(tmp_path, monkeypatch):
    target = tmp_path / "record.json"
    target.write_text("old\n")
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(file_io.os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")),
                                                             real_fsync(fd)))
    file_io.write_atomic(str(target), "new ✓\n", mode=0o600)
    assert target.read_text(encoding="utf-8") == "new ✓\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert synced[-1] == str(tmp_path), "the directory must be fsync'd after the rename"
    assert any(p.startswith(str(tmp_path / ".record.json.")) for p in synced[:-1]), "the data file is fsync'd"
    assert sorted(os.listdir(tmp_path)) == ["record.json"]  # no temporary left behind


def test_failure_keeps_the_old_content_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "plot.png"
    target.write_bytes(b"old")

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(file_io.os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space left"):
        file_io.write_atomic(str(target), b"new")
    assert target.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["plot.png"]


def test_bytes_are_written_as_is(tmp_path):
    target = tmp_path / "blob"
    file_io.write_atomic(str(target), b"\x00\xff", sync_dir=False)
    assert target.read_bytes() == b"\x00\xff"


def test_sha256_file_matches_hashlib_across_blocks(tmp_path):
    import hashlib
    data = os.urandom((1 << 20) + 12345)  # more than one read block
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert file_io.sha256_file(str(path)) == hashlib.sha256(data).hexdigest()


def test_write_if_changed_writes_once_and_then_reports_no_change(tmp_path):
    target = tmp_path / "bench-incumbent.json"
    first = file_io.write_if_changed(str(target), '{"a": 1}\n', mode=0o644)
    assert first == {"changed": True, "dest": str(target), "size": 9, "mode": "0644"}
    assert target.read_text() == '{"a": 1}\n' and stat.S_IMODE(target.stat().st_mode) == 0o644
    assert file_io.write_if_changed(str(target), '{"a": 1}\n', mode=0o644)["changed"] is False
    # the same bytes with another mode is a change (the mode is part of what the task asks for)
    assert file_io.write_if_changed(str(target), '{"a": 1}\n', mode=0o600)["changed"] is True
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_write_if_changed_in_check_mode_reports_and_writes_nothing(tmp_path):
    target = tmp_path / "spark1-rank0-dsv41-head.log"
    assert file_io.write_if_changed(str(target), "ready\n", check=True)["changed"] is True
    assert not target.exists()
    target.write_text("old\n")
    assert file_io.write_if_changed(str(target), "new\n", check=True)["changed"] is True
    assert target.read_text() == "old\n"


def test_write_if_changed_refuses_a_missing_folder_and_a_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        file_io.write_if_changed(str(tmp_path / "no-such-run" / "rollout.json"), "x")
    (tmp_path / "boot-logs").mkdir()
    with pytest.raises(IsADirectoryError):
        file_io.write_if_changed(str(tmp_path / "boot-logs"), "x")


def test_write_if_changed_makes_missing_folders_only_when_asked_and_never_in_check_mode(tmp_path):
    dest = tmp_path / "run" / "boot-logs" / "candidate" / "spark1.log"
    with pytest.raises(FileNotFoundError):
        file_io.write_if_changed(str(dest), "log\n")
    assert file_io.write_if_changed(str(dest), "log\n", check=True, make_folders=True)["changed"] is True
    assert not (tmp_path / "run").exists(), "check mode makes no folder"
    old = os.umask(0o077)
    try:
        assert file_io.write_if_changed(str(dest), "log\n", make_folders=True)["changed"] is True
    finally:
        os.umask(old)
    assert dest.read_text() == "log\n"
    for folder in (dest.parent, dest.parent.parent, dest.parent.parent.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert file_io.write_if_changed(str(dest), "log\n", make_folders=True)["changed"] is False
