# -*- coding: utf-8 -*-
"""Low-level IO of the Engram packer: exact reads, vectored row IO, page-cache advice, writeback.

Where the packer's time goes, and why it is done this way (docs/packing.md, "Speed"):
- The source is read with ``O_DIRECT`` into page-aligned buffers, one contiguous read of a chunk's weight
  rows and one of its scale rows: the device writes straight into our memory, so reading costs no kernel
  copy, no page-cache insertion and eviction, no readahead and no ``posix_fadvise`` calls, and the source
  never occupies the page cache (on GB10 page cache is GPU memory). Where ``O_DIRECT`` is refused (some
  FUSE or old tmpfs mounts) the same reads go through the page cache, advised ``RANDOM`` with a half-chunk
  ``WILLNEED`` window and dropped behind.
- Rows are packed in memory (``RowBuffer.stage``) by numpy where importable, else by the kernel
  (engram_packer_interleave says how and why), and ``preadv`` scatters packed rows back into weights and
  scales when a shard is compared with its source; iovec arrays are built once per buffer and passed to
  libc through ctypes (``os.preadv`` would rebuild 1024 buffer views per call). Comparisons: ``memcmp``.
Without ctypes or on a 32-bit Python the same calls go through ``os.pwritev``/``os.preadv`` with views.

Standard library only, but for the optional numpy interleave.
"""
from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
from array import array
from typing import Callable, List, Optional, Tuple

try:
    from ansible.module_utils.engram_format import ROW_BYTES, SCALE_BYTES, WEIGHT_BYTES
    from ansible.module_utils.engram_packer_interleave import interleave_method, numpy_stage
except ImportError:  # stand-alone: the packer's files side by side
    from engram_format import ROW_BYTES, SCALE_BYTES, WEIGHT_BYTES  # type: ignore
    from engram_packer_interleave import interleave_method, numpy_stage  # type: ignore

GIB = 1 << 30
PAGE = mmap.PAGESIZE
ALIGN = 4096  # O_DIRECT alignment of offsets, lengths and buffers (covers 512 and 4096 byte sectors)
IOV_MAX = 1024  # iovecs per vectored call (Linux's UIO_MAXIOV)
IOV_ROWS = IOV_MAX // 2  # rows per vectored call with 2 iovecs each
# posix_fadvise(DONTNEED) drops only folios that lie wholly inside the range, and the page cache uses
# large folios (ext4 since 6.16, xfs, NFS): each drop therefore covers a trailing window this long up to
# the current position, so a folio that straddled one chunk boundary is dropped on a later call.
DROP_WINDOW_BYTES = 64 << 20

FADV_DONTNEED = getattr(os, "POSIX_FADV_DONTNEED", 4)
FADV_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", 3)
FADV_RANDOM = getattr(os, "POSIX_FADV_RANDOM", 1)
SFR_WAIT_BEFORE, SFR_WRITE, SFR_WAIT_AFTER = 1, 2, 4


class PackError(Exception):
    """A pack that cannot or did not complete; ``result`` carries what is known (shards, bytes)."""

    def __init__(self, msg: str, result: Optional[dict] = None):
        super().__init__(msg)
        self.msg = msg
        self.result = result if result is not None else {}


def _load_libc():
    """libc's preadv, pwritev, memcmp and sync_file_range through ctypes, or None (then os.* is used)."""
    if ctypes.sizeof(ctypes.c_void_p) != 8 or ctypes.sizeof(ctypes.c_size_t) != 8:
        return None  # the iovec arrays below are pairs of 64-bit words
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        for name in ("preadv", "pwritev"):
            func = getattr(libc, name)
            func.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64]
            func.restype = ctypes.c_ssize_t
        libc.memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        libc.memcmp.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _load_libc()


def _huge_page_bytes() -> int:
    """The transparent huge page size (2 MiB with 4 KiB pages), or 0 where unknown or too large to use."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size") as handle:
            size = int(handle.read().strip())
    except (OSError, ValueError):
        return 0
    return size if 0 < size <= (32 << 20) and hasattr(mmap, "MADV_HUGEPAGE") else 0


HUGE_PAGE = _huge_page_bytes()


def io_buffer(size: int) -> mmap.mmap:
    """Private anonymous memory for ``O_DIRECT`` transfers and the interleave: pinning a 4 KiB page per
    transfer was most of the system time (``gup_fast_fallback``), a huge page is pinned at once (about 4x
    less system CPU per GB read or written, measured). The length is rounded up to whole huge pages (so the
    kernel aligns the mapping), and only the whole huge pages of ``size`` are advised ``MADV_HUGEPAGE``: the
    tail stays in small pages, so resident memory is what is touched, as before. Private, not the default
    shared mapping: shared anonymous memory is shmem, which has no huge pages unless the admin enabled them."""
    if not HUGE_PAGE or size < HUGE_PAGE:
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
    mem = mmap.mmap(-1, size + (-size) % HUGE_PAGE, flags=mmap.MAP_PRIVATE)
    try:
        mem.madvise(mmap.MADV_HUGEPAGE, 0, size - size % HUGE_PAGE)
    except OSError:
        pass  # advisory (THP disabled, an old kernel): small pages, same bytes
    return mem


# --------------------------------------------------------------------------------- plain helpers

def pread_exact(fd: int, size: int, offset: int, what: str) -> bytes:
    parts = []
    got = 0
    while got < size:
        block = os.pread(fd, size - got, offset + got)
        if not block:
            raise PackError("%s ended early at offset %d (truncated?)." % (what, offset + got))
        parts.append(block)
        got += len(block)
    return b"".join(parts)


def pwrite_all(fd: int, view, offset: int) -> None:
    view = memoryview(view)
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


def fadvise(fd: int, offset: int, length: int, advice: int) -> None:
    try:
        os.posix_fadvise(fd, offset, length, advice)
    except (OSError, AttributeError):
        pass  # advisory: some filesystems refuse it, and it never affects correctness


def drop_behind(fd: int, floor: int, end: int) -> None:
    """Drop the cached pages of ``[max(floor, end - DROP_WINDOW_BYTES), end)`` (a range already done)."""
    start = max(floor, end - DROP_WINDOW_BYTES)
    if end > start:
        fadvise(fd, start, end - start, FADV_DONTNEED)


def drop_pages(fd: int, offset: int, length: int) -> None:
    """Drop the pages touching ``[offset, offset+length)`` (DONTNEED itself skips partly covered pages)."""
    start = offset - offset % PAGE
    end = offset + length + (-(offset + length)) % PAGE
    fadvise(fd, start, end - start, FADV_DONTNEED)


def load_sync_file_range() -> Optional[Callable[[int, int, int, int], None]]:
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


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def unlink_own(path: str) -> None:
    """Remove a leftover of ours (a name in dest; never follows it), if present."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def create_exclusive(path: str, mode: int = 0o644) -> int:
    """A new file at ``path`` opened O_CREAT|O_EXCL|O_NOFOLLOW: never an existing inode, never a link target."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)


def write_json_exclusive(path: str, doc: dict) -> None:
    """Atomically replace ``path`` with ``doc``: a fresh temporary (O_EXCL), renamed over it; a failure
    removes the temporary, so no empty temporary is ever left."""
    tmp = path + ".tmp"
    unlink_own(tmp)  # a leftover of a killed run
    fd = create_exclusive(tmp)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(doc, handle)
        os.replace(tmp, path)
    except BaseException:
        unlink_own(tmp)
        raise


# --------------------------------------------------------------------------------- row buffers

class RowBuffer:
    """Up to ``rows`` weight rows and their scale rows, each contiguous in page-aligned memory (``O_DIRECT``
    reads land in them), starting ``wdelta``/``sdelta`` bytes in (the source's offset modulo ALIGN).

    ``write_packed`` gathers them into packed rows in a file, ``read_packed`` scatters packed rows of a file
    back into them; ``same_rows`` compares two buffers."""

    def __init__(self, rows: int, staging: bool = False):
        self.rows = rows
        self.wmem = io_buffer(rows * WEIGHT_BYTES + 2 * ALIGN)
        self.smem = io_buffer(rows * SCALE_BYTES + 2 * ALIGN)
        self.wdelta = self.sdelta = 0
        self._iov_key = None
        self._iov = None  # array('Q'): (base, len) pairs, weight then scale iovec per row
        self._views: List[memoryview] = []  # fallback without libc: the same iovecs as views
        self._anchors = []
        if _LIBC is not None:
            self._anchors = [ctypes.c_char.from_buffer(self.wmem), ctypes.c_char.from_buffer(self.smem)]
            self._wbase, self._sbase = (ctypes.addressof(a) for a in self._anchors)
        # staging: packed rows assembled in memory (numpy: private memory; else a memfd's pages, mapped)
        self.pfd: Optional[int] = None
        self.pmem: Optional[mmap.mmap] = None
        self.staged: Optional[Tuple[int, int]] = None  # (delta, rows) of the packed rows now in pmem
        self._stage_key = None
        self._stage_iov = None
        self.method, self._np = "", None  # how stage() packs: numpy or kernel-gather (engram_packer_interleave)
        if staging:
            self._open_staging()

    def _open_staging(self) -> None:
        size = self.rows * ROW_BYTES + 2 * ALIGN
        size += (-size) % ALIGN
        self.method, self._np = interleave_method()
        if self._np is not None:  # numpy packs into anonymous memory
            self.pmem = io_buffer(size)
            return
        if _LIBC is None or not hasattr(os, "memfd_create"):
            return
        try:
            pfd = os.memfd_create("engram-pack", getattr(os, "MFD_CLOEXEC", 1))
        except OSError:
            return  # no memfd here (old kernel, a seccomp filter): packed rows are gathered into the file
        try:
            os.ftruncate(pfd, size)
            pmem = mmap.mmap(pfd, size)
        except OSError:
            os.close(pfd)
            return
        self.pfd, self.pmem = pfd, pmem
        self._anchors.append(ctypes.c_char.from_buffer(pmem))
        self._pbase = ctypes.addressof(self._anchors[-1])

    @property
    def can_stage(self) -> bool:
        return self.pmem is not None

    def stage(self, rows: int, delta: int) -> None:
        """Pack rows [0, rows) in ``pmem``, starting ``delta`` bytes in (a multiple of 8).

        The kernel moves the weights: ``pwritev`` into the memfd at ``delta`` writes into the very pages
        ``pmem`` maps (no page cache of any disk file, no writeback), one iovec per row, each 264 bytes long:
        the row's 256 weight bytes and 8 bytes of the next row's, which the row's scales then overwrite in
        one strided copy of 8-byte items (a memoryview assignment). With numpy, two block copies instead."""
        if self._np is not None:
            numpy_stage(self._np, self.pmem, delta, self.wmem, self.wdelta, self.smem, self.sdelta, rows)
            self.staged = (delta, rows)
            return
        key = (self.wdelta, "stage")
        if key != self._stage_key:
            base = self._wbase + self.wdelta
            iov = array("Q", bytes(16 * self.rows))
            iov[0::2] = array("Q", range(base, base + self.rows * WEIGHT_BYTES, WEIGHT_BYTES))
            iov[1::2] = array("Q", [ROW_BYTES]) * self.rows
            self._stage_iov, self._stage_key = iov, key
        address = self._stage_iov.buffer_info()[0]
        for first in range(0, rows, IOV_MAX):
            count = min(IOV_MAX, rows - first)
            pos = delta + first * ROW_BYTES
            done = _LIBC.pwritev(self.pfd, address + first * 16, count, pos)
            if done != count * ROW_BYTES:
                err = ctypes.get_errno() if done < 0 else errno.EIO
                raise OSError(err, "staging packed rows in memory: %s" % os.strerror(err))
        with memoryview(self.pmem) as whole, whole[delta:delta + rows * ROW_BYTES] as packed, \
                packed.cast("Q") as words, memoryview(self.smem) as scales_all, \
                scales_all[self.sdelta:self.sdelta + rows * SCALE_BYTES] as scales, scales.cast("Q") as items:
            words[WEIGHT_BYTES // 8::ROW_BYTES // 8] = items
        self.staged = (delta, rows)

    def packed(self) -> memoryview:
        """The staged packed rows."""
        delta, rows = self.staged
        return memoryview(self.pmem)[delta:delta + rows * ROW_BYTES]

    def close(self) -> None:
        self._anchors = []
        self._views = []
        self._iov = None
        for mem in (self.wmem, self.smem, self.pmem):
            if mem is not None:
                try:
                    mem.close()
                except BufferError:
                    pass  # a view of it is still referenced (a traceback being raised): freed with it
        if self.pfd is not None:
            os.close(self.pfd)
            self.pfd = None

    def weights(self, rows: int) -> memoryview:
        return memoryview(self.wmem)[self.wdelta:self.wdelta + rows * WEIGHT_BYTES]

    def scales(self, rows: int) -> memoryview:
        return memoryview(self.smem)[self.sdelta:self.sdelta + rows * SCALE_BYTES]

    def set_deltas(self, wdelta: int, sdelta: int) -> None:
        self.wdelta, self.sdelta = wdelta, sdelta

    def _iovecs(self):
        key = (self.wdelta, self.sdelta)
        if key != self._iov_key:  # built once per buffer (twice after a resume at an odd row)
            rows = self.rows
            if _LIBC is not None:
                iov = array("Q", bytes(32 * rows))
                iov[0::4] = array("Q", range(self._wbase + self.wdelta, self._wbase + self.wdelta + rows * WEIGHT_BYTES,
                                             WEIGHT_BYTES))
                iov[1::4] = array("Q", [WEIGHT_BYTES]) * rows
                iov[2::4] = array("Q", range(self._sbase + self.sdelta, self._sbase + self.sdelta + rows * SCALE_BYTES,
                                             SCALE_BYTES))
                iov[3::4] = array("Q", [SCALE_BYTES]) * rows
                self._iov = iov
                self._iov_addr = iov.buffer_info()[0]
            else:
                w, s = memoryview(self.wmem), memoryview(self.smem)
                self._views = []
                for i in range(rows):
                    wo, so = self.wdelta + i * WEIGHT_BYTES, self.sdelta + i * SCALE_BYTES
                    self._views += [w[wo:wo + WEIGHT_BYTES], s[so:so + SCALE_BYTES]]
            self._iov_key = key

    def write_packed(self, fd: int, rows: int, offset: int) -> None:
        """Write rows [0, rows) as packed rows at ``offset`` of ``fd``."""
        self._vectored(fd, rows, offset, write=True)

    def read_packed(self, fd: int, rows: int, offset: int, what: str) -> None:
        """Fill rows [0, rows) from the packed rows at ``offset`` of ``fd``."""
        self._vectored(fd, rows, offset, write=False, what=what)

    def _vectored(self, fd: int, rows: int, offset: int, write: bool, what: str = "") -> None:
        self._iovecs()
        for first in range(0, rows, IOV_ROWS):
            count = min(IOV_ROWS, rows - first)
            want = count * ROW_BYTES
            pos = offset + first * ROW_BYTES
            if _LIBC is not None:
                call = _LIBC.pwritev if write else _LIBC.preadv
                done = call(fd, self._iov_addr + first * 32, 2 * count, pos)
                if done < 0:
                    err = ctypes.get_errno()
                    raise OSError(err, os.strerror(err))
            else:
                views = self._views[2 * first:2 * (first + count)]
                done = os.pwritev(fd, views, pos) if write else os.preadv(fd, views, pos)
            if done != want:  # a short transfer (a signal, a full volume, end of file): finish row by row
                self._finish_short(fd, first, count, done, pos, write, what)

    def _finish_short(self, fd: int, first: int, count: int, done: int, pos: int, write: bool, what: str) -> None:
        w, s = memoryview(self.wmem), memoryview(self.smem)
        for i in range(done // ROW_BYTES, count):
            wo, so = self.wdelta + (first + i) * WEIGHT_BYTES, self.sdelta + (first + i) * SCALE_BYTES
            at = pos + i * ROW_BYTES
            skip = max(0, done - i * ROW_BYTES)
            if write:
                row = bytes(w[wo:wo + WEIGHT_BYTES]) + bytes(s[so:so + SCALE_BYTES])
                pwrite_all(fd, memoryview(row)[skip:], at + skip)
            else:
                row = pread_exact(fd, ROW_BYTES, at, what)
                w[wo:wo + WEIGHT_BYTES] = row[:WEIGHT_BYTES]
                s[so:so + SCALE_BYTES] = row[WEIGHT_BYTES:]

    def same_rows(self, other: "RowBuffer", rows: int) -> bool:
        """Do rows [0, rows) of both buffers hold the same weights and scales?"""
        if _LIBC is not None:
            return (_LIBC.memcmp(self._wbase + self.wdelta, other._wbase + other.wdelta, rows * WEIGHT_BYTES) == 0
                    and _LIBC.memcmp(self._sbase + self.sdelta, other._sbase + other.sdelta, rows * SCALE_BYTES) == 0)
        return self.weights(rows) == other.weights(rows) and self.scales(rows) == other.scales(rows)

    def first_difference(self, other: "RowBuffer", rows: int) -> int:
        """Index of the first row that differs (rows when none does); only called once a difference is known."""
        a, b, c, d = self.weights(rows), other.weights(rows), self.scales(rows), other.scales(rows)
        for i in range(rows):
            if (a[i * WEIGHT_BYTES:(i + 1) * WEIGHT_BYTES] != b[i * WEIGHT_BYTES:(i + 1) * WEIGHT_BYTES]
                    or c[i * SCALE_BYTES:(i + 1) * SCALE_BYTES] != d[i * SCALE_BYTES:(i + 1) * SCALE_BYTES]):
                return i
        return rows


def open_direct_twin(path: str, fd: int, flags: int = os.O_WRONLY, nofollow: bool = True) -> Optional[int]:
    """A second descriptor of the file ``fd`` has open, with ``O_DIRECT`` (None where the filesystem refuses
    it). Opened by name (``O_NOFOLLOW`` unless told) and checked to be the same inode: never another file."""
    if not hasattr(os, "O_DIRECT"):
        return None
    flags |= os.O_DIRECT | getattr(os, "O_CLOEXEC", 0) | (os.O_NOFOLLOW if nofollow else 0)
    try:
        dfd = os.open(path, flags)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
            return None
        raise
    have, got = os.fstat(fd), os.fstat(dfd)
    if (have.st_dev, have.st_ino) != (got.st_dev, got.st_ino):
        os.close(dfd)
        raise PackError("%s was replaced while it was being opened: remove it by hand and run again." % path)
    return dfd


class PackedOutput:
    """The partial being written: whole aligned blocks go ``O_DIRECT`` from a buffer's staged packed rows
    (no page cache, no writeback to start, wait for or drop); a head or tail that does not fill a block
    (chunks not a multiple of 512 rows, a resume at such a row, the shard's last block) goes through the
    page cache on ``fd``, and is reported so that the caller writes it back and drops it.

    Without ``O_DIRECT`` (or a staged buffer) every chunk is gathered into ``fd`` through the page cache,
    and the caller keeps the writeback pipeline (``sync_file_range``) for all of it."""

    def __init__(self, fd: int, path: str, direct: bool = True):
        self.fd = fd
        self.path = path
        self.dfd = open_direct_twin(path, fd) if direct else None

    @property
    def direct(self) -> bool:
        return self.dfd is not None

    def close(self) -> None:
        if self.dfd is not None:
            os.close(self.dfd)
            self.dfd = None

    def write(self, buf: RowBuffer, rows: int, offset: int) -> List[Tuple[int, int]]:
        """Write rows [0, rows) of ``buf`` as packed rows at ``offset``; returns the ranges (start, end)
        written through the page cache."""
        nbytes = rows * ROW_BYTES
        if self.dfd is None or buf.staged != (offset % ALIGN, rows):
            buf.write_packed(self.fd, rows, offset)
            return [(offset, offset + nbytes)]
        view = buf.packed()
        end = offset + nbytes
        first = min(end, offset + (-offset) % ALIGN)  # the first block boundary
        last = max(first, end - end % ALIGN)  # the last one
        cached = []
        if first > offset:
            pwrite_all(self.fd, view[:first - offset], offset)
            cached.append((offset, first))
        pos = first
        while pos < last and self.dfd is not None:
            try:
                done = os.pwrite(self.dfd, view[pos - offset:last - offset], pos)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                os.close(self.dfd)  # opens O_DIRECT but refuses the write: the page cache from now on
                self.dfd = None
                break
            pos += done
            if done <= 0 or pos % ALIGN:
                break  # a short write (a full volume): the rest through the page cache
        if pos < end:
            pwrite_all(self.fd, view[pos - offset:], pos)
            cached.append((pos, end))
        return cached


def same_bytes(a: mmap.mmap, a_delta: int, b: mmap.mmap, b_delta: int, nbytes: int) -> bool:
    """Do ``nbytes`` of ``a`` from ``a_delta`` and of ``b`` from ``b_delta`` match (memcmp, no copies)?"""
    if _LIBC is not None:
        pa, pb = ctypes.c_char.from_buffer(a), ctypes.c_char.from_buffer(b)
        try:
            return _LIBC.memcmp(ctypes.addressof(pa) + a_delta, ctypes.addressof(pb) + b_delta, nbytes) == 0
        finally:
            del pa, pb
    return memoryview(a)[a_delta:a_delta + nbytes] == memoryview(b)[b_delta:b_delta + nbytes]


def first_different_row(a: memoryview, b: memoryview, rows: int) -> int:
    """Index of the first packed row that differs between ``a`` and ``b`` (rows when none does)."""
    for i in range(rows):
        if a[i * ROW_BYTES:(i + 1) * ROW_BYTES] != b[i * ROW_BYTES:(i + 1) * ROW_BYTES]:
            return i
    return rows


# --------------------------------------------------------------------------------- source reads

class AlignedFile:
    """One source file read in aligned blocks with ``O_DIRECT``, or through the page cache where the
    filesystem refuses it (then advised RANDOM, prefetched half a read ahead and dropped behind)."""

    def __init__(self, path: str, floor: int, end: int, direct: bool, nofollow: bool = False):
        self.path = path
        self.floor, self.end = floor, end  # the tensor's bytes: what the page-cache fallback drops
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | (os.O_NOFOLLOW if nofollow else 0)
        self.fd = os.open(path, flags)
        self.dfd = None
        if direct and hasattr(os, "O_DIRECT"):
            try:
                self.dfd = open_direct_twin(path, self.fd, os.O_RDONLY, nofollow)
            except (OSError, PackError):
                self.dfd = None
        if self.dfd is None:
            self._buffered_setup()

    def _buffered_setup(self) -> None:
        # No kernel readahead, and no readahead marks left in our range by earlier readers (a page carrying
        # one restarts asynchronous readahead even on a RANDOM fd): drop the range first.
        fadvise(self.fd, 0, 0, FADV_RANDOM)
        fadvise(self.fd, self.floor, self.end - self.floor, FADV_DONTNEED)

    @property
    def direct(self) -> bool:
        return self.dfd is not None

    def close(self) -> None:
        for fd in (self.fd, self.dfd):
            if fd is not None:
                os.close(fd)
        self.dfd = None

    def read(self, mem: mmap.mmap, offset: int, length: int) -> int:
        """Read ``[offset, offset+length)`` into ``mem``; returns where in ``mem`` it starts."""
        delta = offset % ALIGN
        if self.dfd is not None:
            start = offset - delta
            span = delta + length
            span += (-span) % ALIGN
            try:
                got = os.preadv(self.dfd, [memoryview(mem)[:span]], start)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                os.close(self.dfd)  # O_DIRECT opens here but does not read: use the page cache from now on
                self.dfd = None
                self._buffered_setup()
                return self.read(mem, offset, length)
            if got < span:  # the end of the file (or a short read): the rest through the page cache
                have = max(0, got - delta)
                if have < length:
                    mem[delta + have:delta + length] = pread_exact(self.fd, length - have, offset + have, self.path)
                    drop_pages(self.fd, offset + have, length - have)
            return delta
        fadvise(self.fd, offset + length, length // 2, FADV_WILLNEED)
        view = memoryview(mem)[delta:delta + length]
        got = 0
        while got < length:
            n = os.preadv(self.fd, [view[got:]], offset + got)
            if n <= 0:
                raise PackError("%s ended early at offset %d (truncated?)." % (self.path, offset + got))
            got += n
        drop_behind(self.fd, self.floor, offset + length)
        return delta


class SourceReader:
    """Reads rows of one layer's weight and scale tensors into RowBuffers."""

    def __init__(self, weight_path: str, weight_offset: int, scale_path: str, scale_offset: int, n: int,
                 direct: bool = True):
        self.weight_offset, self.scale_offset = weight_offset, scale_offset
        self.weights = AlignedFile(weight_path, weight_offset, weight_offset + n * WEIGHT_BYTES, direct)
        try:
            self.scales = AlignedFile(scale_path, scale_offset, scale_offset + n * SCALE_BYTES, direct)
        except BaseException:
            self.weights.close()
            raise

    @property
    def direct(self) -> bool:
        return self.weights.direct and self.scales.direct

    def close(self) -> None:
        self.weights.close()
        self.scales.close()

    def read(self, buf: RowBuffer, first_row: int, rows: int) -> None:
        """Fill ``buf`` with rows [first_row, first_row+rows) (absolute row numbers of the layer)."""
        wdelta = self.weights.read(buf.wmem, self.weight_offset + first_row * WEIGHT_BYTES, rows * WEIGHT_BYTES)
        sdelta = self.scales.read(buf.smem, self.scale_offset + first_row * SCALE_BYTES, rows * SCALE_BYTES)
        buf.set_deltas(wdelta, sdelta)


def interleave(weights: bytes, scales: bytes, rows: int) -> bytes:
    """Packed rows from ``rows`` weight rows (256 B) and scale rows (8 B), for small inputs (tests, tools)."""
    return b"".join(weights[i * WEIGHT_BYTES:(i + 1) * WEIGHT_BYTES] + scales[i * SCALE_BYTES:(i + 1) * SCALE_BYTES]
                    for i in range(rows))
