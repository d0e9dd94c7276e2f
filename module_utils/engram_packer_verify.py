# -*- coding: utf-8 -*-
"""Compare packed rows on disk with the checkpoint: the verification before a shard is published, and the
check that decides how much of an interrupted partial a resume may keep.

Both read the packed file back with ``preadv`` scattered into weight and scale buffers (the kernel
de-interleaves), read the source like the writer does (``O_DIRECT``), and compare with ``memcmp``.
``verify=sample`` reads 1024 single rows: the pages of the next 32 are always requested ahead
(``WILLNEED``, so the device sees them together rather than one at a time); each is dropped once compared.

Standard library only.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import List, Sequence, Tuple

try:
    from ansible.module_utils.engram_format import (HEADER_SIZE, ROW_BYTES, SCALE_BYTES, WEIGHT_BYTES,
                                                    decode_header, header_problems)
    from ansible.module_utils.engram_packer_io import (
        ALIGN, FADV_DONTNEED, FADV_RANDOM, FADV_WILLNEED, PackError, RowBuffer, SourceReader, AlignedFile,
        drop_behind, drop_pages, fadvise, first_different_row, io_buffer, pread_exact, same_bytes)
except ImportError:  # stand-alone: the packer's files side by side
    from engram_format import (HEADER_SIZE, ROW_BYTES, SCALE_BYTES, WEIGHT_BYTES,  # type: ignore
                               decode_header, header_problems)
    from engram_packer_io import (  # type: ignore
        ALIGN, FADV_DONTNEED, FADV_RANDOM, FADV_WILLNEED, PackError, RowBuffer, SourceReader, AlignedFile,
        drop_behind, drop_pages, fadvise, first_different_row, io_buffer, pread_exact, same_bytes)

SAMPLE_ROWS = 1024  # rows compared with the source by verify=sample (first and last included)
SAMPLE_WINDOW = 32  # sampled rows whose pages are requested ahead (at most ~3 x 32 pages cached at once)
VERIFY_MODES = ("none", "sample", "full")


def source_reader(source) -> SourceReader:
    return SourceReader(source.weight_path, source.weight_offset, source.scale_path, source.scale_offset, source.n)


class _Comparer:
    """Compares packed rows of a file with the source, a chunk at a time.

    The source rows are read like the writer reads them (``O_DIRECT``) and packed in memory the same way
    (``RowBuffer.stage``); the packed file is read ``O_DIRECT`` too (through the page cache, advised and
    dropped behind, where refused); one ``memcmp`` per chunk. Without numpy or a memfd the packed rows are
    scattered back into weights and scales (``preadv``) and those are compared."""

    def __init__(self, fd: int, path: str, source, step: int):
        self.fd, self.path = fd, path
        self.want = RowBuffer(step, staging=True)
        self.reader = source_reader(source)
        self.packed = self.got = self.got_rows = self.pool = None
        try:
            if self.want.can_stage:
                self.packed = AlignedFile(path, HEADER_SIZE, os.fstat(fd).st_size, direct=True, nofollow=True)
                self.got = io_buffer(step * ROW_BYTES + 2 * ALIGN)
            else:
                self.got_rows = RowBuffer(step)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        for thing in (self.reader, self.want, self.packed, self.got, self.got_rows):
            if thing is not None:
                try:
                    thing.close()
                except BufferError:
                    pass  # a view of it is still referenced (a traceback being raised): freed with it

    def difference(self, lo: int, first: int, rows: int) -> int:
        """First row of [first, first+rows) (relative to ``lo``) that differs from the source, relative to
        ``first``; ``rows`` when none does. Raises PackError when the file is too short for them."""
        offset = HEADER_SIZE + first * ROW_BYTES
        nbytes = rows * ROW_BYTES
        if self.got is not None:
            # the packed file and the source are read at the same time (two requests on the device)
            if self.pool is None:
                self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engram-verify")
            pending = self.pool.submit(self.packed.read, self.got, offset, nbytes)
            try:
                self.reader.read(self.want, lo + first, rows)
                self.want.stage(rows, offset % ALIGN)
            except BaseException:
                pending.exception()  # waits: no buffer is closed under that read
                raise
            delta = pending.result()
            if same_bytes(self.want.pmem, offset % ALIGN, self.got, delta, nbytes):
                return rows
            return first_different_row(self.want.packed(), memoryview(self.got)[delta:delta + nbytes], rows)
        fadvise(self.fd, offset, nbytes, FADV_WILLNEED)  # one large read, not 512-row round trips
        try:
            self.got_rows.read_packed(self.fd, rows, offset, self.path)
        finally:
            drop_behind(self.fd, HEADER_SIZE, offset + nbytes)
        self.reader.read(self.want, lo + first, rows)
        if self.got_rows.same_rows(self.want, rows):
            return rows
        return self.got_rows.first_difference(self.want, rows)


def matching_rows(fd: int, path: str, source, lo: int, spans: Sequence[Tuple[int, int]], chunk_rows: int) -> int:
    """Rows, from the first span on, that the packed file ``fd`` holds exactly as the source has them.

    ``spans`` are (start, rows) relative to ``lo`` and contiguous from 0; comparison stops at the first span
    holding a row that differs (or that the file is too short for), and the rows before it count."""
    step = max(1, min(chunk_rows, max((n for _, n in spans), default=1)))
    comparer = _Comparer(fd, path, source, step)
    good = 0
    try:
        for start, count in spans:
            for first in range(start, start + count, step):
                rows = min(step, start + count - first)
                try:
                    if comparer.difference(lo, first, rows) != rows:
                        return good
                except PackError:
                    return good
            good = start + count
        return good
    finally:
        comparer.close()


def sample_indices(rows: int, count: int = SAMPLE_ROWS) -> List[int]:
    if rows <= count:
        return list(range(rows))
    return sorted({(i * (rows - 1)) // (count - 1) for i in range(count)})


def _verify_sample(fd: int, path: str, plan, source) -> int:
    wfd = os.open(source.weight_path, os.O_RDONLY)
    sfd = os.open(source.scale_path, os.O_RDONLY)
    try:
        for advice_fd in (wfd, sfd):
            fadvise(advice_fd, 0, 0, FADV_RANDOM)
        indices = sample_indices(plan.rows)
        where = [(HEADER_SIZE + i * ROW_BYTES, source.weight_offset + (plan.lo + i) * WEIGHT_BYTES,
                  source.scale_offset + (plan.lo + i) * SCALE_BYTES) for i in indices]
        def prefetch(k: int) -> None:
            if k < len(where):
                off, woff, soff = where[k]
                fadvise(fd, off, ROW_BYTES, FADV_WILLNEED)
                fadvise(wfd, woff, WEIGHT_BYTES, FADV_WILLNEED)
                fadvise(sfd, soff, SCALE_BYTES, FADV_WILLNEED)

        for k in range(SAMPLE_WINDOW):
            prefetch(k)
        for k, (i, (off, woff, soff)) in enumerate(zip(indices, where)):
            prefetch(k + SAMPLE_WINDOW)
            row = pread_exact(fd, ROW_BYTES, off, path)
            want = (pread_exact(wfd, WEIGHT_BYTES, woff, source.weight_path)
                    + pread_exact(sfd, SCALE_BYTES, soff, source.scale_path))
            drop_pages(fd, off, ROW_BYTES)
            drop_pages(wfd, woff, WEIGHT_BYTES)
            drop_pages(sfd, soff, SCALE_BYTES)
            if row != want:
                raise PackError("%s: row %d (absolute %d) differs from the checkpoint." % (path, i, plan.lo + i))
        return len(indices)
    finally:
        for advice_fd in (wfd, sfd):
            fadvise(advice_fd, 0, 0, FADV_DONTNEED)
            os.close(advice_fd)


def _verify_full(fd: int, path: str, plan, source, chunk_rows: int) -> int:
    step = max(1, min(chunk_rows, plan.rows))
    comparer = _Comparer(fd, path, source, step)
    try:
        for start in range(0, plan.rows, step):
            rows = min(step, plan.rows - start)
            j = comparer.difference(plan.lo, start, rows)
            if j != rows:
                raise PackError("%s: row %d (absolute %d) differs from the checkpoint."
                                % (path, start + j, plan.lo + start + j))
        return plan.rows
    finally:
        comparer.close()


def verify_shard(path: str, plan, source, mode: str, chunk_rows: int) -> int:
    """Check header, size and rows (sampled or all) of the packed file at ``path``; returns rows compared."""
    fd = os.open(path, os.O_RDONLY)
    try:
        # before the first read: a page read with readahead on carries a mark that restarts it later
        fadvise(fd, 0, 0, FADV_RANDOM)
        size = os.fstat(fd).st_size
        if size != plan.size:
            raise PackError("%s is %d bytes after writing, expected %d." % (path, size, plan.size))
        problems = header_problems(decode_header(pread_exact(fd, HEADER_SIZE, 0, path)),
                                   plan.layer, plan.lo, plan.hi, plan.n)
        if problems:
            raise PackError("%s has a wrong header after writing: %s." % (path, "; ".join(problems)))
        if mode == "none":
            return 0
        if mode == "sample":
            return _verify_sample(fd, path, plan, source)
        return _verify_full(fd, path, plan, source, chunk_rows)
    finally:
        fadvise(fd, 0, 0, FADV_DONTNEED)
        os.close(fd)
