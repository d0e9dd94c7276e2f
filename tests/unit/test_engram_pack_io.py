"""The packer's O_DIRECT write path (issue 24): rows packed in memory (RowBuffer.stage), whole blocks written
O_DIRECT and only a block-unaligned head or tail through the page cache (PackedOutput), byte-identical to
the page-cache path and to the independent reference; verification and resume compare the same way."""
from __future__ import annotations

import ctypes
import json
import mmap
import os
import random
import subprocess
import sys

import pytest

from ansible.module_utils import engram_packer_interleave as epi
from ansible.module_utils import engram_packer_io as epio
from ansible.module_utils import engram_packer_write as epw
from ansible.module_utils.engram_format import ROW_BYTES, SCALE_BYTES, WEIGHT_BYTES
from ansible.module_utils.engram_packer import pack
from tests.unit.test_engram_pack import _standalone, ckpt, opts, reference_shard, sha  # noqa: F401  (ckpt: fixture)

pytestmark = pytest.mark.skipif(epio._LIBC is None or not hasattr(os, "memfd_create"),
                                reason="staging needs ctypes and memfd_create")
HAVE_NUMPY = epi.choose("auto")[0] == "numpy"


@pytest.fixture(params=["numpy", "kernel-gather"])
def method(request, monkeypatch):
    """Each interleave method in turn (numpy only where importable), as the process's choice."""
    if request.param == "numpy" and not HAVE_NUMPY:
        pytest.skip("numpy is not importable here")
    monkeypatch.setattr(epi, "_CHOSEN", epi.choose(request.param))
    return request.param


def _resident_pages(path: str) -> int:
    """Pages of ``path`` in the page cache (mincore on a read-only mapping; faults nothing in)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            assert libc.mincore(addr, size, vec) == 0
            return pages - bytes(vec).count(0)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def _filled(rows: int, wdelta: int, sdelta: int, seed: int):
    rng = random.Random(seed)
    weights = bytes(rng.getrandbits(8) for _ in range(rows * WEIGHT_BYTES))
    scales = bytes(rng.getrandbits(8) for _ in range(rows * SCALE_BYTES))
    buf = epio.RowBuffer(rows, staging=True)
    buf.wmem[wdelta:wdelta + len(weights)] = weights
    buf.smem[sdelta:sdelta + len(scales)] = scales
    # what lies after the weights (the last row's iovec reads 8 bytes of it) must not reach the output
    buf.wmem[wdelta + len(weights):wdelta + len(weights) + 8] = b"\xEE" * 8
    buf.set_deltas(wdelta, sdelta)
    return buf, epio.interleave(weights, scales, rows)


@pytest.mark.parametrize("rows,wdelta,sdelta,delta", [(1, 0, 0, 0), (511, 568, 2616, 8), (513, 4095, 3, 4088),
                                                      (2048, 17, 4001, 1024)])
def test_staged_rows_are_the_interleave(method, rows, wdelta, sdelta, delta):
    buf, expected = _filled(rows, wdelta, sdelta, seed=rows)
    try:
        assert buf.method == method
        buf.stage(rows, delta)
        assert buf.staged == (delta, rows)
        assert bytes(buf.packed()) == expected
        # a shorter chunk in the same buffer (the shard's last one) packs just its rows
        buf.stage(rows // 2 or 1, delta)
        assert bytes(buf.packed()) == expected[:(rows // 2 or 1) * ROW_BYTES]
    finally:
        buf.close()


@pytest.mark.parametrize("offset,rows", [(4096, 512), (4096 + 777 * ROW_BYTES, 1000), (4096 + 100 * ROW_BYTES, 3)])
def test_packed_output_writes_whole_blocks_direct_and_reports_the_rest(method, tmp_path, offset, rows):
    path = str(tmp_path / "out.partial")
    fd = epio.create_exclusive(path)
    out = epio.PackedOutput(fd, path)
    if not out.direct:
        out.close()
        os.close(fd)
        pytest.skip("this filesystem refuses O_DIRECT")
    buf, expected = _filled(rows, 100, 200, seed=offset)
    try:
        buf.stage(rows, offset % epio.ALIGN)
        cached = epw.write_chunk(out, buf, rows, offset)
        end = offset + rows * ROW_BYTES
        head_end = min(end, offset + (-offset) % epio.ALIGN)
        tail_start = max(head_end, end - end % epio.ALIGN)
        assert cached == [r for r in ((offset, head_end), (tail_start, end)) if r[1] > r[0]]
        os.fsync(fd)
        # what went O_DIRECT never entered the page cache: at most the head's and the tail's pages are there
        assert _resident_pages(path) <= len(cached)
        with open(path, "rb") as handle:
            handle.seek(offset)
            assert handle.read() == expected
    finally:
        buf.close()
        out.close()
        os.close(fd)


def test_a_buffer_not_staged_for_this_chunk_goes_through_the_page_cache(tmp_path):
    path = str(tmp_path / "out.partial")
    fd = epio.create_exclusive(path)
    out = epio.PackedOutput(fd, path)
    buf, expected = _filled(64, 0, 0, seed=5)
    try:
        buf.stage(64, 8)  # staged for another offset: never written from
        assert epw.write_chunk(out, buf, 64, 4096) == [(4096, 4096 + 64 * ROW_BYTES)]
        with open(path, "rb") as handle:
            handle.seek(4096)
            assert handle.read() == expected
    finally:
        buf.close()
        out.close()
        os.close(fd)


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("chunk_rows", [512, 777])
def test_both_write_paths_are_byte_identical_and_leave_no_cache(method, ckpt, tmp_path, direct,  # noqa: F811
                                                                  chunk_rows):
    result = pack(opts(ckpt, tmp_path, 1, 3, layers=[1, 14], chunk_rows=chunk_rows, verify="full", direct=direct))
    assert result["interleave"] == (method if direct else "kernel-gather")
    for shard in result["shards"]:
        assert shard["state_after"] == "valid" and shard["verified_rows"] == shard["rows"]
        assert _resident_pages(shard["path"]) == 0  # before this test reads it back
        with open(shard["path"], "rb") as handle:
            assert handle.read() == reference_shard(ckpt, shard["layer"], 1, 3)


def test_full_verification_names_the_first_differing_row(ckpt, tmp_path, monkeypatch):  # noqa: F811
    real = epw._stream

    def stream_then_flip(plan, source, options, pfd, progress):
        chunks = real(plan, source, options, pfd, progress)
        os.pwrite(pfd, b"\x00" * 3, 4096 + 4321 * ROW_BYTES + 7)  # row 4321's weights, after writing
        return chunks

    monkeypatch.setattr(epw, "_stream", stream_then_flip)
    with pytest.raises(epio.PackError) as info:
        pack(opts(ckpt, tmp_path, 0, 3, layers=[14], chunk_rows=1000, verify="full"))
    assert "row 4321 (absolute 4321) differs from the checkpoint" in info.value.msg


def _cli(python, tmp_path, ckpt, dest, want):  # noqa: F811
    """The standalone packer run by ``python`` (an argv prefix) with SPARKFLEET_PACK_INTERLEAVE=want."""
    argv = python + ["-I", _standalone(tmp_path), "--checkpoint", ckpt, "--dest", str(dest), "--rank", "1",
                     "--tp", "3", "--layers", "14", "--margin-bytes", "0", "--chunk-rows", "777", "--json"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, **{epi.INTERLEAVE_ENV: want}))
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_cli_uses_numpy_where_importable_and_falls_back_to_the_same_bytes(ckpt, tmp_path):  # noqa: F811
    """The standalone packer under a Python without numpy (``-S``: no site-packages) and with it, and forced."""
    expected = reference_shard(ckpt, 14, 1, 3)
    runs = [("auto", ["-S"], "kernel-gather"), ("kernel-gather", [], "kernel-gather")]
    if HAVE_NUMPY:
        runs.append(("auto", [], "numpy"))
    for i, (want, flags, got) in enumerate(runs):
        dest = tmp_path / ("engram%d" % i)
        dest.mkdir()
        rc, doc = _cli([sys.executable] + flags, tmp_path, ckpt, dest, want)
        assert rc == 0 and doc["interleave"] == got, doc
        with open(doc["shards"][0]["path"], "rb") as handle:
            assert handle.read() == expected
    for want, flags, words in (("bogus", [], "must be auto, numpy or kernel-gather, not 'bogus'"),
                               ("numpy", ["-S"], "numpy cannot be imported here")):
        dest = tmp_path / ("refused-" + want)
        dest.mkdir()
        rc, doc = _cli([sys.executable] + flags, tmp_path, ckpt, dest, want)
        assert rc == 1 and words in doc["msg"] and os.listdir(str(dest)) == [], doc


def _vma(address: int) -> dict:
    """The /proc/self/smaps fields of the mapping starting at ``address`` (sizes in kB)."""
    fields, found = {}, False
    with open("/proc/self/smaps") as handle:
        for line in handle:
            head = line.split()
            if "-" in head[0] and len(head) >= 5:
                if found:
                    break
                start, end = (int(x, 16) for x in head[0].split("-"))
                found = start == address
                fields = {"bytes": end - start, "flags": head[1], "name": " ".join(head[5:])}
            elif found and line.endswith("kB\n"):
                fields[head[0].rstrip(":")] = int(head[1])
    assert found, hex(address)
    return fields


@pytest.mark.skipif(not epio.HUGE_PAGE, reason="no transparent huge pages here")
def test_io_buffers_are_private_huge_pages_and_resident_only_where_touched():
    size = 2 * epio.HUGE_PAGE + 3 * epio.ALIGN  # a chunk's weights: whole huge pages and a small tail
    mem = epio.io_buffer(size)
    anchor = ctypes.c_char.from_buffer(mem)
    try:
        address = ctypes.addressof(anchor)
        assert len(mem) % epio.HUGE_PAGE == 0 and len(mem) >= size
        mem[:size] = b"\x5A" * size  # what an O_DIRECT read of a chunk touches
        vma = _vma(address)
        assert vma["flags"][3] == "p" and vma["name"] == ""  # private anonymous, not shmem ("/dev/zero (deleted)")
        assert vma["Rss"] * 1024 <= size + epio.ALIGN  # the rounded-up tail was never touched
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as handle:
            enabled = handle.read()
        if "[never]" not in enabled and address % epio.HUGE_PAGE == 0:
            assert vma["AnonHugePages"] * 1024 == 2 * epio.HUGE_PAGE, vma
    finally:
        del anchor
        mem.close()
