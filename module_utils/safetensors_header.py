# -*- coding: utf-8 -*-
"""Read and validate safetensors headers without touching tensor data.

A safetensors file is: an 8-byte little-endian u64 ``n``, then ``n`` bytes of UTF-8 JSON (the header),
then the data section. The header maps tensor names to ``{"dtype", "shape", "data_offsets": [begin, end]}``
(offsets relative to the start of the data section) plus an optional ``__metadata__`` map of strings.

This module reads only the length and the header (never tensor data) and checks everything a consumer
needs to trust before it seeks into the file: the header fits the file, is strict JSON without duplicate
keys or non-finite numbers, every dtype is known, every shape is a list of non-negative integers, every
byte range matches ``numel * itemsize``, and the tensors, taken in offset order, cover the data section
exactly: the first starts at 0, each starts where the previous ends (no gap, no overlap) and the last
ends at the end of the file. These are the rules of the reference ``safetensors`` library (its
``validate``: InvalidOffset, TensorInvalidInfo, MetadataIncompleteBuffer); a header whose length prefix
is off by a few bytes, or whose offsets leave gaps, shifts every row and is refused here, as there.
Inputs must be regular files (a FIFO or device is refused without blocking on it).

Standard library only: it runs on bare fleet hosts and inside the engine container.
"""
from __future__ import annotations

import json
import os
import stat
import struct
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

# Bytes per element of every dtype the safetensors format defines (sub-byte types are not used here).
DTYPE_SIZES: Dict[str, int] = {
    "BOOL": 1,
    "U8": 1, "I8": 1,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
    "C64": 8,
}

# A real DeepSeek-V4.1-Flash shard header is a few hundred KiB (about 1,000 tensors at ~150 bytes each)
# and its index a few MiB. The reference implementation accepts headers up to 100 MiB, which costs
# 0.3-0.9 GiB to parse in Python; these caps (16x and 4x what a real checkpoint needs) keep parsing a
# header under ~64 MiB of memory and an index under ~256 MiB. Anything bigger is refused before it is read.
MAX_HEADER_BYTES = 8 * 1024 * 1024
MAX_TENSORS = 100_000
MAX_DIMS = 16
INDEX_NAME = "model.safetensors.index.json"
MAX_INDEX_BYTES = 32 * 1024 * 1024


class SafetensorsError(ValueError):
    """A safetensors file or index that cannot be trusted; the message names the file and the problem."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: Tuple[int, ...]
    begin: int  # relative to the data section
    end: int
    data_start: int  # absolute offset of the data section in the file

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def offset(self) -> int:
        """Absolute file offset of the tensor's first byte."""
        return self.data_start + self.begin

    @property
    def itemsize(self) -> int:
        return DTYPE_SIZES[self.dtype]


@dataclass
class SafetensorsHeader:
    path: str
    file_size: int
    header_len: int
    metadata: Dict[str, str] = field(default_factory=dict)
    tensors: Dict[str, TensorInfo] = field(default_factory=dict)

    @property
    def data_start(self) -> int:
        return 8 + self.header_len

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise SafetensorsError("%s: tensor %r is not in this file's header" % (self.path, name)) from None


def _no_duplicates(pairs):
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise SafetensorsError("duplicate key %r" % (key,))
        obj[key] = value
    return obj


def _no_constant(name):
    raise SafetensorsError("non-finite number %s" % name)


def _strict_json(text: str, what: str, path: str):
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except SafetensorsError as exc:
        raise SafetensorsError("%s: %s is not acceptable JSON: %s" % (path, what, exc)) from None
    except RecursionError:
        raise SafetensorsError("%s: %s is nested too deeply to be a safetensors header" % (path, what)) from None
    except ValueError as exc:
        raise SafetensorsError("%s: %s is not valid JSON: %s" % (path, what, exc)) from None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_header(raw: bytes, file_size: int, path: str = "<buffer>") -> SafetensorsHeader:
    """Validate header bytes ``raw`` (without the 8-byte length) of a file of ``file_size`` bytes."""
    header_len = len(raw)
    data_size = file_size - 8 - header_len
    if data_size < 0:
        raise SafetensorsError("%s: header of %d bytes does not fit a file of %d bytes" % (path, header_len, file_size))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SafetensorsError("%s: header is not UTF-8 (%s)" % (path, exc)) from None
    if not text.startswith("{"):
        raise SafetensorsError("%s: header does not start with '{' (not a safetensors file?)" % path)
    doc = _strict_json(text, "header", path)
    if not isinstance(doc, dict):
        raise SafetensorsError("%s: header is a JSON %s, not an object" % (path, type(doc).__name__))
    if len(doc) > MAX_TENSORS + 1:
        raise SafetensorsError("%s: header lists %d entries (limit %d)" % (path, len(doc), MAX_TENSORS))

    metadata = doc.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        raise SafetensorsError("%s: __metadata__ must map strings to strings" % path)

    data_start = 8 + header_len
    tensors: Dict[str, TensorInfo] = {}
    for name, entry in doc.items():
        where = "%s: tensor %r" % (path, name)
        if not isinstance(entry, dict):
            raise SafetensorsError("%s: entry is not an object" % where)
        unknown = set(entry) - {"dtype", "shape", "data_offsets"}
        missing = {"dtype", "shape", "data_offsets"} - set(entry)
        if missing:
            raise SafetensorsError("%s: missing %s" % (where, ", ".join(sorted(missing))))
        if unknown:
            raise SafetensorsError("%s: unexpected keys %s" % (where, ", ".join(sorted(unknown))))
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
            raise SafetensorsError("%s: unknown dtype %r" % (where, dtype))
        if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_is_int(d) and d >= 0 for d in shape):
            raise SafetensorsError("%s: shape %r is not a list of at most %d non-negative integers"
                                   % (where, shape, MAX_DIMS))
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            raise SafetensorsError("%s: data_offsets %r must be [begin, end] with 0 <= begin <= end" % (where, offsets))
        numel = 1
        for d in shape:
            numel *= d
        expected = numel * DTYPE_SIZES[dtype]
        begin, end = offsets
        if end - begin != expected:
            raise SafetensorsError("%s: data_offsets %r span %d bytes but %s%r needs %d"
                                   % (where, offsets, end - begin, dtype, shape, expected))
        if end > data_size:
            raise SafetensorsError("%s: data_offsets %r end past the data section (%d bytes; file truncated?)"
                                   % (where, offsets, data_size))
        tensors[name] = TensorInfo(name, dtype, tuple(shape), begin, end, data_start)

    # The reference's rule: in (begin, end) order the tensors tile [0, data_size) exactly.
    position = 0
    previous: Optional[TensorInfo] = None
    for info in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if info.begin < position:
            raise SafetensorsError("%s: tensors %r and %r overlap (data_offsets %d < %d)"
                                   % (path, previous.name, info.name, info.begin, position))
        if info.begin > position:
            raise SafetensorsError("%s: a gap of %d bytes before tensor %r (data_offsets start at %d, the previous "
                                   "tensor ends at %d): the offsets do not cover the data section"
                                   % (path, info.begin - position, info.name, info.begin, position))
        position = info.end
        previous = info
    if position != data_size:
        raise SafetensorsError("%s: the tensors cover %d bytes but the data section after the %d byte header is %d "
                               "bytes (header length wrong, file truncated or extended?)"
                               % (path, position, header_len, data_size))
    return SafetensorsHeader(path=path, file_size=file_size, header_len=header_len, metadata=metadata, tensors=tensors)


def read_header(path: str, max_header_bytes: int = MAX_HEADER_BYTES) -> SafetensorsHeader:
    """Read and validate the header of the safetensors file at ``path``; never reads tensor data."""
    fd, st = open_regular(path)
    try:
        file_size = st.st_size
        try:  # exact reads only: no readahead of tensor data into the page cache
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        except (OSError, AttributeError):
            pass
        if file_size < 8:
            raise SafetensorsError("%s: %d bytes, too short for a safetensors file (truncated?)" % (path, file_size))
        prefix = _pread_exact(fd, 8, 0, path)
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len == 0:
            raise SafetensorsError("%s: header length is 0" % path)
        if header_len > max_header_bytes:
            raise SafetensorsError("%s: header length %d exceeds the %d byte limit (corrupt or hostile file)"
                                   % (path, header_len, max_header_bytes))
        if header_len > file_size - 8:
            raise SafetensorsError("%s: header length %d runs past the end of the %d byte file (truncated?)"
                                   % (path, header_len, file_size))
        raw = _pread_exact(fd, header_len, 8, path)
    finally:
        os.close(fd)
    return parse_header(raw, file_size, path)


def open_regular(path: str) -> Tuple[int, os.stat_result]:
    """Open ``path`` read-only without blocking (a FIFO would hang a plain open) and return (fd, fstat);
    raise SafetensorsError unless it is a regular file. Symlinks are followed (a Hugging Face cache links
    shards to blobs); what they point at must be a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise SafetensorsError("%s: cannot open: %s" % (path, exc.strerror or exc)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SafetensorsError("%s: not a regular file (%s): replace it with the real file"
                                   % (path, _kind(st.st_mode)))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "mode 0o%o" % mode


def _pread_exact(fd: int, size: int, offset: int, path: str) -> bytes:
    chunks: List[bytes] = []
    got = 0
    while got < size:
        try:
            block = os.pread(fd, size - got, offset + got)
        except OSError as exc:
            raise SafetensorsError("%s: read error at offset %d: %s"
                                   % (path, offset + got, exc.strerror or exc)) from None
        if not block:
            raise SafetensorsError("%s: unexpected end of file at offset %d (truncated?)" % (path, offset + got))
        chunks.append(block)
        got += len(block)
    return b"".join(chunks)


def read_index(checkpoint_dir: str) -> Dict[str, str]:
    """Return the ``weight_map`` (tensor name -> shard file name) of ``model.safetensors.index.json``.

    Shard names must be plain file names inside the checkpoint directory (an index that points elsewhere,
    e.g. ``../../etc/passwd``, is refused).
    """
    if not os.path.isdir(checkpoint_dir):
        raise SafetensorsError("checkpoint directory %s does not exist or is not a directory" % checkpoint_dir)
    path = os.path.join(checkpoint_dir, INDEX_NAME)
    if not os.path.lexists(path):
        raise SafetensorsError("%s: checkpoint index missing (No such file or directory)" % path)
    fd, st = open_regular(path)
    try:
        if st.st_size > MAX_INDEX_BYTES:
            raise SafetensorsError("%s: index of %d bytes exceeds the %d byte limit" % (path, st.st_size,
                                                                                      MAX_INDEX_BYTES))
        raw = _pread_exact(fd, st.st_size, 0, path) if st.st_size else b""
    finally:
        os.close(fd)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SafetensorsError("%s: index is not UTF-8 (%s)" % (path, exc)) from None
    doc = _strict_json(text, "index", path)
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict):
        raise SafetensorsError("%s: index has no weight_map object" % path)
    for name, shard in weight_map.items():
        if (not isinstance(shard, str) or not shard or shard in (".", "..") or "/" in shard or "\\" in shard
                or "\x00" in shard):
            raise SafetensorsError("%s: weight_map[%r] = %r is not a file name inside the checkpoint"
                                   % (path, name, shard))
    return weight_map
