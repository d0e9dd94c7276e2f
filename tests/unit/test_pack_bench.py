"""The packing benchmark measures the packer alone (issue 24 item 2b): a step's peak RSS and CPU come from a
bare exec'd launcher, not from wait4 on a child of the (large) benchmark process."""
from __future__ import annotations

import importlib.util
import os
import sys

from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location("pack_bench", str(ROOT / "benchmarks" / "pack_bench.py"))
pack_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pack_bench)


def test_launcher_reports_the_child_alone_not_the_parents_ballast(tmp_path):
    ballast = bytearray(256 << 20)  # 256 MiB resident in this process
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    source = tmp_path / "source"
    source.write_bytes(b"x" * 8192)
    doc = pack_bench.launch([sys.executable, "-I", "-S", "-c", "b = bytearray(48 << 20)"], str(source), [],
                            str(tmp_path))
    assert doc["rc"] == 0
    assert 48 << 20 <= doc["maxrss_bytes"] < 128 << 20, doc  # the child's own 48 MiB, none of the 256
    assert doc["user_s"] >= 0 and doc["sys_s"] >= 0 and doc["wall_s"] > 0
    del ballast


def test_residency_is_per_file_and_counts_cached_pages(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(os.urandom(1 << 20))
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert pack_bench.resident_bytes(str(path)) == 0
        os.pread(fd, 1 << 20, 0)
        assert pack_bench.resident_bytes(str(path)) >= 1 << 20
    finally:
        os.close(fd)
    assert pack_bench.resident_bytes(str(tmp_path / "missing")) == 0
