"""module_utils/atomic_file: the one crash-safe write the modules share (reports, provenance, bundles)."""
from __future__ import annotations

import os
import stat

import pytest

from ansible.module_utils import atomic_file


def test_replaces_content_and_mode_and_syncs_the_directory(tmp_path, monkeypatch):
    target = tmp_path / "record.json"
    target.write_text("old\n")
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(atomic_file.os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")),
                                                             real_fsync(fd)))
    atomic_file.write_atomic(str(target), "new ✓\n", mode=0o600)
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

    monkeypatch.setattr(atomic_file.os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space left"):
        atomic_file.write_atomic(str(target), b"new")
    assert target.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["plot.png"]


def test_bytes_are_written_as_is(tmp_path):
    target = tmp_path / "blob"
    atomic_file.write_atomic(str(target), b"\x00\xff", sync_dir=False)
    assert target.read_bytes() == b"\x00\xff"
