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
