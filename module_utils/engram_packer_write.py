# -*- coding: utf-8 -*-
"""Writing one Engram shard: the partial, the streaming pipeline, progress, and publication.

Rows stream in chunks through three fixed buffers (memory does not grow with the shard). The reading
thread fills a buffer with the chunk's weight and scale rows (``O_DIRECT``, see engram_packer_io); a
writer thread gathers them into packed rows with ``pwritev``, starts their writeback
(``sync_file_range``), then, before writing the next chunk, waits for this one to be on disk and drops it
from the page cache (``posixfadvise(DONTNEED)``), so a serving node's memory is not filled with cache and
at most one chunk of the destination is ever cached. Reading chunk k+1 overlaps the writeback of chunk k.

``.partial`` -> verify -> fsync -> rename to ``.bin`` -> fsync the directory: a ``.bin`` is complete and
verified or absent, whatever kills us. Every file written in dest is created ``O_CREAT|O_EXCL|O_NOFOLLOW``.

Standard library only.
"""
from __future__ import annotations

import os
import queue
import stat
import threading
import time
from typing import Callable, List, Optional, Tuple

try:
    from ansible.module_utils.engram_format import (
        HEADER_SIZE, ROW_BYTES, STATE_ABSENT, STATE_INVALID, STATE_PARTIAL, STATE_VALID, encode_header)
    from ansible.module_utils.engram_packer_io import (
        ALIGN, DROP_WINDOW_BYTES, FADV_DONTNEED, PAGE, SFR_WAIT_AFTER, SFR_WAIT_BEFORE, SFR_WRITE, PackedOutput,
        PackError, RowBuffer, create_exclusive, fadvise, fsync_dir, load_sync_file_range, pwrite_all, unlink_own,
        write_json_exclusive)
    from ansible.module_utils.engram_packer_plan import (
        LayerSource, PackOptions, ShardPlan, source_record_path, write_source_record)
    from ansible.module_utils.engram_packer_verify import source_reader, verify_shard
except ImportError:  # stand-alone: the packer's files side by side
    from engram_format import (  # type: ignore
        HEADER_SIZE, ROW_BYTES, STATE_ABSENT, STATE_INVALID, STATE_PARTIAL, STATE_VALID, encode_header)
    from engram_packer_io import (  # type: ignore
        ALIGN, DROP_WINDOW_BYTES, FADV_DONTNEED, PAGE, SFR_WAIT_AFTER, SFR_WAIT_BEFORE, SFR_WRITE, PackedOutput,
        PackError, RowBuffer, create_exclusive, fadvise, fsync_dir, load_sync_file_range, pwrite_all, unlink_own,
        write_json_exclusive)
    from engram_packer_plan import (  # type: ignore
        LayerSource, PackOptions, ShardPlan, source_record_path, write_source_record)
    from engram_packer_verify import source_reader, verify_shard  # type: ignore

# Chunk buffers: the writer holds one while it waits for the previous chunk's writeback, the reader fills
# the others, so a late wake-up of either thread (a loaded CPU) does not leave the disk idle. The source is
# read O_DIRECT, so a buffer read ahead costs memory (4.3 MiB), not page cache.
BUFFERS = 3
RECORD_INTERVAL_S = 0.1  # how often the partial's source record (the chunks on disk) is rewritten


def write_chunk(out: PackedOutput, buf: RowBuffer, rows: int, offset: int) -> List[Tuple[int, int]]:
    """Write rows [0, rows) of ``buf`` as packed rows at ``offset``; returns the ranges written through the
    page cache (one name, so tests can fill the disk)."""
    return out.write(buf, rows, offset)


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
                write_json_exclusive(self.plan.progress_path, self._doc(state, error))
            except OSError:
                pass  # progress is advisory (and may itself hit ENOSPC): never fail the pack for it


class _Writer(threading.Thread):
    """Writes chunks and reports each once it is on disk.

    ``O_DIRECT`` (the usual case): a chunk is on disk when its write returns; only a head or tail that
    does not fill a block went through the page cache, and is written back and dropped before the chunk
    is reported. Through the page cache (no ``O_DIRECT``): one chunk of writeback in flight
    (``sync_file_range``), each completed chunk dropped from the cache before the next one enters it."""

    def __init__(self, out: PackedOutput, buffers: list, sync: str, on_durable: Callable[[int, list], None]):
        super().__init__(name="engram-writer", daemon=True)
        self.out = out
        self.fd = out.fd
        self.buffers = buffers
        self.todo: "queue.Queue" = queue.Queue()
        self.free: "queue.Queue" = queue.Queue()
        for index in range(len(buffers)):
            self.free.put(index)
        self.sync_range = load_sync_file_range() if sync == "range" else None
        self.on_durable = on_durable
        self.error: Optional[BaseException] = None

    def _durable(self, offset: int, nbytes: int, rows_end: int, chunk: list, wait: bool) -> None:
        if self.sync_range is not None and wait:
            self.sync_range(self.fd, offset, nbytes, SFR_WAIT_BEFORE | SFR_WRITE | SFR_WAIT_AFTER)
        elif self.sync_range is None:
            os.fdatasync(self.fd)
        # everything written so far is on disk and nothing after it is dirty: drop to the end of file
        # (length 0), which also takes the large folio straddling the end of this chunk
        fadvise(self.fd, max(0, offset + nbytes - DROP_WINDOW_BYTES), 0, FADV_DONTNEED)
        self.on_durable(rows_end, chunk)

    def _settle(self, cached: List[Tuple[int, int]]) -> None:
        """Write back the ranges a direct chunk wrote through the page cache, and drop their whole pages (a
        block the next chunk completes stays cached until then)."""
        for start, end in cached:
            if self.sync_range is not None:
                self.sync_range(self.fd, start, end - start, SFR_WAIT_BEFORE | SFR_WRITE | SFR_WAIT_AFTER)
            else:
                os.fdatasync(self.fd)
            first = start - start % PAGE
            fadvise(self.fd, first, end - first, FADV_DONTNEED)  # DONTNEED skips the partly written last page

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
                    if self.out.direct:
                        self._settle(write_chunk(self.out, self.buffers[index], nbytes // ROW_BYTES, offset))
                        if self.out.direct:
                            self.on_durable(rows_end, chunk)
                        else:  # O_DIRECT was refused at the first write: this chunk is in the cache
                            self._durable(offset, nbytes, rows_end, chunk, wait=True)
                    elif self.sync_range is not None:
                        # chunk k-1 is on disk and out of the cache before chunk k enters it: at most one
                        # chunk of the destination is ever cached, and its writeback overlaps the next read
                        if pending is not None:
                            self._durable(*pending, wait=True)
                        write_chunk(self.out, self.buffers[index], nbytes // ROW_BYTES, offset)
                        self.sync_range(self.fd, offset, nbytes, SFR_WRITE)
                        pending = (offset, nbytes, rows_end, chunk)
                    else:
                        write_chunk(self.out, self.buffers[index], nbytes // ROW_BYTES, offset)
                        self._durable(offset, nbytes, rows_end, chunk, wait=False)
                except BaseException as exc:  # handed to the reading thread, which raises it
                    self.error = exc
            self.free.put(index)
        if pending is not None and self.error is None:
            try:
                self._durable(*pending, wait=True)
            except BaseException as exc:
                self.error = exc


class _Stager(threading.Thread):
    """Packs chunks read into their buffers in memory (``RowBuffer.stage``) and hands them to the writer:
    the interleave of chunk k overlaps the read of chunk k+1 and the write of chunk k-1."""

    def __init__(self, writer: _Writer, buffers: list):
        super().__init__(name="engram-stager", daemon=True)
        self.writer = writer
        self.buffers = buffers
        self.todo: "queue.Queue" = queue.Queue()
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        while True:
            item = self.todo.get()
            if item is None:
                break
            if self.error is None:
                index, nbytes, offset = item[:3]
                try:
                    self.buffers[index].stage(nbytes // ROW_BYTES, offset % ALIGN)
                except BaseException as exc:  # handed to the reading thread, which raises it
                    self.error = exc
                    exc.__traceback__ = None  # no frame keeps a view of the buffers alive
            if self.error is None:
                self.writer.todo.put(item)
            else:
                self.writer.free.put(item[0])
        self.writer.todo.put(None)


def _stream(plan: ShardPlan, source: LayerSource, opts: PackOptions, pfd: int, progress: _Progress) -> List[list]:
    """Write rows [resume_rows, rows) of the partial; returns the record of every chunk it holds on disk.

    Three threads, one chunk buffer each at a time: this one reads (``O_DIRECT``), the stager packs the
    rows in memory, the writer writes them (``O_DIRECT``). Without ``O_DIRECT`` the writer gathers the rows
    into the file itself and there is no stager."""
    chunk_rows = min(opts.chunk_rows, max(plan.rows, 1))
    buffers = [RowBuffer(chunk_rows, staging=opts.direct) for _ in range(BUFFERS)]
    out = PackedOutput(pfd, plan.partial_path, direct=opts.direct and all(b.can_stage for b in buffers))
    reader = source_reader(source)
    chunks = list(plan.resume_chunks)
    record = {"last": 0.0, "cost": 0.0}

    def on_durable(rows_end: int, chunk: list) -> None:
        # runs in the writer thread once the chunk is on disk: record it, then report progress
        chunks.append(chunk)
        now = time.monotonic()
        # bounded rewrites: every 0.1 s (a kill re-packs at most that much more), and never more than 5 %
        # of the time on it (the record lists every chunk, so it grows with the shard)
        if now - record["last"] >= max(RECORD_INTERVAL_S, 20 * record["cost"]):
            record["last"] = now
            try:
                write_source_record(plan.partial_path, source, plan.lo, plan.hi, list(chunks))
            except OSError:
                pass  # the record only lags: a resume re-packs the chunks it does not list
            record["cost"] = time.monotonic() - now
        progress.update(rows_end - plan.lo)

    writer = _Writer(out, buffers, opts.sync, on_durable)
    stager = _Stager(writer, buffers) if out.direct else None
    threads = [t for t in (writer, stager) if t is not None]
    for thread in threads:
        thread.start()
    try:
        start = plan.resume_rows
        while start < plan.rows:
            rows = min(chunk_rows, plan.rows - start)
            while True:
                for thread in threads:
                    if thread.error is not None:
                        raise thread.error
                try:
                    index = writer.free.get(timeout=0.5)
                    break
                except queue.Empty:
                    continue
            buf, offset = buffers[index], HEADER_SIZE + start * ROW_BYTES
            buf.staged = None
            reader.read(buf, plan.lo + start, rows)
            item = (index, rows * ROW_BYTES, offset, plan.lo + start + rows, [start, rows])
            (stager or writer).todo.put(item)
            start += rows
    finally:
        (stager or writer).todo.put(None)  # the stager passes it on to the writer
        for thread in threads:
            thread.join()
        out.close()
        reader.close()
        for buf in buffers:
            buf.close()
        try:  # whatever stopped us, record every chunk that reached the disk
            write_source_record(plan.partial_path, source, plan.lo, plan.hi, list(chunks))
        except OSError:
            pass
    for thread in threads:
        if thread.error is not None:
            raise thread.error
    return chunks


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
    unlink_own(plan.partial_path)
    write_source_record(plan.partial_path, source, plan.lo, plan.hi, [])
    pfd = create_exclusive(plan.partial_path)
    try:
        pwrite_all(pfd, memoryview(encode_header(plan.layer, plan.lo, plan.hi, plan.n)), 0)
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
        fadvise(pfd, 0, 0, FADV_DONTNEED)
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
        verify_started = time.monotonic()
        record["verified_rows"] = verify_shard(plan.partial_path, plan, source, opts.verify, opts.chunk_rows)
        record["verify_seconds"] = round(time.monotonic() - verify_started, 3)
    except PackError as exc:
        rejected = plan.partial_path + ".rejected"
        os.replace(plan.partial_path, rejected)
        unlink_own(record_path)
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
        unlink_own(record_path)
        fsync_dir(opts.dest)
    except BaseException as exc:
        progress.update(plan.rows, force=True, state="failed", error=_reason(exc))
        raise
    seconds = time.monotonic() - started
    written = plan.size - plan.held_bytes
    record.update(state_after=STATE_VALID, written_bytes=written, seconds=round(seconds, 3),
                  mb_per_s=round(written / seconds / 1e6, 1) if seconds > 0 else None)
    progress.update(plan.rows, force=True, state="done")


