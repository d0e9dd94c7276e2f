# -*- coding: utf-8 -*-
"""Planning an Engram pack: options, the checkpoint's tensors and their identity, what each shard needs
(skip, write, resume, finish, replace, refuse), the free-space inputs, and the partial's source record.

Nothing here writes a row. How a resume is decided (docs/packing.md, "Hostile input"): next to each
partial, ``engram-l{L}-r{r}of{tp}.partial.source.json`` names its source (sha256 of both files' header
bytes, tensor offsets, size, mtime, device and inode) and lists the chunks ``[start, rows]`` that were on
disk when it was last rewritten. A rerun keeps the partial only when the record names this exact source,
and only up to the end of the last recorded chunk whose rows all still equal the source byte for byte
(both are read again: the partial scattered back into weights and scales, the source ``O_DIRECT``).

Standard library only.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

try:
    from ansible.module_utils.safetensors_header import SafetensorsError, read_header, read_index
    from ansible.module_utils.engram_format import (
        EngramFormatError, HEADER_SIZE, ROW_BYTES, SCALE_BYTES, SCALE_DTYPE, SCALE_TENSOR, STATE_INVALID,
        STATE_PARTIAL, STATE_VALID, WEIGHT_BYTES, WEIGHT_DTYPE, WEIGHT_TENSOR, check_rank, decode_header,
        header_problems, inspect_shard, packed_size, partial_name, progress_name, row_range)
    from ansible.module_utils.engram_packer_io import (
        FADV_DONTNEED, FADV_RANDOM, GIB, PackError, fadvise, pread_exact, write_json_exclusive)
    from ansible.module_utils.engram_packer_verify import VERIFY_MODES, matching_rows
except ImportError:  # stand-alone: the packer's files side by side (the container runs them)
    from safetensors_header import SafetensorsError, read_header, read_index  # type: ignore
    from engram_format import (  # type: ignore
        EngramFormatError, HEADER_SIZE, ROW_BYTES, SCALE_BYTES, SCALE_DTYPE, SCALE_TENSOR, STATE_INVALID,
        STATE_PARTIAL, STATE_VALID, WEIGHT_BYTES, WEIGHT_DTYPE, WEIGHT_TENSOR, check_rank, decode_header,
        header_problems, inspect_shard, packed_size, partial_name, progress_name, row_range)
    from engram_packer_io import (  # type: ignore
        FADV_DONTNEED, FADV_RANDOM, GIB, PackError, fadvise, pread_exact, write_json_exclusive)
    from engram_packer_verify import VERIFY_MODES, matching_rows  # type: ignore

DEFAULT_LAYERS = (1, 14)
DEFAULT_MARGIN_BYTES = GIB
DEFAULT_CHUNK_ROWS = 16384  # 4.1 MiB of packed rows per chunk; three chunk buffers
MAX_CHUNK_ROWS = 65536  # 17 MiB per chunk
PROGRESS_INTERVAL_S = 1.0

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
    direct: bool = True  # O_DIRECT writes of packed rows staged in memory (the page cache where refused)


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
    resume_chunks: List[List[int]] = field(default_factory=list)  # recorded chunks kept: [start, rows]

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


def dest_writable_problem(dest: str) -> Optional[str]:
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
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        digest = hashlib.sha256(pread_exact(fd, header.data_start, 0, path)).hexdigest()
    finally:
        os.close(fd)
    return {"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "dev": st.st_dev, "ino": st.st_ino,
            "header_sha256": digest, "tensor": tensor, "offset": offset}


# ------------------------------------------------------------------------ the partial's source record

def source_record_path(partial_path: str) -> str:
    return partial_path + ".source.json"


def write_source_record(partial_path: str, source: LayerSource, lo: int, hi: int, chunks: List[List[int]]) -> None:
    """Record which source a partial is built from and the chunks [start, rows] that are on disk."""
    write_json_exclusive(source_record_path(partial_path),
                         {"version": 1, "lo": lo, "hi": hi, "source": source.fingerprint, "chunks": chunks})


def _recorded_chunks(plan: "ShardPlan", source: LayerSource) -> Tuple[List[List[int]], str]:
    """The chunks of the partial its source record lists, contiguous from row 0, when the record names this
    source and range; else ([], why not). Reads only the record (the rows are compared afterwards)."""
    path = source_record_path(plan.partial_path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return [], "its source record is not a regular file"
            doc = json.loads(pread_exact(fd, min(os.fstat(fd).st_size, 16 << 20), 0, path) or b"null")
        finally:
            os.close(fd)
    except FileNotFoundError:
        return [], "it has no source record (%s)" % os.path.basename(path)
    except (OSError, ValueError, PackError) as exc:
        return [], "its source record is unreadable (%s)" % exc
    if not isinstance(doc, dict) or doc.get("version") != 1:
        return [], "its source record is not one this packer wrote"
    if doc.get("source") != source.fingerprint or (doc.get("lo"), doc.get("hi")) != (plan.lo, plan.hi):
        old = doc.get("source") if isinstance(doc.get("source"), dict) else {}
        changed = [k for k in ("weight", "scale") if old.get(k) != source.fingerprint[k]]
        return [], "the checkpoint changed since it was written (%s)" % (
            ", ".join("%s file %s" % (k, source.fingerprint[k]["path"]) for k in changed) or "row range")
    rows, kept = 0, []
    for chunk in doc.get("chunks") or []:
        # [start, rows]; a record of an earlier version also carries a crc32, which the comparison with the
        # source below makes redundant
        if not (isinstance(chunk, list) and len(chunk) in (2, 3) and all(_is_uint(x) for x in chunk)) \
                or chunk[0] != rows or chunk[1] < 1 or rows + chunk[1] > plan.rows:
            break
        rows += chunk[1]
        kept.append([chunk[0], chunk[1]])
    return kept, ""


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

def _resumable_rows(plan: ShardPlan, source: LayerSource, chunk_rows: int) -> Tuple[int, bool, str]:
    """Rows of the partial that can be kept, whether its header can be kept, and why.

    The partial is kept up to the end of its last recorded chunk whose rows, like every row before them,
    still equal the source (data after a crash may be torn or never reached the disk; a record or a
    partial changed by someone else is caught the same way).
    """
    try:
        pfd = os.open(plan.partial_path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        return 0, False, "cannot open the partial (%s); restarting" % (exc.strerror or exc)
    try:
        fadvise(pfd, 0, 0, FADV_RANDOM)  # no readahead into the cache: only what is compared is read
        size = os.fstat(pfd).st_size
        if size < HEADER_SIZE:
            return 0, False, "partial is shorter than its header; restarting"
        header = decode_header(pread_exact(pfd, HEADER_SIZE, 0, "partial"))
        problems = header_problems(header, plan.layer, plan.lo, plan.hi, plan.n)
        if problems:
            return 0, False, "partial is for another range (%s); restarting" % "; ".join(problems)
        on_disk = min((size - HEADER_SIZE) // ROW_BYTES, plan.rows)
        chunks, why_not = _recorded_chunks(plan, source)
        if why_not:
            return 0, False, "partial not resumed: %s; restarting from row 0" % why_not
        chunks = [c for c in chunks if c[0] + c[1] <= on_disk]
        rows = matching_rows(pfd, plan.partial_path, source, plan.lo, [(c[0], c[1]) for c in chunks], chunk_rows)
        plan.resume_chunks = [c for c in chunks if c[0] + c[1] <= rows]
        if rows == 0:
            return 0, True, "partial holds no chunk that matches its record and the source; continuing from row 0"
        return rows, True, "resumable at row %d of %d" % (rows, plan.rows)
    except (OSError, PackError) as exc:
        return 0, False, "cannot verify the partial (%s); restarting" % exc
    finally:
        fadvise(pfd, 0, 0, FADV_DONTNEED)
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


