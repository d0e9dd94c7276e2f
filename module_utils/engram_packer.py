#!/usr/bin/env python3
# -*- coding: utf-8 -*-
"""Pack one rank's Engram rows from a safetensors checkpoint into ``engram-l{L}-r{r}of{tp}.bin``.

Used by the ``engram_pack`` module (in-process) and, on workers that only see the checkpoint through
the ``dsv41-weights`` docker volume, as a stand-alone script inside the engine container::

    python3 engram_packer.py --checkpoint DIR --dest DIR --rank R --tp T [--layers 1,14]
        [--margin-bytes B] [--chunk-rows N] [--verify none|sample|full] [--no-resume]
        [--replace-invalid] [--nice] [--check] [--host-label NAME] [--json]

The last stdout line is one JSON object shaped like the module's result; exit 0 on success, 1 on failure.

How a shard is written (docs/reference.md sections 3 and 11):
- every number comes from the checkpoint headers (N per layer); rank r of tp owns [N*r//tp, N*(r+1)//tp);
- refuse when the bytes still to write plus a margin exceed the space an unprivileged writer has;
- rows stream in chunks through two fixed buffers (memory does not grow with the shard): weight rows are
  read with ``preadv`` straight into their interleaved slots, the 8 scale bytes of each row follow;
- a writer thread writes chunk k, starts its writeback, waits for chunk k-1 to be on disk and drops it
  from the page cache (``posix_fadvise(DONTNEED)``), so a serving node's memory is not filled with cache;
  source ranges are dropped as soon as they are read;
- ``.partial`` -> verify (header, size, sampled or all rows against the source) -> fsync -> rename to
  ``.bin`` -> fsync the directory: a ``.bin`` is complete and verified or absent, whatever kills us;
- an interrupted ``.partial`` resumes after its last chunk that still matches the source, and only when
  its ``.partial.source.json`` record names this exact source (header bytes, offsets, sizes, mtimes and
  inodes of both shard files) and the crc32 of every kept chunk still matches; otherwise it restarts;
- every file written in dest is created ``O_CREAT|O_EXCL|O_NOFOLLOW`` (a leftover of our own is unlinked
  first); a pre-existing partial that is not a regular file or has other names (``st_nlink > 1``) is
  refused: no write follows a link or lands in a file outside dest.

Standard library only (Debian's python3 on the hosts, the engine image's python3 in the container).
"""
from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import json
import os
import platform
import queue
import socket
import stat
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

try:
    from ansible.module_utils.safetensors_header import SafetensorsError, read_header, read_index
    from ansible.module_utils.engram_format import (
        EngramFormatError, HEADER_SIZE, ROW_BYTES, SCALE_BYTES, SCALE_DTYPE, SCALE_TENSOR, STATE_ABSENT,
        STATE_INVALID, STATE_PARTIAL, STATE_VALID, WEIGHT_BYTES, WEIGHT_DTYPE, WEIGHT_TENSOR, check_rank,
        decode_header, encode_header, header_problems, inspect_shard, packed_size, partial_name, progress_name,
        row_range)
except ImportError:  # stand-alone: the three files side by side (the role copies them; the container runs them)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also under python3 -I / PYTHONSAFEPATH
    from safetensors_header import SafetensorsError, read_header, read_index  # type: ignore
    from engram_format import (  # type: ignore
        EngramFormatError, HEADER_SIZE, ROW_BYTES, SCALE_BYTES, SCALE_DTYPE, SCALE_TENSOR, STATE_ABSENT,
        STATE_INVALID, STATE_PARTIAL, STATE_VALID, WEIGHT_BYTES, WEIGHT_DTYPE, WEIGHT_TENSOR, check_rank,
        decode_header, encode_header, header_problems, inspect_shard, packed_size, partial_name, progress_name,
        row_range)

GIB = 1 << 30
DEFAULT_LAYERS = (1, 14)
DEFAULT_MARGIN_BYTES = GIB
DEFAULT_CHUNK_ROWS = 16384  # 4.1 MiB of packed rows per chunk; two chunks in flight
MAX_CHUNK_ROWS = 65536  # 17 MiB per chunk: about 77 MiB peak RSS, under the 128 MiB budget
SAMPLE_ROWS = 1024  # rows compared with the source by verify=sample (first and last included)
RESUME_BACKTRACK_CHUNKS = 4
# posix_fadvise(DONTNEED) drops only folios that lie wholly inside the range, and the page cache uses
# large folios (ext4 since 6.16, xfs, NFS): each drop therefore covers a trailing window this long up to
# the current position, so a folio that straddled one chunk boundary is dropped on a later call.
DROP_WINDOW_BYTES = 64 << 20
VERIFY_MODES = ("none", "sample", "full")
PROGRESS_INTERVAL_S = 1.0
RECORD_INTERVAL_S = 0.1  # how often the partial's source record (chunk crc32s) is rewritten

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_FADV_DONTNEED = getattr(os, "POSIX_FADV_DONTNEED", 4)
_FADV_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", 3)
_FADV_RANDOM = getattr(os, "POSIX_FADV_RANDOM", 1)
_SFR_WAIT_BEFORE, _SFR_WRITE, _SFR_WAIT_AFTER = 1, 2, 4
# ioprio_set(2) syscall numbers; aarch64 is what a DGX Spark runs.
_IOPRIO_SET_NR = {"x86_64": 251, "amd64": 251, "aarch64": 30, "arm64": 30, "riscv64": 30, "i386": 289,
                  "i686": 289, "armv7l": 314, "ppc64le": 273, "ppc64": 273, "s390x": 282}
_IOPRIO_CLASS_SHIFT, _IOPRIO_CLASS_BE, _IOPRIO_CLASS_IDLE, _IOPRIO_WHO_PROCESS = 13, 2, 3, 1


class PackError(Exception):
    """A pack that cannot or did not complete; ``result`` carries what is known (shards, bytes)."""

    def __init__(self, msg: str, result: Optional[dict] = None):
        super().__init__(msg)
        self.msg = msg
        self.result = result if result is not None else {}


@dataclass
class PackOptions:
    checkpoint: str
    dest: str
    rank: int
    tp: int
    layers: List[int] = field(default_factory=lambda: list(DEFAULT_LAYERS))
    margin_bytes: int = DEFAULT_MARGIN_BYTES
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    verify: str = "sample"
    resume: bool = True
    nice: bool = True
    replace_invalid: bool = False
    check_mode: bool = False
    host: str = field(default_factory=socket.gethostname)
    progress_interval: float = PROGRESS_INTERVAL_S
    sync: str = "range"  # "range": sync_file_range pipeline; "fdatasync": one fdatasync per chunk


@dataclass
class LayerSource:
    layer: int
    n: int
    weight_path: str
    weight_offset: int  # absolute offset of row 0 of the weight tensor
    scale_path: str
    scale_offset: int
    fingerprint: dict = field(default_factory=dict)  # what a partial built from this source records


@dataclass
class ShardPlan:
    layer: int
    path: str
    partial_path: str
    progress_path: str
    lo: int
    hi: int
    n: int
    state_before: str
    reason_before: str
    action: str  # skip | write | resume | finish | replace | refuse
    resume_rows: int = 0
    held_bytes: int = 0
    resume_chunks: List[List[int]] = field(default_factory=list)  # recorded chunks kept: [start, rows, crc32]

    @property
    def rows(self) -> int:
        return self.hi - self.lo

    @property
    def size(self) -> int:
        return packed_size(self.lo, self.hi)

    @property
    def required_bytes(self) -> int:
        return 0 if self.action in ("skip", "refuse") else self.size - self.held_bytes


def fmt_bytes(n: int) -> str:
    return "%d bytes (%.2f GiB)" % (n, n / GIB)


# --------------------------------------------------------------------------------------------- inputs

def validate_options(opts: PackOptions) -> None:
    try:
        check_rank(opts.rank, opts.tp)
    except EngramFormatError as exc:
        raise PackError("Invalid rank/tp: %s." % exc) from None
    if not opts.layers:
        raise PackError("No layers given: pass the Engram layers to pack, e.g. [1, 14].")
    if any(not isinstance(x, int) or isinstance(x, bool) or x < 0 for x in opts.layers):
        raise PackError("Invalid layers %r: each must be a non-negative integer." % (opts.layers,))
    if len(set(opts.layers)) != len(opts.layers):
        raise PackError("Layers %r contain duplicates." % (opts.layers,))
    if not isinstance(opts.margin_bytes, int) or opts.margin_bytes < 0:
        raise PackError("margin_bytes=%r must be a non-negative integer." % (opts.margin_bytes,))
    if not isinstance(opts.chunk_rows, int) or not 1 <= opts.chunk_rows <= MAX_CHUNK_ROWS:
        raise PackError("chunk_rows=%r must be between 1 and %d." % (opts.chunk_rows, MAX_CHUNK_ROWS))
    if opts.verify not in VERIFY_MODES:
        raise PackError("verify=%r must be one of %s." % (opts.verify, ", ".join(VERIFY_MODES)))
    if opts.sync not in ("range", "fdatasync"):
        raise PackError("sync=%r must be range or fdatasync." % (opts.sync,))


def check_dest(dest: str, host: str) -> None:
    """Raise unless ``dest`` is a directory we may write, and not a symlink into another volume."""
    if not os.path.lexists(dest):
        raise PackError("Destination %s does not exist on %s: create the Engram directory (the engram role does) "
                        "or fix dest." % (dest, host))
    if os.path.islink(dest):
        try:
            target = os.stat(dest)
        except OSError:
            raise PackError("Destination %s on %s is a dangling symlink (-> %s): point dest at the real Engram "
                            "directory." % (dest, host, os.readlink(dest))) from None
        parent_path = os.path.dirname(os.path.abspath(dest)) or "/"
        parent = os.stat(parent_path)
        if target.st_dev != parent.st_dev:
            raise PackError("Destination %s on %s is a symlink into another volume (-> %s, st_dev %d, its parent %s "
                            "is on st_dev %d): the engine mounts dest, so point dest at the real directory on the "
                            "volume that should hold the shards." % (dest, host, os.readlink(dest), target.st_dev,
                                                                      parent_path, parent.st_dev))
    st = os.stat(dest)
    if not stat.S_ISDIR(st.st_mode):
        raise PackError("Destination %s on %s is not a directory: point dest at the Engram directory." % (dest, host))


def _dest_writable_problem(dest: str) -> Optional[str]:
    try:
        vfs = os.statvfs(dest)
    except OSError as exc:
        return "cannot statvfs: %s" % (exc.strerror or exc)
    if vfs.f_flag & getattr(os, "ST_RDONLY", 1):
        return "it is on a read-only filesystem"
    if not os.access(dest, os.W_OK | os.X_OK):
        return "this user (uid %d) may not write there" % os.geteuid()
    return None


def available_bytes(path: str) -> int:
    """Free bytes for an unprivileged writer (root's reserved blocks excluded): f_bavail * f_frsize."""
    vfs = os.statvfs(path)
    return vfs.f_bavail * vfs.f_frsize


def load_sources(checkpoint: str, layers: List[int]) -> Dict[int, LayerSource]:
    """Locate and check each layer's Engram tensors; reads only the index and safetensors headers."""
    try:
        weight_map = read_index(checkpoint)
    except SafetensorsError as exc:
        raise PackError("Cannot read the checkpoint: %s. Check the checkpoint path (or the docker volume) and "
                        "that the download is complete." % exc) from None
    headers = {}
    sources = {}
    for layer in layers:
        infos = []
        for template, dtype, width in ((WEIGHT_TENSOR, WEIGHT_DTYPE, WEIGHT_BYTES),
                                       (SCALE_TENSOR, SCALE_DTYPE, SCALE_BYTES)):
            name = template.format(layer=layer)
            fname = weight_map.get(name)
            if fname is None:
                raise PackError("Tensor %s is missing from the checkpoint index %s/model.safetensors.index.json: "
                                "is layer %d an Engram layer of this checkpoint, and is the index complete?"
                                % (name, checkpoint, layer))
            path = os.path.join(checkpoint, fname)
            if path not in headers:
                if not os.path.exists(path):
                    raise PackError("Shard %s, which the index names for %s, is missing: re-sync the checkpoint."
                                    % (path, name))
                try:
                    headers[path] = read_header(path)
                except SafetensorsError as exc:
                    raise PackError("Checkpoint shard header is unusable: %s. Re-download that shard and check it "
                                    "against the manifest; nothing was written." % exc) from None
            header = headers[path]
            if name not in header.tensors:
                raise PackError("Tensor %s is in the index but not in the header of %s: the index and the shard "
                                "disagree; re-sync the checkpoint." % (name, path))
            info = header.tensors[name]
            if info.dtype != dtype:
                raise PackError("Tensor %s in %s has dtype %s, expected %s: this is not the checkpoint the "
                                "packed format is defined for." % (name, path, info.dtype, dtype))
            if len(info.shape) != 2 or info.shape[1] != width or info.shape[0] < 1:
                raise PackError("Tensor %s in %s has shape %s, expected [N, %d] with N >= 1."
                                % (name, path, list(info.shape), width))
            infos.append((path, info))
        (wpath, winfo), (spath, sinfo) = infos
        if winfo.shape[0] != sinfo.shape[0]:
            raise PackError("Layer %d: weight has %d rows but scale has %d (%s, %s): the checkpoint is inconsistent."
                            % (layer, winfo.shape[0], sinfo.shape[0], winfo.name, sinfo.name))
        fingerprint = {"layer": layer, "n": winfo.shape[0],
                       "weight": _file_fingerprint(wpath, headers[wpath], winfo.name, winfo.offset),
                       "scale": _file_fingerprint(spath, headers[spath], sinfo.name, sinfo.offset)}
        sources[layer] = LayerSource(layer, winfo.shape[0], wpath, winfo.offset, spath, sinfo.offset, fingerprint)
    return sources


def _file_fingerprint(path: str, header, tensor: str, offset: int) -> dict:
    """Identity of one source file: its size, mtime and inode now, and the sha256 of its header bytes."""
    import hashlib
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        digest = hashlib.sha256(_pread_exact(fd, header.data_start, 0, path)).hexdigest()
    finally:
        os.close(fd)
    return {"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "dev": st.st_dev, "ino": st.st_ino,
            "header_sha256": digest, "tensor": tensor, "offset": offset}


# ------------------------------------------------------------------------------------------ low level

def _pread_exact(fd: int, size: int, offset: int, what: str) -> bytes:
    parts = []
    got = 0
    while got < size:
        block = os.pread(fd, size - got, offset + got)
        if not block:
            raise PackError("%s ended early at offset %d (truncated?)." % (what, offset + got))
        parts.append(block)
        got += len(block)
    return b"".join(parts)


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    total = len(view)
    while done < total:
        done += os.pwrite(fd, view[done:], offset + done)


def _fadvise(fd: int, offset: int, length: int, advice: int) -> None:
    try:
        os.posix_fadvise(fd, offset, length, advice)
    except (OSError, AttributeError):
        pass  # advisory: some filesystems refuse it, and it never affects correctness


def _load_sync_file_range() -> Optional[Callable[[int, int, int, int], None]]:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        func = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    func.restype = ctypes.c_int

    def call(fd: int, offset: int, nbytes: int, flags: int) -> None:
        if func(fd, offset, nbytes, flags) != 0:
            err = ctypes.get_errno()
            if err in (errno.ENOSYS, errno.EINVAL, errno.ESPIPE):
                os.fdatasync(fd)  # not supported here: fall back to the whole-file sync
            else:
                raise OSError(err, os.strerror(err))
    return call


def _drop_behind(fd: int, floor: int, end: int) -> None:
    """Drop the cached pages of ``[max(floor, end - DROP_WINDOW_BYTES), end)`` (a range already done)."""
    start = max(floor, end - DROP_WINDOW_BYTES)
    if end > start:
        _fadvise(fd, start, end - start, _FADV_DONTNEED)


def _drop_pages(fd: int, offset: int, length: int) -> None:
    """Drop the pages touching ``[offset, offset+length)`` (DONTNEED itself skips partly covered pages)."""
    start = offset - offset % _PAGE
    end = offset + length + (-(offset + length)) % _PAGE
    _fadvise(fd, start, end - start, _FADV_DONTNEED)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def interleave(weights: bytes, scales: bytes, rows: int) -> bytearray:
    """Packed rows from ``rows`` weight rows (256 B) and scale rows (8 B): 8-byte words, 32 then 1."""
    out = bytearray(rows * ROW_BYTES)
    if rows:
        oq = memoryview(out).cast("Q")
        wq = memoryview(weights)[:rows * WEIGHT_BYTES].cast("Q")
        for k in range(WEIGHT_BYTES // 8):
            oq[k::ROW_BYTES // 8] = wq[k::WEIGHT_BYTES // 8]
        oq[WEIGHT_BYTES // 8::ROW_BYTES // 8] = memoryview(scales)[:rows * SCALE_BYTES].cast("Q")
    return out


def lower_priority() -> Dict[str, str]:
    """Lowest CPU priority and best-effort/7 IO priority for this thread and the threads it starts.

    Best effort: what was applied is returned, failures are reported, never raised. Best-effort level 7
    rather than the idle class: under BFQ the idle class can starve the pack for as long as the engine
    keeps reading its shards; with the ``none``/``mq-deadline`` schedulers usual on NVMe neither applies.
    """
    applied = {}
    try:
        current = os.getpriority(os.PRIO_PROCESS, 0)
        if current < 19:
            os.nice(19 - current)
        applied["nice"] = str(os.getpriority(os.PRIO_PROCESS, 0))
    except OSError as exc:
        applied["nice"] = "unchanged (%s)" % (exc.strerror or exc)
    number = _IOPRIO_SET_NR.get(platform.machine().lower())
    if number is None:
        applied["ioprio"] = "unchanged (no ioprio_set number for %s)" % platform.machine()
        return applied
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        value = (_IOPRIO_CLASS_BE << _IOPRIO_CLASS_SHIFT) | 7
        if libc.syscall(number, _IOPRIO_WHO_PROCESS, 0, value) == 0:
            applied["ioprio"] = "best-effort/7"
        else:
            applied["ioprio"] = "unchanged (%s)" % os.strerror(ctypes.get_errno())
    except (OSError, AttributeError) as exc:
        applied["ioprio"] = "unchanged (%s)" % exc
    return applied


# ------------------------------------------------------------------------ files written in dest

def source_record_path(partial_path: str) -> str:
    return partial_path + ".source.json"


def _unlink_own(path: str) -> None:
    """Remove a leftover of ours (a name in dest; never follows it), if present."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def create_exclusive(path: str, mode: int = 0o644) -> int:
    """A new file at ``path`` opened O_CREAT|O_EXCL|O_NOFOLLOW: never an existing inode, never a link target."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)


def _write_json_exclusive(path: str, doc: dict) -> None:
    """Atomically replace ``path`` with ``doc``: a fresh temporary (O_EXCL), renamed over it; a failure
    removes the temporary, so no empty temporary is ever left."""
    tmp = path + ".tmp"
    _unlink_own(tmp)  # a leftover of a killed run
    fd = create_exclusive(tmp)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(doc, handle)
        os.replace(tmp, path)
    except BaseException:
        _unlink_own(tmp)
        raise


def write_source_record(partial_path: str, source: LayerSource, lo: int, hi: int, chunks: List[List[int]]) -> None:
    """Record which source a partial is built from and the crc32 of each durable chunk [start, rows, crc]."""
    _write_json_exclusive(source_record_path(partial_path),
                          {"version": 1, "lo": lo, "hi": hi, "source": source.fingerprint, "chunks": chunks})


def _recorded_rows(pfd: int, plan: "ShardPlan", source: LayerSource) -> Tuple[int, List[List[int]], str]:
    """Rows of the partial its source record vouches for: the record must name this source and range, and
    each recorded chunk, from row 0 on, must still have its crc32. Returns (rows, chunks kept, why not more)."""
    path = source_record_path(plan.partial_path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return 0, [], "its source record is not a regular file"
            doc = json.loads(_pread_exact(fd, min(os.fstat(fd).st_size, 16 << 20), 0, path) or b"null")
        finally:
            os.close(fd)
    except FileNotFoundError:
        return 0, [], "it has no source record (%s)" % os.path.basename(path)
    except (OSError, ValueError, PackError) as exc:
        return 0, [], "its source record is unreadable (%s)" % exc
    if not isinstance(doc, dict) or doc.get("version") != 1:
        return 0, [], "its source record is not one this packer wrote"
    if doc.get("source") != source.fingerprint or (doc.get("lo"), doc.get("hi")) != (plan.lo, plan.hi):
        old = doc.get("source") if isinstance(doc.get("source"), dict) else {}
        changed = [k for k in ("weight", "scale") if old.get(k) != source.fingerprint[k]]
        return 0, [], "the checkpoint changed since it was written (%s)" % (
            ", ".join("%s file %s" % (k, source.fingerprint[k]["path"]) for k in changed) or "row range")
    rows, kept = 0, []
    for chunk in doc.get("chunks") or []:
        if not (isinstance(chunk, list) and len(chunk) == 3 and all(_is_uint(x) for x in chunk)) or chunk[0] != rows \
                or chunk[1] < 1 or rows + chunk[1] > plan.rows:
            break
        start, count, crc = chunk
        try:
            data = _pread_exact(pfd, count * ROW_BYTES, HEADER_SIZE + start * ROW_BYTES, plan.partial_path)
        except PackError:
            break
        _fadvise(pfd, HEADER_SIZE + start * ROW_BYTES, count * ROW_BYTES, _FADV_DONTNEED)
        if zlib.crc32(data) != crc:
            break
        rows += count
        kept.append(chunk)
    return rows, kept, ""


def _is_uint(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_own_file(path: str, host: str, what: str) -> None:
    """Refuse a pre-existing file in dest that is not a plain file of ours (a link, a FIFO, a directory, or
    a regular file with other names: writing to it would change a file outside dest)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise PackError("%s on %s exists but is not a regular file (a link or special file): remove it by hand; the "
                        "packer will not write through it." % (path, host))
    if st.st_nlink > 1:
        raise PackError("%s on %s has %d names (a hard link to a file elsewhere?): the packer never writes to a file "
                        "with other names; remove this name by hand (the other names keep the data) and run again."
                        % (path, host, st.st_nlink))
    del what


# ------------------------------------------------------------------------------------------- planning

def _tail_matches(pfd: int, src_fds: Tuple[int, int], source: LayerSource, lo: int, start: int, rows: int) -> bool:
    """Do packed rows [start, start+rows) (relative to lo) in the partial equal the source?"""
    wfd, sfd = src_fds
    got = _pread_exact(pfd, rows * ROW_BYTES, HEADER_SIZE + start * ROW_BYTES, "partial")
    weights = _pread_exact(wfd, rows * WEIGHT_BYTES, source.weight_offset + (lo + start) * WEIGHT_BYTES, "source")
    scales = _pread_exact(sfd, rows * SCALE_BYTES, source.scale_offset + (lo + start) * SCALE_BYTES, "source")
    return got == interleave(weights, scales, rows)


def _resumable_rows(plan: ShardPlan, source: LayerSource, chunk_rows: int) -> Tuple[int, bool, str]:
    """Rows of the partial that can be kept, whether its header can be kept, and why.

    The partial is kept up to the end of its last chunk that still matches the source, looking back at
    most RESUME_BACKTRACK_CHUNKS chunks (data after a crash may be torn or never reached the disk).
    """
    try:
        pfd = os.open(plan.partial_path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        return 0, False, "cannot open the partial (%s); restarting" % (exc.strerror or exc)
    fds = []
    try:
        size = os.fstat(pfd).st_size
        if size < HEADER_SIZE:
            return 0, False, "partial is shorter than its header; restarting"
        header = decode_header(_pread_exact(pfd, HEADER_SIZE, 0, "partial"))
        problems = header_problems(header, plan.layer, plan.lo, plan.hi, plan.n)
        if problems:
            return 0, False, "partial is for another range (%s); restarting" % "; ".join(problems)
        rows = min((size - HEADER_SIZE) // ROW_BYTES, plan.rows)
        recorded, plan.resume_chunks, why_not = _recorded_rows(pfd, plan, source)
        if why_not:
            return 0, False, "partial not resumed: %s; restarting from row 0" % why_not
        rows = min(rows, recorded)
        if rows == 0:
            return 0, True, "partial holds no chunk that matches its record; continuing from row 0"
        fds = [os.open(source.weight_path, os.O_RDONLY), os.open(source.scale_path, os.O_RDONLY)]
        for fd in fds + [pfd]:
            _fadvise(fd, 0, 0, _FADV_RANDOM)
        candidate = rows
        for _ in range(RESUME_BACKTRACK_CHUNKS):
            check = min(chunk_rows, candidate)
            if _tail_matches(pfd, (fds[0], fds[1]), source, plan.lo, candidate - check, check):
                plan.resume_chunks = [c for c in plan.resume_chunks if c[0] + c[1] <= candidate]
                candidate = sum(c[1] for c in plan.resume_chunks)
                return candidate, True, "resumable at row %d of %d" % (candidate, plan.rows)
            candidate -= check
            if candidate == 0:
                break
        return 0, True, "partial does not match the source near its end (%d rows); restarting from row 0" % rows
    except (OSError, PackError) as exc:
        return 0, False, "cannot verify the partial (%s); restarting" % exc
    finally:
        for fd in fds:
            _fadvise(fd, 0, 0, _FADV_DONTNEED)
            os.close(fd)
        _fadvise(pfd, 0, 0, _FADV_DONTNEED)
        os.close(pfd)


def plan_shard(opts: PackOptions, source: LayerSource) -> ShardPlan:
    lo, hi = row_range(source.n, opts.rank, opts.tp)
    state = inspect_shard(opts.dest, source.layer, opts.rank, opts.tp, source.n)
    plan = ShardPlan(layer=source.layer, path=state.path,
                     partial_path=os.path.join(opts.dest, partial_name(source.layer, opts.rank, opts.tp)),
                     progress_path=os.path.join(opts.dest, progress_name(source.layer, opts.rank, opts.tp)),
                     lo=lo, hi=hi, n=source.n, state_before=state.state, reason_before=state.reason, action="write")
    _check_own_file(plan.partial_path, opts.host, "partial")
    if state.state == STATE_VALID:
        plan.action = "skip"
        if state.partial_path:
            plan.reason_before = "valid; a stale %s is left in place" % os.path.basename(state.partial_path)
        return plan
    if state.state == STATE_INVALID:
        plan.action = "replace" if opts.replace_invalid else "refuse"
    if state.partial_path and state.state in (STATE_PARTIAL, STATE_INVALID):
        if opts.resume:
            plan.resume_rows, keep_header, why = _resumable_rows(plan, source, opts.chunk_rows)
            if keep_header:
                plan.held_bytes = HEADER_SIZE + plan.resume_rows * ROW_BYTES
        else:
            why = "resume disabled; restarting from row 0"
        if state.state == STATE_PARTIAL:
            plan.reason_before = why
            if plan.held_bytes:
                plan.action = "finish" if plan.resume_rows == plan.rows else "resume"
    return plan


# ------------------------------------------------------------------------------------------ streaming

class _Progress:
    """Atomically rewritten ``*.progress.json`` next to the partial, for a play polling an async task."""

    def __init__(self, plan: ShardPlan, opts: PackOptions):
        self.plan = plan
        self.opts = opts
        self.started = time.time()
        self.start_rows = plan.resume_rows
        self.rows_done = plan.resume_rows
        self.last_write = 0.0
        self.lock = threading.Lock()

    def _doc(self, state: str, error: str = "") -> dict:
        elapsed = max(time.time() - self.started, 1e-9)
        written = (self.rows_done - self.start_rows) * ROW_BYTES
        rate = written / elapsed
        remaining = (self.plan.rows - self.rows_done) * ROW_BYTES
        doc = {"state": state, "host": self.opts.host, "pid": os.getpid(), "layer": self.plan.layer,
               "rank": self.opts.rank, "tp": self.opts.tp, "path": self.plan.path,
               "partial_path": self.plan.partial_path, "rows_done": self.rows_done, "rows_total": self.plan.rows,
               "resumed_from_row": self.start_rows,
               "percent": round(100.0 * self.rows_done / self.plan.rows, 2) if self.plan.rows else 100.0,
               "bytes_done": HEADER_SIZE + self.rows_done * ROW_BYTES, "bytes_total": self.plan.size,
               "bytes_per_s": int(rate), "eta_s": round(remaining / rate, 1) if rate > 0 else None,
               "elapsed_s": round(elapsed, 3), "started": self.started, "updated": time.time()}
        if error:
            doc["error"] = error
        return doc

    def update(self, rows_done: int, force: bool = False, state: str = "running", error: str = "") -> None:
        with self.lock:
            self.rows_done = rows_done
            now = time.monotonic()
            if not force and now - self.last_write < self.opts.progress_interval:
                return
            self.last_write = now
            try:  # a fresh O_EXCL|O_NOFOLLOW temporary, removed again if the write fails
                _write_json_exclusive(self.plan.progress_path, self._doc(state, error))
            except OSError:
                pass  # progress is advisory (and may itself hit ENOSPC): never fail the pack for it


class _Writer(threading.Thread):
    """Writes chunks, keeps one chunk of writeback in flight, drops completed chunks from the cache."""

    def __init__(self, fd: int, buffers: list, sync: str, on_durable: Callable[[int, list], None]):
        super().__init__(name="engram-writer", daemon=True)
        self.fd = fd
        self.buffers = buffers
        self.todo: "queue.Queue" = queue.Queue()
        self.free: "queue.Queue" = queue.Queue()
        for index in range(len(buffers)):
            self.free.put(index)
        self.sync_range = _load_sync_file_range() if sync == "range" else None
        self.on_durable = on_durable
        self.error: Optional[BaseException] = None

    def _durable(self, offset: int, nbytes: int, rows_end: int, chunk: list, wait: bool) -> None:
        if self.sync_range is not None and wait:
            self.sync_range(self.fd, offset, nbytes, _SFR_WAIT_BEFORE | _SFR_WRITE | _SFR_WAIT_AFTER)
        elif self.sync_range is None:
            os.fdatasync(self.fd)
        # everything written so far is on disk and nothing after it is dirty: drop to the end of file
        # (length 0), which also takes the large folio straddling the end of this chunk
        _fadvise(self.fd, max(0, offset + nbytes - DROP_WINDOW_BYTES), 0, _FADV_DONTNEED)
        self.on_durable(rows_end, chunk)

    def run(self) -> None:
        pending = None
        while True:
            item = self.todo.get()
            if item is None:
                break
            index, nbytes, offset, rows_end = item[:4]
            chunk = item[4]
            if self.error is None:
                try:
                    if self.sync_range is not None:
                        # chunk k-1 is on disk and out of the cache before chunk k enters it: at most one
                        # chunk of the destination is ever cached, and its writeback overlaps the next read
                        if pending is not None:
                            self._durable(*pending, wait=True)
                        _pwrite_all(self.fd, memoryview(self.buffers[index].data)[:nbytes], offset)
                        self.sync_range(self.fd, offset, nbytes, _SFR_WRITE)
                        pending = (offset, nbytes, rows_end, chunk)
                    else:
                        _pwrite_all(self.fd, memoryview(self.buffers[index].data)[:nbytes], offset)
                        self._durable(offset, nbytes, rows_end, chunk, wait=False)
                except BaseException as exc:  # handed to the reading thread, which raises it
                    self.error = exc
            self.free.put(index)
        if pending is not None and self.error is None:
            try:
                self._durable(*pending, wait=True)
            except BaseException as exc:
                self.error = exc


class _ChunkBuffer:
    """One packed chunk plus the iovec lists that scatter weight rows into it (built once, reused)."""

    def __init__(self, rows: int, iov_max: int):
        self.data = bytearray(rows * ROW_BYTES)
        view = memoryview(self.data)
        self.iov_max = iov_max
        self.groups = [[view[i * ROW_BYTES:i * ROW_BYTES + WEIGHT_BYTES] for i in range(g, min(g + iov_max, rows))]
                       for g in range(0, rows, iov_max)]


class _SourceReader:
    """Reads packed chunks from the checkpoint with a bounded window of source pages in the cache.

    The fds are FADV_RANDOM, so the kernel's readahead never runs ahead into the cache; instead the
    reader asks for the next ``lookahead`` bytes of weights itself (WILLNEED: asynchronous, large
    requests) and drops every group of rows from the cache as soon as it is in our buffer. At any time
    the source holds at most about ``lookahead`` + one group of pages in the cache.
    """

    def __init__(self, source: LayerSource, plan: ShardPlan, chunk_rows: int, iov_max: int):
        self.source = source
        self.iov_max = iov_max
        self.wfd = os.open(source.weight_path, os.O_RDONLY)
        self.sfd = os.open(source.scale_path, os.O_RDONLY)
        self.lookahead = max(iov_max * WEIGHT_BYTES, chunk_rows * WEIGHT_BYTES // 2)
        self.weight_end = source.weight_offset + plan.hi * WEIGHT_BYTES
        self.prefetched = source.weight_offset + (plan.lo + plan.resume_rows) * WEIGHT_BYTES
        # No kernel readahead, and no readahead marks left in our range by earlier readers (a page
        # carrying one restarts asynchronous readahead even on a RANDOM fd): drop the range first.
        for fd, offset, width in ((self.wfd, source.weight_offset, WEIGHT_BYTES),
                                  (self.sfd, source.scale_offset, SCALE_BYTES)):
            _fadvise(fd, 0, 0, _FADV_RANDOM)
            _fadvise(fd, offset + (plan.lo + plan.resume_rows) * width, (plan.rows - plan.resume_rows) * width,
                     _FADV_DONTNEED)

    def close(self) -> None:
        for fd in (self.wfd, self.sfd):
            os.close(fd)

    def _prefetch(self, upto: int) -> None:
        target = min(self.weight_end, upto + self.lookahead)
        if target > self.prefetched:
            _fadvise(self.wfd, self.prefetched, target - self.prefetched, _FADV_WILLNEED)
            self.prefetched = target

    def read_chunk(self, buf: _ChunkBuffer, scales: bytearray, first_row: int, rows: int) -> None:
        """Fill ``buf`` with packed rows [first_row, first_row+rows) (absolute row numbers)."""
        source, wfd, sfd, iov_max = self.source, self.wfd, self.sfd, self.iov_max
        soff = source.scale_offset + first_row * SCALE_BYTES
        _fadvise(sfd, soff, rows * SCALE_BYTES, _FADV_WILLNEED)
        for g in range((rows + iov_max - 1) // iov_max):
            group = buf.groups[g]
            count = min(iov_max, rows - g * iov_max)
            if count < len(group):
                group = group[:count]
            offset = source.weight_offset + (first_row + g * iov_max) * WEIGHT_BYTES
            self._prefetch(offset + count * WEIGHT_BYTES)
            got = os.preadv(wfd, group, offset)
            if got != count * WEIGHT_BYTES:
                # a short read (signal, odd filesystem): finish this group row by row
                for j in range(got // WEIGHT_BYTES, count):
                    group[j][:] = _pread_exact(wfd, WEIGHT_BYTES, offset + j * WEIGHT_BYTES, source.weight_path)
            _drop_behind(wfd, source.weight_offset, offset + count * WEIGHT_BYTES)
        sview = memoryview(scales)[:rows * SCALE_BYTES]
        got = os.preadv(sfd, [sview], soff)
        if got != len(sview):
            sview[got:] = _pread_exact(sfd, len(sview) - got, soff + got, source.scale_path)
        _drop_behind(sfd, source.scale_offset, soff + rows * SCALE_BYTES)
        oq = memoryview(buf.data)[:rows * ROW_BYTES].cast("Q")
        oq[WEIGHT_BYTES // 8::ROW_BYTES // 8] = sview.cast("Q")


def _stream(plan: ShardPlan, source: LayerSource, opts: PackOptions, pfd: int, progress: _Progress) -> List[list]:
    """Write rows [resume_rows, rows) of the partial; returns the crc32 record of every chunk it holds."""
    chunk_rows = min(opts.chunk_rows, max(plan.rows, 1))
    try:
        iov_max = min(1024, os.sysconf("SC_IOV_MAX"))
    except (ValueError, OSError):
        iov_max = 1024
    buffers = [_ChunkBuffer(chunk_rows, iov_max) for _ in range(2)]
    scales = bytearray(chunk_rows * SCALE_BYTES)
    reader = _SourceReader(source, plan, chunk_rows, iov_max)
    chunks = list(plan.resume_chunks)
    last_record = [0.0]

    def on_durable(rows_end: int, chunk: list) -> None:
        # runs in the writer thread once the chunk is on disk: record its crc32, then report progress
        chunks.append(chunk)
        now = time.monotonic()
        if now - last_record[0] >= RECORD_INTERVAL_S:  # bounded rewrites; a kill re-packs at most 0.1 s more
            last_record[0] = now
            try:
                write_source_record(plan.partial_path, source, plan.lo, plan.hi, list(chunks))
            except OSError:
                pass  # the record only lags: a resume re-packs the chunks it does not list
        progress.update(rows_end - plan.lo)

    writer = _Writer(pfd, buffers, opts.sync, on_durable)
    writer.start()
    try:
        start = plan.resume_rows
        while start < plan.rows:
            rows = min(chunk_rows, plan.rows - start)
            while True:
                if writer.error is not None:
                    raise writer.error
                try:
                    index = writer.free.get(timeout=0.5)
                    break
                except queue.Empty:
                    continue
            reader.read_chunk(buffers[index], scales, plan.lo + start, rows)
            crc = zlib.crc32(memoryview(buffers[index].data)[:rows * ROW_BYTES])
            writer.todo.put((index, rows * ROW_BYTES, HEADER_SIZE + start * ROW_BYTES, plan.lo + start + rows,
                             [start, rows, crc]))
            start += rows
    finally:
        writer.todo.put(None)
        writer.join()
        reader.close()
        try:  # whatever stopped us, record every chunk that reached the disk
            write_source_record(plan.partial_path, source, plan.lo, plan.hi, list(chunks))
        except OSError:
            pass
    if writer.error is not None:
        raise writer.error
    return chunks


def _sample_indices(rows: int, count: int = SAMPLE_ROWS) -> List[int]:
    if rows <= count:
        return list(range(rows))
    return sorted({(i * (rows - 1)) // (count - 1) for i in range(count)})


def verify_shard(path: str, plan: ShardPlan, source: LayerSource, mode: str, chunk_rows: int) -> int:
    """Check header, size and rows (sampled or all) of the packed file at ``path``; returns rows compared."""
    fd = os.open(path, os.O_RDONLY)
    wfd = os.open(source.weight_path, os.O_RDONLY)
    sfd = os.open(source.scale_path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size != plan.size:
            raise PackError("%s is %d bytes after writing, expected %d." % (path, size, plan.size))
        problems = header_problems(decode_header(_pread_exact(fd, HEADER_SIZE, 0, path)),
                                   plan.layer, plan.lo, plan.hi, plan.n)
        if problems:
            raise PackError("%s has a wrong header after writing: %s." % (path, "; ".join(problems)))
        if mode == "none":
            return 0
        if mode == "sample":
            for advice_fd in (fd, wfd, sfd):
                _fadvise(advice_fd, 0, 0, _FADV_RANDOM)
            indices = _sample_indices(plan.rows)
            for i in indices:
                off = HEADER_SIZE + i * ROW_BYTES
                woff = source.weight_offset + (plan.lo + i) * WEIGHT_BYTES
                soff = source.scale_offset + (plan.lo + i) * SCALE_BYTES
                row = _pread_exact(fd, ROW_BYTES, off, path)
                want = (_pread_exact(wfd, WEIGHT_BYTES, woff, source.weight_path)
                        + _pread_exact(sfd, SCALE_BYTES, soff, source.scale_path))
                _drop_pages(fd, off, ROW_BYTES)
                _drop_pages(wfd, woff, WEIGHT_BYTES)
                _drop_pages(sfd, soff, SCALE_BYTES)
                if row != want:
                    raise PackError("%s: row %d (absolute %d) differs from the checkpoint." % (path, i, plan.lo + i))
            return len(indices)
        for start in range(0, plan.rows, chunk_rows):
            rows = min(chunk_rows, plan.rows - start)
            off = HEADER_SIZE + start * ROW_BYTES
            got = _pread_exact(fd, rows * ROW_BYTES, off, path)
            woff = source.weight_offset + (plan.lo + start) * WEIGHT_BYTES
            soff = source.scale_offset + (plan.lo + start) * SCALE_BYTES
            want = interleave(_pread_exact(wfd, rows * WEIGHT_BYTES, woff, source.weight_path),
                              _pread_exact(sfd, rows * SCALE_BYTES, soff, source.scale_path), rows)
            _fadvise(fd, off, rows * ROW_BYTES, _FADV_DONTNEED)
            _fadvise(wfd, woff, rows * WEIGHT_BYTES, _FADV_DONTNEED)
            _fadvise(sfd, soff, rows * SCALE_BYTES, _FADV_DONTNEED)
            if got != want:
                for j in range(rows):
                    if got[j * ROW_BYTES:(j + 1) * ROW_BYTES] != want[j * ROW_BYTES:(j + 1) * ROW_BYTES]:
                        raise PackError("%s: row %d (absolute %d) differs from the checkpoint."
                                        % (path, start + j, plan.lo + start + j))
        return plan.rows
    finally:
        for advice_fd in (fd, wfd, sfd):
            _fadvise(advice_fd, 0, 0, _FADV_DONTNEED)
            os.close(advice_fd)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, PackError):
        return exc.msg
    if isinstance(exc, OSError):
        return "%s%s" % (exc.strerror or exc, " (%s)" % exc.filename if exc.filename else "")
    return "%s: %s" % (type(exc).__name__, exc)


def _open_partial(plan: ShardPlan, source: LayerSource, opts: PackOptions) -> int:
    """The partial to write, opened so that no write can reach a file outside dest.

    Resume: the existing partial, opened O_NOFOLLOW and checked (regular, one name) on the open fd before
    it is cut back to its last verified chunk. Fresh: any leftover of ours is unlinked (its name only) and
    a new file is created O_CREAT|O_EXCL|O_NOFOLLOW; the source record is written before any row.
    """
    if plan.held_bytes:
        pfd = os.open(plan.partial_path, os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        st = os.fstat(pfd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(pfd)
            raise PackError("%s on %s changed while planning (now %s, %d names): remove it by hand and run again."
                            % (plan.partial_path, opts.host, "regular" if stat.S_ISREG(st.st_mode) else "special",
                               st.st_nlink))
        try:
            write_source_record(plan.partial_path, source, plan.lo, plan.hi, plan.resume_chunks)
            os.ftruncate(pfd, plan.held_bytes)  # cut whatever followed the last verified chunk
        except BaseException:
            os.close(pfd)
            raise
        return pfd
    _unlink_own(plan.partial_path)
    write_source_record(plan.partial_path, source, plan.lo, plan.hi, [])
    pfd = create_exclusive(plan.partial_path)
    try:
        _pwrite_all(pfd, memoryview(encode_header(plan.layer, plan.lo, plan.hi, plan.n)), 0)
    except BaseException:
        os.close(pfd)
        raise
    return pfd


def pack_shard(plan: ShardPlan, source: LayerSource, opts: PackOptions, record: dict) -> None:
    """Write (or finish) one shard; fills ``record`` as it goes so a failure still reports it."""
    started = time.monotonic()
    progress = _Progress(plan, opts)
    record_path = source_record_path(plan.partial_path)
    try:
        pfd = _open_partial(plan, source, opts)
    except BaseException as exc:
        record["state_after"] = STATE_PARTIAL if os.path.lexists(plan.partial_path) else STATE_ABSENT
        record["partial_rows"] = plan.resume_rows if record["state_after"] == STATE_PARTIAL else 0
        progress.update(plan.resume_rows, force=True, state="failed", error=_reason(exc))
        raise
    record["state_after"] = STATE_PARTIAL
    record["partial_rows"] = plan.resume_rows
    try:
        progress.update(plan.resume_rows, force=True)
        chunks = plan.resume_chunks
        if plan.resume_rows < plan.rows:
            chunks = _stream(plan, source, opts, pfd, progress)
        os.fsync(pfd)
        _fadvise(pfd, 0, 0, _FADV_DONTNEED)
        # the whole partial is on disk: record every chunk, so a kill during verification resumes as "finish"
        write_source_record(plan.partial_path, source, plan.lo, plan.hi, chunks)
    except BaseException as exc:
        record["partial_rows"] = progress.rows_done  # rows on disk when it stopped (the rest is torn or absent)
        progress.update(progress.rows_done, force=True, state="failed", error=_reason(exc))
        os.close(pfd)
        raise
    os.close(pfd)
    record["partial_rows"] = plan.rows
    progress.update(plan.rows, force=True, state="verifying")
    try:
        record["verified_rows"] = verify_shard(plan.partial_path, plan, source, opts.verify, opts.chunk_rows)
    except PackError as exc:
        rejected = plan.partial_path + ".rejected"
        os.replace(plan.partial_path, rejected)
        _unlink_own(record_path)
        record["state_after"] = STATE_INVALID
        record["partial_rows"] = 0
        progress.update(plan.rows, force=True, state="failed", error=exc.msg)
        raise PackError("%s Verification failed on %s; the written file is kept as %s for inspection and the next "
                        "run packs from scratch. Check the disk and the checkpoint." % (exc.msg, opts.host, rejected))
    except BaseException as exc:
        progress.update(plan.rows, force=True, state="failed", error=_reason(exc))
        raise
    try:
        os.replace(plan.partial_path, plan.path)
        record["state_after"], record["partial_rows"] = STATE_VALID, 0
        _unlink_own(record_path)
        fsync_dir(opts.dest)
    except BaseException as exc:
        progress.update(plan.rows, force=True, state="failed", error=_reason(exc))
        raise
    seconds = time.monotonic() - started
    written = plan.size - plan.held_bytes
    record.update(state_after=STATE_VALID, written_bytes=written, seconds=round(seconds, 3),
                  mb_per_s=round(written / seconds / 1e6, 1) if seconds > 0 else None)
    progress.update(plan.rows, force=True, state="done")


# ---------------------------------------------------------------------------------------------- run

def _summary(plan: ShardPlan, state: str, reason: str = "", partial_rows: Optional[int] = None) -> str:
    name = os.path.basename(plan.path)
    if state == STATE_VALID:
        return "%s: valid (%d rows, %d bytes)" % (name, plan.rows, plan.size)
    if state == STATE_PARTIAL:
        return "%s: partial (%d of %d rows)" % (name, plan.resume_rows if partial_rows is None else partial_rows,
                                                plan.rows)
    if state == STATE_INVALID:
        return "%s: invalid (%s)" % (name, reason)
    return "%s: %s" % (name, state)


def _record(plan: ShardPlan, opts: PackOptions) -> dict:
    # until a shard is written its state after is its state before: a shard never reached is not valid
    after = plan.state_before
    return {"layer": plan.layer, "path": plan.path, "partial_path": plan.partial_path,
            "progress_path": plan.progress_path, "lo": plan.lo, "hi": plan.hi, "n": plan.n, "rows": plan.rows,
            "bytes": plan.size, "state_before": plan.state_before, "reason_before": plan.reason_before,
            "state_after": after, "action": plan.action, "resume_rows": plan.resume_rows,
            "required_bytes": plan.required_bytes, "written_bytes": 0, "seconds": None, "mb_per_s": None,
            "verify": opts.verify if plan.action not in ("skip", "refuse") else "none", "verified_rows": 0,
            "partial_rows": plan.resume_rows if plan.state_before == STATE_PARTIAL else 0}


def _set_diff(result: dict, plans: List[ShardPlan], records: List[dict]) -> None:
    """``diff`` (before/after text, one line per shard) and ``summary`` (``name: before -> after``)."""
    before, after, lines = [], [], []
    for plan, rec in zip(plans, records):
        b = _summary(plan, plan.state_before, plan.reason_before)
        a = _summary(plan, rec["state_after"], plan.reason_before, rec.get("partial_rows"))
        before.append(b)
        after.append(a)
        lines.append("%s -> %s" % (b, a.split(": ", 1)[1]))
    result["diff"] = {"before": "\n".join(before) + "\n", "after": "\n".join(after) + "\n"}
    result["summary"] = lines


def pack(opts: PackOptions) -> dict:
    """Plan, check and (unless check mode) pack. Returns the result; raises PackError with ``result``."""
    result = {"changed": False, "host": opts.host, "dest": opts.dest, "checkpoint": opts.checkpoint,
              "rank": opts.rank, "tp": opts.tp, "layers": list(opts.layers), "margin_bytes": opts.margin_bytes,
              "check_mode": opts.check_mode, "shards": [], "required_bytes": 0, "available_bytes": None}

    def fail(msg: str) -> PackError:
        return PackError(msg, result)

    try:
        validate_options(opts)
        check_dest(opts.dest, opts.host)
        result["available_bytes"] = available_bytes(opts.dest)
        sources = load_sources(opts.checkpoint, opts.layers)
    except PackError as exc:
        raise fail(exc.msg) from None
    try:
        lock_fd = os.open(opts.dest, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise fail("Cannot open the destination %s on %s: %s." % (opts.dest, opts.host, exc.strerror or exc)) from None
    try:
        try:
            fcntl.flock(lock_fd, (fcntl.LOCK_SH if opts.check_mode else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise fail("Another Engram pack is running in %s on %s (the directory is locked): wait for it (see "
                           "the *.progress.json files there) and run again." % (opts.dest, opts.host)) from None
            raise
        return _pack_locked(opts, sources, result, fail)
    finally:
        os.close(lock_fd)


def _pack_locked(opts: PackOptions, sources: Dict[int, LayerSource], result: dict, fail) -> dict:
    try:
        plans = [plan_shard(opts, sources[layer]) for layer in opts.layers]
    except PackError as exc:
        raise fail(exc.msg) from None
    records = [_record(plan, opts) for plan in plans]
    if opts.check_mode:  # check mode predicts: every shard it would write ends valid
        for plan, record in zip(plans, records):
            if plan.action not in ("skip", "refuse"):
                record["state_after"] = STATE_VALID
    result["shards"] = records
    result["required_bytes"] = sum(plan.required_bytes for plan in plans)
    result["available_bytes"] = available_bytes(opts.dest)
    _set_diff(result, plans, records)
    refused = [plan for plan in plans if plan.action == "refuse"]
    if refused:
        raise fail("; ".join("%s on %s exists but is invalid: %s" % (p.path, opts.host, p.reason_before)
                             for p in refused)
                   + ". An invalid shard is never overwritten silently: move it aside, or set replace_invalid: true "
                     "(--replace-invalid) to repack it.")
    work = [plan for plan in plans if plan.action != "skip"]
    required, available = result["required_bytes"], result["available_bytes"]
    if work:
        problem = _dest_writable_problem(opts.dest)
        if problem:
            raise fail("Cannot write Engram shards to %s on %s: %s." % (opts.dest, opts.host, problem))
        if required + opts.margin_bytes > available:
            short = required + opts.margin_bytes - available
            raise fail("Not enough free space on %s for rank %d of tp %d's Engram shards in %s: %s still to write "
                       "+ margin %s > %s available; free at least %s there (e.g. stale shards of another tp) or "
                       "lower margin_bytes." % (opts.host, opts.rank, opts.tp, opts.dest, fmt_bytes(required),
                                                fmt_bytes(opts.margin_bytes), fmt_bytes(available), fmt_bytes(short)))
    result["changed"] = bool(work)
    if opts.check_mode or not work:
        result["msg"] = _message(plans, opts, done=not opts.check_mode)
        return result
    if opts.nice:
        result["priority"] = lower_priority()
    for plan, record in zip(plans, records):
        if plan.action == "skip":
            continue
        try:
            pack_shard(plan, sources[plan.layer], opts, record)
        except PackError as exc:
            _set_diff(result, plans, records)
            raise fail(exc.msg) from None
        except OSError as exc:
            if not os.path.lexists(plan.partial_path):
                record["state_after"], record["partial_rows"] = STATE_ABSENT, 0
            _set_diff(result, plans, records)
            result["available_bytes_after"] = available_bytes(opts.dest)
            if exc.errno == errno.ENOSPC:
                raise fail("No space left on %s while writing %s (%s of rank %d's shards were to be written, %s "
                           "was free before, %s is free now): free space on that volume and run again; the "
                           "partial is kept and the pack resumes from it."
                           % (opts.host, plan.partial_path, fmt_bytes(required), opts.rank, fmt_bytes(available),
                              fmt_bytes(result["available_bytes_after"]))) from None
            raise fail("I/O error on %s while packing %s: %s (%s). The partial is kept; fix the cause and run "
                       "again." % (opts.host, plan.partial_path, exc.strerror or exc,
                                   getattr(exc, "filename", None) or "")) from None
    result["available_bytes_after"] = available_bytes(opts.dest)
    _set_diff(result, plans, records)
    result["msg"] = _message(plans, opts, done=True)
    return result


def _message(plans: List[ShardPlan], opts: PackOptions, done: bool) -> str:
    work = [p for p in plans if p.action != "skip"]
    if not work:
        return "All %d Engram shards of rank %d of tp %d are valid in %s." % (len(plans), opts.rank, opts.tp,
                                                                               opts.dest)
    verb = "Packed" if done else "Would pack"
    return "%s %s for rank %d of tp %d in %s." % (
        verb, ", ".join("layer %d (%s)" % (p.layer, p.action) for p in work), opts.rank, opts.tp, opts.dest)


# ---------------------------------------------------------------------------------------------- CLI

class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message):  # one JSON failure line and exit 1, like every other failure
        print(json.dumps({"failed": True, "changed": False, "msg": "Bad arguments: %s" % message}))
        sys.exit(1)


def _layers(text: str) -> List[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("layers must be comma separated integers, e.g. 1,14") from None


def main(argv: Optional[List[str]] = None) -> int:
    parser = _ArgumentParser(description="Pack one rank's Engram shards (docs/reference.md section 3).")
    parser.add_argument("--checkpoint", required=True, help="directory holding model.safetensors.index.json")
    parser.add_argument("--dest", required=True, help="Engram directory (mounted at /engram by the engine)")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--tp", type=int, required=True)
    parser.add_argument("--layers", type=_layers, default=list(DEFAULT_LAYERS))
    parser.add_argument("--margin-bytes", type=int, default=DEFAULT_MARGIN_BYTES)
    parser.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS)
    parser.add_argument("--verify", choices=VERIFY_MODES, default="sample")
    parser.add_argument("--no-resume", dest="resume", action="store_false")
    parser.add_argument("--replace-invalid", action="store_true")
    parser.add_argument("--nice", action="store_true", help="lowest CPU priority and best-effort/7 IO priority")
    parser.add_argument("--check", action="store_true", help="plan and check only; write nothing")
    parser.add_argument("--host-label", default=None, help="host name for messages (default: this hostname)")
    parser.add_argument("--sync", choices=("range", "fdatasync"), default="range", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="print only the JSON result line")
    args = parser.parse_args(argv)
    opts = PackOptions(checkpoint=args.checkpoint, dest=args.dest, rank=args.rank, tp=args.tp, layers=args.layers,
                       margin_bytes=args.margin_bytes, chunk_rows=args.chunk_rows, verify=args.verify,
                       resume=args.resume, nice=args.nice, replace_invalid=args.replace_invalid,
                       check_mode=args.check, host=args.host_label or socket.gethostname(), sync=args.sync)
    try:
        result = pack(opts)
        result["failed"] = False
        code = 0
    except PackError as exc:
        result = dict(exc.result)
        result.update(failed=True, msg=exc.msg)
        code = 1
    except Exception as exc:  # the caller parses one JSON line whatever happens
        result = {"failed": True, "changed": False, "msg": "Unexpected packer error on %s: %s: %s"
                  % (opts.host, type(exc).__name__, exc)}
        code = 1
    if not args.json:
        for line in result.get("summary", []):
            print(line)
        print(result.get("msg", ""))
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
