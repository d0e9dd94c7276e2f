# -*- coding: utf-8 -*-
"""The packed Engram shard format (docs/reference.md section 3) and the state of a shard on disk.

``engram-l{L}-r{r}of{tp}.bin`` = a 4096-byte header (six little-endian u64: magic 0x31344E4531565344, layer,
lo, hi, N, 264; the rest zero) followed by rows lo..hi-1 of 264 bytes each: the row's 256 F8_E4M3 weight
bytes, then its 8 F8_E8M0 scale bytes. Rank r of tp owns rows ``[N*r//tp, N*(r+1)//tp)``.

Standard library only.
"""
from __future__ import annotations

import os
import re
import stat
import struct
from dataclasses import dataclass, asdict
from typing import Dict, List, Optional, Tuple

# The integer docs/reference.md gives. Stored little-endian it is b"DSV1EN41": docs/reference.md's gloss "bytes DSV41EN1"
# does not match it (that would be 0x314E453134565344); readers compare the integer, so the integer wins.
MAGIC = 0x31344E4531565344
MAGIC_BYTES = struct.pack("<Q", MAGIC)
HEADER_SIZE = 4096
WEIGHT_BYTES = 256
SCALE_BYTES = 8
ROW_BYTES = WEIGHT_BYTES + SCALE_BYTES  # 264
_FIELDS = struct.Struct("<6Q")

WEIGHT_TENSOR = "layers.{layer}.engram.embed.weight"
SCALE_TENSOR = "layers.{layer}.engram.embed.scale"
WEIGHT_DTYPE = "F8_E4M3"
SCALE_DTYPE = "F8_E8M0"

STATE_ABSENT = "absent"
STATE_PARTIAL = "partial"
STATE_VALID = "valid"
STATE_INVALID = "invalid"


class EngramFormatError(ValueError):
    """A packed header or a parameter that does not describe a valid shard."""


@dataclass(frozen=True)
class PackedHeader:
    magic: int
    layer: int
    lo: int
    hi: int
    n: int
    row_bytes: int
    padding_clean: bool = True

    @property
    def rows(self) -> int:
        return self.hi - self.lo

    @property
    def size(self) -> int:
        return packed_size(self.lo, self.hi)


def _check_u64(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2 ** 64:
        raise EngramFormatError("%s=%r is not an unsigned 64-bit integer" % (name, value))


def check_rank(rank: int, tp: int) -> None:
    """Raise unless ``tp >= 1`` and ``0 <= rank < tp``."""
    for name, value in (("rank", rank), ("tp", tp)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise EngramFormatError("%s=%r is not an integer" % (name, value))
    if tp < 1:
        raise EngramFormatError("tp=%d: tensor parallel size must be at least 1" % tp)
    if not 0 <= rank < tp:
        raise EngramFormatError("rank=%d is out of range for tp=%d (valid ranks: 0..%d)" % (rank, tp, tp - 1))


def row_range(n: int, rank: int, tp: int) -> Tuple[int, int]:
    """Rows ``[lo, hi)`` that rank ``rank`` of ``tp`` owns out of ``n``."""
    check_rank(rank, tp)
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise EngramFormatError("N=%r is not a non-negative integer" % (n,))
    return n * rank // tp, n * (rank + 1) // tp


def packed_size(lo: int, hi: int) -> int:
    """Exact size in bytes of a packed shard holding rows ``[lo, hi)``."""
    if hi < lo:
        raise EngramFormatError("hi=%d is below lo=%d" % (hi, lo))
    return HEADER_SIZE + (hi - lo) * ROW_BYTES


def encode_header(layer: int, lo: int, hi: int, n: int) -> bytes:
    """The 4096-byte header of the shard of ``layer`` holding rows ``[lo, hi)`` of ``n``."""
    for name, value in (("layer", layer), ("lo", lo), ("hi", hi), ("N", n)):
        _check_u64(name, value)
    if not lo <= hi <= n:
        raise EngramFormatError("row range [%d, %d) does not fit N=%d" % (lo, hi, n))
    return _FIELDS.pack(MAGIC, layer, lo, hi, n, ROW_BYTES) + bytes(HEADER_SIZE - _FIELDS.size)


def decode_header(buf: bytes) -> PackedHeader:
    """Decode the fields of a header; raises only when ``buf`` is shorter than the header."""
    if len(buf) < HEADER_SIZE:
        raise EngramFormatError("header is %d bytes, shorter than %d (truncated)" % (len(buf), HEADER_SIZE))
    magic, layer, lo, hi, n, row_bytes = _FIELDS.unpack_from(buf, 0)
    clean = not any(memoryview(buf)[_FIELDS.size:HEADER_SIZE])
    return PackedHeader(magic, layer, lo, hi, n, row_bytes, clean)


def header_problems(header: PackedHeader, layer: int, lo: int, hi: int, n: Optional[int] = None) -> List[str]:
    """Every way ``header`` differs from the expected shard (an empty list means it matches).

    ``n=None`` accepts any N but still requires ``[lo, hi)`` inside it.
    """
    problems = []
    if header.magic != MAGIC:
        problems.append("bad magic 0x%016X (expected 0x%016X)" % (header.magic, MAGIC))
        return problems
    if header.row_bytes != ROW_BYTES:
        problems.append("row size %d (expected %d)" % (header.row_bytes, ROW_BYTES))
    if header.layer != layer:
        problems.append("layer %d (expected %d)" % (header.layer, layer))
    if (header.lo, header.hi) != (lo, hi):
        problems.append("rows [%d, %d) (expected [%d, %d))" % (header.lo, header.hi, lo, hi))
    if n is not None and header.n != n:
        problems.append("N=%d (expected %d)" % (header.n, n))
    if not header.lo <= header.hi <= header.n:
        problems.append("rows [%d, %d) do not fit N=%d" % (header.lo, header.hi, header.n))
    if not header.padding_clean:
        problems.append("non-zero bytes in the header padding")
    return problems


def validate_header(buf: bytes, layer: int, lo: int, hi: int, n: Optional[int] = None) -> PackedHeader:
    """Decode ``buf`` and raise EngramFormatError naming every mismatch."""
    header = decode_header(buf)
    problems = header_problems(header, layer, lo, hi, n)
    if problems:
        raise EngramFormatError("; ".join(problems))
    return header


def shard_name(layer: int, rank: int, tp: int) -> str:
    return "engram-l%d-r%dof%d.bin" % (layer, rank, tp)


def partial_name(layer: int, rank: int, tp: int) -> str:
    return "engram-l%d-r%dof%d.partial" % (layer, rank, tp)


def progress_name(layer: int, rank: int, tp: int) -> str:
    return "engram-l%d-r%dof%d.progress.json" % (layer, rank, tp)


@dataclass
class ShardState:
    """What is on disk for one layer of one rank."""
    layer: int
    path: str
    state: str  # absent | partial | valid | invalid
    reason: str = ""
    size: Optional[int] = None
    expected_size: Optional[int] = None
    lo: Optional[int] = None
    hi: Optional[int] = None
    n: Optional[int] = None
    partial_path: Optional[str] = None
    partial_size: Optional[int] = None

    def as_dict(self) -> dict:
        return asdict(self)


def inspect_shard(dest: str, layer: int, rank: int, tp: int, n: Optional[int] = None) -> ShardState:
    """State of ``engram-l{layer}-r{rank}of{tp}.bin`` in ``dest``, reading only its header and size.

    Without ``n`` (no checkpoint at hand) the header's own N is used to derive the expected row range,
    so a shard is valid when it is self-consistent for this layer and rank; with ``n`` it must match.
    """
    path = os.path.join(dest, shard_name(layer, rank, tp))
    ppath = os.path.join(dest, partial_name(layer, rank, tp))
    partial_size = None
    try:
        pst = os.lstat(ppath)
        if stat.S_ISREG(pst.st_mode):
            partial_size = pst.st_size
    except OSError:
        pass
    result = ShardState(layer=layer, path=path, state=STATE_ABSENT,
                        partial_path=ppath if partial_size is not None else None, partial_size=partial_size)
    if n is not None:
        result.n = n
        result.lo, result.hi = row_range(n, rank, tp)
        result.expected_size = packed_size(result.lo, result.hi)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if partial_size is not None:
            result.state = STATE_PARTIAL
            rows = max(0, (partial_size - HEADER_SIZE) // ROW_BYTES)
            result.reason = "%s holds %d bytes (about %d rows); the pack was interrupted" % (
                os.path.basename(ppath), partial_size, rows)
        return result
    except OSError as exc:
        result.state, result.reason = STATE_INVALID, "cannot stat: %s" % (exc.strerror or exc)
        return result
    result.size = st.st_size
    if not stat.S_ISREG(st.st_mode):
        result.state, result.reason = STATE_INVALID, "not a regular file"
        return result
    try:
        with open(path, "rb") as handle:
            buf = handle.read(HEADER_SIZE)
    except OSError as exc:
        result.state, result.reason = STATE_INVALID, "cannot read: %s" % (exc.strerror or exc)
        return result
    if len(buf) < HEADER_SIZE:
        result.state, result.reason = STATE_INVALID, "is truncated: %d bytes, shorter than the header" % st.st_size
        return result
    header = decode_header(buf)
    if n is None:
        if header.magic == MAGIC and header.row_bytes == ROW_BYTES:
            result.n = header.n
            result.lo, result.hi = row_range(header.n, rank, tp)
            result.expected_size = packed_size(result.lo, result.hi)
        else:
            result.state = STATE_INVALID
            if header.magic != MAGIC:
                result.reason = header_problems(header, layer, 0, 0, None)[0]
            else:
                result.reason = "row size %d (expected %d)" % (header.row_bytes, ROW_BYTES)
            return result
    problems = header_problems(header, layer, result.lo, result.hi, n)
    if problems:
        result.state, result.reason = STATE_INVALID, "does not match this rank's range: " + "; ".join(problems)
        return result
    if st.st_size != result.expected_size:
        what = "is truncated" if st.st_size < result.expected_size else "is too long"
        result.state = STATE_INVALID
        result.reason = "%s: %d bytes, expected %d" % (what, st.st_size, result.expected_size)
        return result
    result.state = STATE_VALID
    return result


_BOOT_LINE = re.compile(r"Exact nvme Engram layer=(?P<layer>\d+) rank=(?P<rank>\d+) "
                        r"rows=\[(?P<lo>\d+),\s*(?P<hi>\d+)\)(?P<rest>.*?)\bpacked=(?P<packed>True|False)\b")


@dataclass
class EngramBootLine:
    layer: int
    rank: int
    lo: int
    hi: int
    packed: bool
    line: str
    lineno: int
    boot: int  # 1-based index of the boot this line belongs to


# Start of a boot: the engine's "Starting DSV41 rank R" or the testbed simulator's "dsv41 boot: rank=R".
_BOOT_START = re.compile(r"Starting DSV41 rank|dsv41 boot: rank")


def _parse_boot_lines(text: str) -> Tuple[List[EngramBootLine], int]:
    lines: List[EngramBootLine] = []
    boot = 0
    seen = set()
    for lineno, line in enumerate(text.splitlines(), 1):
        if _BOOT_START.search(line):
            if boot == 0 or seen:  # consecutive start lines of several ranks open one boot
                boot += 1
                seen = set()
            continue
        match = _BOOT_LINE.search(line)
        if not match:
            continue
        key = (int(match.group("layer")), int(match.group("rank")))
        if boot == 0 or key in seen:
            boot += 1
            seen = set()
        seen.add(key)
        lines.append(EngramBootLine(layer=key[0], rank=key[1], lo=int(match.group("lo")), hi=int(match.group("hi")),
                                    packed=match.group("packed") == "True", line=line.strip(), lineno=lineno,
                                    boot=boot))
    return lines, boot


def parse_engram_boot_lines(text: str) -> List[EngramBootLine]:
    """Every ``Exact nvme Engram layer=L rank=R rows=[lo,hi) ... packed=True|False`` line of a boot log.

    A log may hold several boots (``docker logs`` of a restarted container, an appended file). A boot
    starts at a start line (``Starting DSV41 rank R``, the simulator's ``dsv41 boot: rank=R``) or, without
    one, when a (layer, rank) already printed in the current boot appears again (the engine prints one such
    line per layer and rank per boot).
    """
    return _parse_boot_lines(text)[0]


def last_boot_packed(text: str, rank: int, layers: List[int]) -> Tuple[int, Dict[int, Optional[EngramBootLine]]]:
    """(number of boots seen, {layer: this rank's line of the LAST boot, or None if it printed none})."""
    lines, boots = _parse_boot_lines(text)
    found: Dict[int, Optional[EngramBootLine]] = {layer: None for layer in layers}
    for entry in lines:
        if entry.boot == boots and entry.rank == rank and entry.layer in found:
            found[entry.layer] = entry
    return boots, found
