"""The packed Engram format: header round trips, row ranges, shard state on disk, boot-log flags."""
from __future__ import annotations

import os
import struct

import pytest

from ansible.module_utils import engram_format as ef
from ansible.module_utils.engram_format import EngramFormatError

# Written out independently of the module (docs/reference.md section 3): six little-endian u64, magic first.
# docs/reference.md glosses the magic 0x31344E4531565344 as the bytes "DSV41EN1", but that integer stored
# little-endian is b"DSV1EN41" ("DSV41EN1" would be 0x314E453134565344). The integer is what a reader
# compares, so the integer is authoritative here; the gloss is reported as a documentation error.
MAGIC = 0x31344E4531565344
MAGIC_BYTES = MAGIC.to_bytes(8, "little")


def independent_header(layer, lo, hi, n):
    return MAGIC_BYTES + struct.pack("<5Q", layer, lo, hi, n, 264) + b"\0" * (4096 - 48)


def test_magic_is_the_integer_of_fleet_md():
    assert MAGIC_BYTES == b"DSV1EN41"
    assert ef.MAGIC == MAGIC and ef.MAGIC_BYTES == MAGIC_BYTES


@pytest.mark.parametrize("layer, lo, hi, n", [
    (1, 0, 128001, 384000003), (14, 128001, 256002, 384000003), (1, 0, 0, 0), (3, 5, 6, 7),
    (2 ** 64 - 1, 2 ** 64 - 2, 2 ** 64 - 1, 2 ** 64 - 1),
])
def test_header_round_trip_matches_independent_bytes(layer, lo, hi, n):
    raw = ef.encode_header(layer, lo, hi, n)
    assert len(raw) == ef.HEADER_SIZE == 4096
    assert raw == independent_header(layer, lo, hi, n)
    assert raw[:8] == MAGIC_BYTES
    header = ef.decode_header(raw)
    assert (header.magic, header.layer, header.lo, header.hi, header.n, header.row_bytes) == (
        ef.MAGIC, layer, lo, hi, n, 264)
    assert header.padding_clean and header.rows == hi - lo and header.size == 4096 + (hi - lo) * 264
    assert ef.header_problems(header, layer, lo, hi, n) == []
    assert ef.validate_header(raw + b"rows follow", layer, lo, hi, n) == header


@pytest.mark.parametrize("args", [(1, 5, 4, 10), (1, 0, 11, 10), (-1, 0, 1, 1), (1, 0, 1, 2 ** 64), (1.0, 0, 1, 1),
                                  (True, 0, 1, 1)])
def test_encode_rejects_impossible_headers(args):
    with pytest.raises(EngramFormatError):
        ef.encode_header(*args)


def test_decode_and_validate_report_every_problem():
    with pytest.raises(EngramFormatError, match="truncated"):
        ef.decode_header(b"\0" * 4095)
    good = bytearray(independent_header(1, 10, 20, 30))
    assert "bad magic" in ef.header_problems(ef.decode_header(bytes(4096)), 1, 10, 20, 30)[0]
    wrong = bytearray(good)
    wrong[8:16] = struct.pack("<Q", 14)
    wrong[40:48] = struct.pack("<Q", 128)
    wrong[100] = 1
    problems = ef.header_problems(ef.decode_header(bytes(wrong)), 1, 10, 21, 31)
    text = "; ".join(problems)
    for needle in ("row size 128", "layer 14 (expected 1)", "rows [10, 20) (expected [10, 21))", "N=30 (expected 31)",
                   "non-zero bytes in the header padding"):
        assert needle in text
    with pytest.raises(EngramFormatError, match="layer 14"):
        ef.validate_header(bytes(wrong), 1, 10, 20, 30)
    # without N, a range outside the header's own N is still caught
    odd = bytearray(good)
    odd[32:40] = struct.pack("<Q", 15)
    assert any("do not fit N=15" in p for p in ef.header_problems(ef.decode_header(bytes(odd)), 1, 10, 20))


@pytest.mark.parametrize("tp", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("n", [0, 1, 2, 7, 8, 120003, 96001, 384000003, 2 ** 40 + 5])
def test_row_ranges_cover_every_row_exactly_once(tp, n):
    ranges = [ef.row_range(n, rank, tp) for rank in range(tp)]
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    for (lo, hi), (next_lo, _) in zip(ranges, ranges[1:]):
        assert hi == next_lo  # contiguous: no gap, no overlap
    sizes = [hi - lo for lo, hi in ranges]
    assert sum(sizes) == n and max(sizes) - min(sizes) <= 1
    for rank, (lo, hi) in enumerate(ranges):
        assert (lo, hi) == (n * rank // tp, n * (rank + 1) // tp)
        assert ef.packed_size(lo, hi) == 4096 + (hi - lo) * 264


def test_row_range_known_values():
    assert [ef.row_range(120003, r, 3) for r in range(3)] == [(0, 40001), (40001, 80002), (80002, 120003)]
    assert [ef.row_range(96001, r, 3) for r in range(3)] == [(0, 32000), (32000, 64000), (64000, 96001)]


@pytest.mark.parametrize("rank, tp, needle", [
    (0, 0, "at least 1"), (0, -3, "at least 1"), (3, 3, "out of range"), (-1, 3, "out of range"),
    (8, 8, "valid ranks: 0..7"), (True, 2, "not an integer"), (0, 2.0, "not an integer"),
])
def test_rank_and_tp_out_of_range(rank, tp, needle):
    with pytest.raises(EngramFormatError, match=needle):
        ef.row_range(100, rank, tp)


def test_row_range_rejects_bad_n():
    with pytest.raises(EngramFormatError):
        ef.row_range(-1, 0, 1)
    with pytest.raises(EngramFormatError):
        ef.packed_size(5, 4)


def test_names():
    assert ef.shard_name(1, 0, 3) == "engram-l1-r0of3.bin"
    assert ef.partial_name(14, 2, 4) == "engram-l14-r2of4.partial"
    assert ef.progress_name(14, 2, 4) == "engram-l14-r2of4.progress.json"


def write_shard(dest, layer, rank, tp, n, extra=b"", header=None, rows=None):
    lo, hi = n * rank // tp, n * (rank + 1) // tp
    count = hi - lo if rows is None else rows
    path = os.path.join(dest, "engram-l%d-r%dof%d.bin" % (layer, rank, tp))
    with open(path, "wb") as handle:
        handle.write(header if header is not None else independent_header(layer, lo, hi, n))
        handle.write(bytes(count * 264) + extra)
    return path


def test_inspect_shard_states(tmp_path):
    dest = str(tmp_path)
    state = ef.inspect_shard(dest, 1, 1, 3)
    assert state.state == "absent" and state.partial_path is None
    partial = tmp_path / "engram-l1-r1of3.partial"
    partial.write_bytes(independent_header(1, 33, 66, 100) + bytes(264 * 5))
    state = ef.inspect_shard(dest, 1, 1, 3)
    assert state.state == "partial" and state.partial_size == 4096 + 264 * 5 and "about 5 rows" in state.reason
    write_shard(dest, 1, 1, 3, 100)
    state = ef.inspect_shard(dest, 1, 1, 3)
    assert (state.state, state.lo, state.hi, state.n, state.size) == ("valid", 33, 66, 100, 4096 + 33 * 264)
    assert state.partial_path == str(partial)  # reported, left alone
    assert ef.inspect_shard(dest, 1, 1, 3, n=100).state == "valid"
    state = ef.inspect_shard(dest, 1, 1, 3, n=101)
    assert state.state == "invalid" and "N=100 (expected 101)" in state.reason
    assert "does not match this rank's range" in state.reason


@pytest.mark.parametrize("case, needle", [
    ("truncated", "is truncated: "), ("long", "is too long"), ("short", "shorter than the header"),
    ("magic", "bad magic"), ("layer", "layer 14 (expected 1)"), ("range", "does not match this rank's range"),
    ("rowsize", "row size 128"),
])
def test_inspect_shard_invalid(tmp_path, case, needle):
    dest = str(tmp_path)
    if case == "truncated":
        write_shard(dest, 1, 0, 2, 50, rows=24)
    elif case == "long":
        write_shard(dest, 1, 0, 2, 50, extra=b"x")
    elif case == "short":
        (tmp_path / "engram-l1-r0of2.bin").write_bytes(b"DSV41EN1")
    elif case == "magic":
        write_shard(dest, 1, 0, 2, 50, header=bytes(4096))
    elif case == "layer":
        write_shard(dest, 1, 0, 2, 50, header=independent_header(14, 0, 25, 50))
    elif case == "range":
        write_shard(dest, 1, 0, 2, 50, header=independent_header(1, 0, 17, 50), rows=17)  # a TP3 range
    elif case == "rowsize":
        bad = bytearray(independent_header(1, 0, 25, 50))
        bad[40:48] = struct.pack("<Q", 128)
        write_shard(dest, 1, 0, 2, 50, header=bytes(bad))
    state = ef.inspect_shard(dest, 1, 0, 2)
    assert state.state == "invalid"
    assert needle in state.reason


def test_inspect_shard_not_a_regular_file(tmp_path):
    (tmp_path / "engram-l1-r0of2.bin").mkdir()
    assert ef.inspect_shard(str(tmp_path), 1, 0, 2).reason == "not a regular file"


_DETAIL = "cache=0.0GiB (0 slots, 4-way, 0% of owned rows) scales=0.1GiB io_threads=96"
LOG = "\n".join([
    "[2026-05-01 10:00:00] Booting rank 1",
    "Exact nvme Engram layer=1 rank=1 rows=[40001,80002) %s packed=False" % _DETAIL,
    "Exact nvme Engram layer=14 rank=1 rows=[32000,64000) %s packed=False" % _DETAIL,
    "Engram layer=14 lookups=100 hit_rate=0.0% reads=200 cache=0.0GiB(4-way) scales=0.1GiB threads=96 packed=True",
    "[2026-05-01 11:00:00] Booting rank 1",
    "Exact nvme Engram layer=1 rank=1 rows=[40001,80002) %s packed=True" % _DETAIL,
    "INFO Exact nvme Engram layer=14 rank=1 rows=[32000, 64000) %s packed=True" % _DETAIL,
]) + "\n"


def test_boot_log_last_boot_counts():
    lines = ef.parse_engram_boot_lines(LOG)
    assert [(e.layer, e.packed, e.boot) for e in lines] == [(1, False, 1), (14, False, 1), (1, True, 2),
                                                           (14, True, 2)]
    boots, found = ef.last_boot_packed(LOG, 1, [1, 14])
    assert boots == 2 and found[1].packed is True and (found[14].lo, found[14].hi) == (32000, 64000)
    # a last boot that printed only layer 1: layer 14 is unknown, not the old boot's value
    boots, found = ef.last_boot_packed(LOG + LOG.splitlines()[5] .replace("True", "False") + "\n", 1, [1, 14])
    assert boots == 3 and found[1].packed is False and found[14] is None
    # another rank's lines are ignored, and a log without lines reports nothing
    assert ef.last_boot_packed(LOG, 0, [1, 14])[1] == {1: None, 14: None}
    assert ef.last_boot_packed("no engram here\n", 1, [1]) == (0, {1: None})


def test_boot_log_start_lines_open_boots():
    boot = ("dsv41 boot: rank=1 tp=3\n"
            "Exact nvme Engram layer=1 rank=1 rows=[40001,80002) cache=0.0GiB packed=True\n"
            "Exact nvme Engram layer=14 rank=1 rows=[32000,64000) cache=0.0GiB packed=True\n")
    assert ef.last_boot_packed(boot, 1, [1, 14])[0] == 1
    # a later boot that died before its Engram lines: nothing is known about the last boot
    crashed = boot + "Starting DSV41 rank 1 of 3\nNV_ERR_NO_MEMORY\n"
    assert ef.last_boot_packed(crashed, 1, [1, 14]) == (2, {1: None, 14: None})
    # start lines of several ranks before any Engram line belong to one boot
    two = "dsv41 boot: rank=0 tp=3\ndsv41 boot: rank=1 tp=3\n" + boot.split("\n", 1)[1]
    boots, found = ef.last_boot_packed(two, 1, [1, 14])
    assert boots == 1 and found[1].packed and found[14].packed
