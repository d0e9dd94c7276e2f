"""Relocate stale Engram shards to an archive volume: copy, fsync, verify by size and sha256, and only
then (and only when asked) remove the source. Plain Python, standard library only.

A shard is stale when it is listed (a file, or a directory whose `engram-l*-r*of*.bin` files count) or
when it sits in the live engram dir but belongs to another tensor-parallel size. The archive keeps the
source's absolute path under the archive dir, so provenance is never lost.

Nothing here may delete the only copy. So: every directory below the archive root is walked with
O_NOFOLLOW and must sit on the archive root's volume (no symlink, no bind mount leads back to a source);
a copy is written into a fresh `.partial` (O_CREAT|O_EXCL|O_NOFOLLOW, in the directory opened by that
walk) and renamed inside that same directory; a source is removed only after its archive copy was
re-hashed just then and matched the source's bytes, and is not the source's own inode. The `.sha256`
record beside a copy only spares the read-only plan a rehash; it never proves anything.
"""
from __future__ import annotations

import errno
import hashlib
import os
import re
import socket
import stat
from dataclasses import asdict, dataclass, field
from typing import Callable, List, Optional

from ansible.module_utils import file_io

SHARD_RE = re.compile(r"^engram-l(\d+)-r(\d+)of(\d+)\.bin$")
CHUNK = 8 * 1024 * 1024
ARCHIVE_MARGIN = 16 * 1024 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class RelocateError(Exception):
    def __init__(self, msg: str, **extra):
        super().__init__(msg)
        self.msg = msg
        self.extra = extra


@dataclass
class StaleFile:
    source: str
    archive: str
    bytes: int
    reason: str
    state: str = "stale"          # stale | copied | relocated | failed
    action: str = "none"          # none | copy | copy+remove | remove | record (write a missing .sha256)
    sha256: str = ""
    # how the archive copy is known to match: "" (no copy yet), "record" (its .sha256 record only: the
    # plan's hint, re-hashed before any removal), "sha256" (hashed against the source in this run)
    verified: str = ""


@dataclass
class Plan:
    files: List[StaleFile] = field(default_factory=list)
    copy_bytes: int = 0
    freed_bytes: int = 0
    archive_available: int = 0
    archive_root: str = ""        # the resolved, existing directory the archive dir is (or will be) under
    archive_dev: int = 0
    archive_dir: str = ""
    archive_tail: List[str] = field(default_factory=list)   # archive dir components below archive_root

    def as_result(self) -> dict:
        return {"files": [asdict(f) for f in self.files], "copy_bytes": self.copy_bytes,
                "freed_bytes": self.freed_bytes, "archive_available_bytes": self.archive_available}


def parse_shard_name(name: str) -> Optional[tuple]:
    m = SHARD_RE.match(name)
    return tuple(int(g) for g in m.groups()) if m else None


def _host() -> str:
    return socket.gethostname()


def _available(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _existing_parent(path: str) -> str:
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    return path


def sha256_file(path: str) -> str:
    """A shard's sha256, its pages dropped as they are read; a symlink is refused (OSError ELOOP)."""
    return file_io.sha256_file(path, drop_cache=True, follow_symlinks=False)


def find_stale(stale_paths: List[str], engram_dir: Optional[str], tp: Optional[int]) -> List[tuple]:
    """(path, reason) of every stale shard; paths that do not exist are skipped (already relocated)."""
    found = {}
    for path in stale_paths:
        path = os.path.abspath(path)
        if os.path.isdir(path):
            for name in sorted(os.listdir(path)):
                full = os.path.join(path, name)
                if parse_shard_name(name) and os.path.lexists(full) and not os.path.isdir(full):
                    found[full] = f"listed in engram_stale_paths ({path})"
        elif os.path.lexists(path):
            found[path] = "listed in engram_stale_paths"
    if engram_dir and tp and os.path.isdir(engram_dir):
        engram_dir = os.path.abspath(engram_dir)
        for name in sorted(os.listdir(engram_dir)):
            parsed = parse_shard_name(name)
            if parsed and parsed[2] != tp:
                found.setdefault(os.path.join(engram_dir, name), f"packed for TP{parsed[2]}, the fleet runs TP{tp}")
    return sorted(found.items())


def _archive_parts(result: Plan, source: str) -> List[str]:
    """The directory names from the resolved archive root down to the source's archive directory."""
    return result.archive_tail + [p for p in os.path.dirname(source).split(os.sep) if p]


def _check_archive_path(root: str, root_dev: int, parts: List[str], name: str,
                        archive_dir: str) -> Optional[os.stat_result]:
    """Read-only walk of the archive path below its root: every existing directory is a real directory
    on the root's volume; the copy, if present, a regular file with one name. Returns its lstat."""
    path = root
    for part in parts:
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        _refuse_dir(st, path, root_dev, archive_dir)
    try:
        st = os.lstat(os.path.join(path, name))
    except FileNotFoundError:
        return None
    _refuse_file(st, os.path.join(path, name), "archive copy")
    return st


def _refuse_dir(st: os.stat_result, path: str, root_dev: int, archive_dir: str) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise RelocateError(
            f"{_host()}: {path} under the archive dir {archive_dir} is a symlink; a copy through it could land "
            "on the source itself. Replace it with a real directory on the archive volume (or remove it)",
            path=path, archive_dir=archive_dir)
    if not stat.S_ISDIR(st.st_mode):
        raise RelocateError(f"{_host()}: {path} under the archive dir {archive_dir} is not a directory; "
                            "move it away", path=path, archive_dir=archive_dir)
    if st.st_dev != root_dev:
        raise RelocateError(
            f"{_host()}: {path} under the archive dir {archive_dir} is a mount point of another volume (a bind "
            "mount?), not the archive volume; a copy there could be the source itself. Unmount it or choose "
            "another engram_archive_dir", path=path, archive_dir=archive_dir)


def _refuse_file(st: os.stat_result, path: str, what: str, other_names: bool = False) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise RelocateError(f"{_host()}: the {what} {path} is a symlink; nothing is written through a link. "
                            "Remove the link and run again", path=path)
    if not stat.S_ISREG(st.st_mode):
        raise RelocateError(f"{_host()}: the {what} {path} is not a regular file; move it away", path=path)
    if st.st_nlink > 1 and not other_names:
        raise RelocateError(f"{_host()}: the {what} {path} has {st.st_nlink} links (other names elsewhere); "
                            "nothing is written into a file that has other names. Remove this name and run again",
                            path=path, links=st.st_nlink)


def plan(stale_paths: List[str], archive_dir: str, remove_source: bool, engram_dir: Optional[str] = None,
         tp: Optional[int] = None, hash_fn: Callable[[str], str] = sha256_file,
         margin_bytes: int = ARCHIVE_MARGIN) -> Plan:
    host = _host()
    if not os.path.isabs(archive_dir):
        raise RelocateError(f"{host}: archive dir {archive_dir!r} must be an absolute path")
    archive_dir = os.path.normpath(archive_dir)
    result = Plan()
    # A symlink at or above the archive dir itself is the operator's choice of volume: it is resolved and
    # that volume is checked against every source. Below it, nothing may lead elsewhere.
    existing = _existing_parent(archive_dir)
    result.archive_root = os.path.realpath(existing)
    tail = os.path.relpath(archive_dir, existing)
    result.archive_tail = [] if tail == "." else tail.split(os.sep)
    result.archive_dir = archive_dir
    result.archive_dev = os.stat(result.archive_root).st_dev
    result.archive_available = _available(result.archive_root)
    for source, reason in find_stale(stale_paths, engram_dir, tp):
        src_st = os.lstat(source)
        _refuse_file(src_st, source, "stale shard", other_names=True)
        archive = os.path.join(archive_dir, source.lstrip("/"))
        if src_st.st_dev == result.archive_dev:
            raise RelocateError(
                f"{host}: archive dir {archive_dir} is on the same volume as {source}: relocating there frees "
                "nothing; choose an archive dir on another volume (engram_archive_dir)",
                source=source, archive_dir=archive_dir)
        parts = _archive_parts(result, source)
        item = StaleFile(source=source, archive=archive, bytes=src_st.st_size, reason=reason)
        arch_st = _check_archive_path(result.archive_root, result.archive_dev, parts, os.path.basename(source),
                                      archive_dir)
        if arch_st is not None:
            _refuse_same_file(src_st, arch_st, source, archive)
            if arch_st.st_size == src_st.st_size and _record_matches(source, archive):
                item.state, item.verified = "copied", "record"
            elif arch_st.st_size == src_st.st_size and hash_fn(archive) == hash_fn(source):
                item.state, item.verified = "copied", "sha256"
            else:
                raise RelocateError(
                    f"{host}: the archive already holds a different file at {archive} (size or sha256 differs "
                    f"from {source}); move it away or choose another engram_archive_dir",
                    source=source, archive=archive)
        if item.state == "stale":
            item.action = "copy+remove" if remove_source else "copy"
            result.copy_bytes += item.bytes
        elif remove_source:
            item.action = "remove"
        elif item.verified == "sha256":
            # a whole copy without its record (a run killed between rename and record): write the record,
            # so a rerun leaves the archive as an uninterrupted run would
            item.action = "record"
        if remove_source:
            result.freed_bytes += item.bytes
        result.files.append(item)
    if result.copy_bytes and result.copy_bytes + margin_bytes > result.archive_available:
        raise RelocateError(
            f"{host}: the archive volume at {archive_dir} has {result.archive_available} bytes available; "
            f"relocating needs {result.copy_bytes} bytes plus a {margin_bytes}-byte margin",
            required_bytes=result.copy_bytes, available_bytes=result.archive_available)
    return result


def _refuse_same_file(src_st: os.stat_result, arch_st: os.stat_result, source: str, archive: str) -> None:
    if (src_st.st_dev, src_st.st_ino) == (arch_st.st_dev, arch_st.st_ino) or src_st.st_dev == arch_st.st_dev:
        raise RelocateError(
            f"{_host()}: the archive copy {archive} is the same file as (or on the same volume as) its source "
            f"{source}; that is no copy. Check the archive dir for links or mounts onto the source",
            source=source, archive=archive)


def _stamp(source: str) -> str:
    st = os.stat(source)
    return f"{st.st_size} {st.st_mtime_ns}"


def _record_matches(source: str, archive: str) -> bool:
    """The copy's .sha256 record: lets the read-only plan skip rehashing 100 GB; never proof for removal."""
    try:
        fd = os.open(archive + ".sha256", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            sha, stamp = os.read(fd, 4096).decode().split("  ", 1)
        finally:
            os.close(fd)
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return stamp.strip() == _stamp(source) and len(sha) == 64


def _open_archive_dir(result: Plan, item: StaleFile, create: bool) -> int:
    """Open the copy's directory by walking down from the archive root with O_NOFOLLOW, creating what is
    missing; every step must stay on the archive volume. Returns its fd."""
    archive_dir = result.archive_dir
    parts = _archive_parts(result, item.source)
    fd = os.open(result.archive_root, _DIR_FLAGS & ~os.O_NOFOLLOW)
    path = result.archive_root
    try:
        if os.fstat(fd).st_dev != result.archive_dev:
            raise RelocateError(f"{_host()}: the archive root {path} changed volume since the plan; run again",
                                path=path)
        for part in parts:
            path = os.path.join(path, part)
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                os.fsync(fd)
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    _refuse_dir(os.stat(part, dir_fd=fd, follow_symlinks=False), path, result.archive_dev,
                                archive_dir)
                raise
            os.close(fd)
            fd = child
            _refuse_dir(os.fstat(fd), path, result.archive_dev, archive_dir)
        # the directory the copy is renamed in is the one its archive path resolves to
        opened, named = os.fstat(fd), os.stat(os.path.dirname(item.archive))
        if (opened.st_dev, opened.st_ino) != (named.st_dev, named.st_ino):
            raise RelocateError(f"{_host()}: {os.path.dirname(item.archive)} does not resolve to the directory "
                                f"walked to under {result.archive_root}; it changed during the run, run again",
                                path=os.path.dirname(item.archive))
        return fd
    except BaseException:
        os.close(fd)
        raise


def _create_excl(dirfd: int, name: str, where: str) -> int:
    """A fresh file `name` in dirfd: a leftover regular file with one name (an interrupted run's) is
    unlinked, never truncated; a link or a file with other names is refused."""
    try:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        pass
    else:
        _refuse_file(st, os.path.join(where, name), "leftover temporary")
        os.unlink(name, dir_fd=dirfd)
    return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dirfd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _copy(item: StaleFile, dirfd: int, where: str) -> tuple:
    """Copy through a fresh .partial with fsync, then rename inside dirfd; returns the sha256 of the bytes
    read from the source and the source's fstat. A failed copy removes its own .partial (the source is untouched)."""
    name = os.path.basename(item.archive)
    partial = name + ".partial"
    if os.path.lexists(os.path.join(where, name)):
        raise RelocateError(f"{_host()}: {item.archive} appeared since the plan; run again", archive=item.archive)
    digest = hashlib.sha256()
    src = os.open(item.source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        dst = _create_excl(dirfd, partial, where)
        try:
            offset = 0
            while True:
                block = os.read(src, CHUNK)
                if not block:
                    break
                _write_all(dst, block)
                digest.update(block)
                os.fdatasync(dst)
                for fd in (src, dst):
                    os.posix_fadvise(fd, offset, len(block), os.POSIX_FADV_DONTNEED)
                offset += len(block)
            src_st = os.fstat(src)
            os.fchown(dst, src_st.st_uid, src_st.st_gid)
            os.fsync(dst)
        except BaseException:
            os.close(dst)
            os.unlink(partial, dir_fd=dirfd)
            raise
        os.close(dst)
    finally:
        os.close(src)
    os.rename(partial, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
    os.fsync(dirfd)
    return digest.hexdigest(), src_st


def _verify_copy(item: StaleFile, dirfd: int, source_sha: str) -> os.stat_result:
    """Re-hash the archive copy now (opened without following links) and compare it with the source's
    sha256; refuse a copy that is the source's own inode."""
    fd = os.open(os.path.basename(item.archive), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
    try:
        arch_st = os.fstat(fd)
        src_st = os.lstat(item.source)
        _refuse_same_file(src_st, arch_st, item.source, item.archive)
        _refuse_file(arch_st, item.archive, "archive copy")
        archive_sha = file_io.sha256_fd(fd, drop_cache=True)
    finally:
        os.close(fd)
    if arch_st.st_size != src_st.st_size or archive_sha != source_sha:
        raise RelocateError(
            f"{_host()}: the archive copy {item.archive} does not match its source {item.source} "
            f"(size {arch_st.st_size} vs {src_st.st_size} bytes, sha256 {archive_sha[:16]}... vs "
            f"{source_sha[:16]}...); the source is kept. Move the damaged copy (and its .sha256 record) away "
            "and run again", source=item.source, archive=item.archive)
    return src_st


def _write_record(item: StaleFile, dirfd: int, where: str, sha: str) -> None:
    name = os.path.basename(item.archive) + ".sha256"
    fd = _create_excl(dirfd, name + ".tmp", where)
    try:
        _write_all(fd, f"{sha}  {_stamp(item.source)}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(name + ".tmp", name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
    os.fsync(dirfd)


def _unlink_source(item: StaleFile, hashed: os.stat_result) -> None:
    now = os.lstat(item.source)
    if (now.st_ino, now.st_size, now.st_mtime_ns) != (hashed.st_ino, hashed.st_size, hashed.st_mtime_ns):
        raise RelocateError(f"{_host()}: {item.source} changed while it was being relocated; it is kept, run again",
                            source=item.source)
    os.unlink(item.source)
    parent = os.open(os.path.dirname(item.source), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(parent)
    finally:
        os.close(parent)


def apply(result: Plan) -> List[StaleFile]:
    """Do the plan, one shard at a time. On any failure, raise a RelocateError that says what this run
    already did (sources removed, copies verified) and what is left, with `changed`."""
    done: List[StaleFile] = []
    for item in result.files:
        if item.action == "none":
            continue
        try:
            dirfd = _open_archive_dir(result, item, create=item.action != "remove")
            try:
                where = os.path.dirname(item.archive)
                if item.action in ("copy", "copy+remove"):
                    source_sha, src_st = _copy(item, dirfd, where)
                    done.append(item)
                    # this re-hash of the copy is also the one just before the source is removed
                    _verify_copy(item, dirfd, source_sha)
                    item.state, item.verified, item.sha256 = "copied", "sha256", source_sha
                    _write_record(item, dirfd, where, source_sha)
                else:
                    # a copy from an earlier run: its record is no proof, both files are hashed now
                    src_st = os.lstat(item.source)
                    source_sha = sha256_file(item.source)
                    _verify_copy(item, dirfd, source_sha)
                    item.verified, item.sha256 = "sha256", source_sha
                    if not _record_matches(item.source, item.archive):
                        _write_record(item, dirfd, where, source_sha)
                    if item.action == "record":
                        done.append(item)
                if item.action in ("copy+remove", "remove"):
                    _unlink_source(item, src_st)
                    item.state = "relocated"
                    if item not in done:
                        done.append(item)
            finally:
                os.close(dirfd)
        except (RelocateError, OSError) as exc:
            item.state = "failed" if item.state != "relocated" else item.state
            raise _failure(result, item, exc) from None
    return done


def _failure(result: Plan, failed: StaleFile, exc: Exception) -> RelocateError:
    removed = [f for f in result.files if f.state == "relocated" and f.action != "none"]
    verified = [f.archive for f in result.files if f.verified == "sha256"]
    left = [f.source for f in result.files if f.action != "none" and f.state != "relocated"]
    if isinstance(exc, RelocateError):
        reason = exc.msg
    else:
        reason = f"{exc.strerror or exc} ({exc.filename or 'copying to ' + failed.archive})"
        if exc.errno == errno.ENOSPC:
            reason += "; the archive volume is full: free space there or choose a larger engram_archive_dir"
    copied = [f for f in result.files if f.action in ("copy", "copy+remove") and f.verified == "sha256"]
    msg = (f"{_host()}: relocation stopped at {failed.source}: {reason}. Already done by this run: "
           f"{len(removed)} source(s) removed after their copies verified"
           f"{' (' + ', '.join(f.source for f in removed) + ')' if removed else ''}, {len(verified)} archive "
           f"copies verified; left in place: {len(left)} source(s){' (' + ', '.join(left) + ')' if left else ''}. "
           "Nothing else was removed; fix the cause and run again (finished shards are not copied again)")
    extra = dict(exc.extra) if isinstance(exc, RelocateError) else {}
    extra.update(changed=bool(removed or copied), removed_sources=[f.source for f in removed],
                 verified_copies=verified, left=left, files=[asdict(f) for f in result.files],
                 copy_bytes=sum(f.bytes for f in copied), freed_bytes=sum(f.bytes for f in removed),
                 archive_available_bytes=result.archive_available)
    return RelocateError(msg, **extra)


def diff_lines(result: Plan) -> tuple[str, str]:
    before, after = [], []
    for item in result.files:
        before.append(f"{item.source}: present ({item.bytes} bytes); archive {item.archive}: "
                      f"{'present' if item.state == 'copied' else 'absent'}")
        src_after = "removed" if item.action in ("copy+remove", "remove") else "present"
        record = ", .sha256 record written" if item.action == "record" else ""
        after.append(f"{item.source}: {src_after}; archive {item.archive}: present (verified sha256{record})")
    return "\n".join(before) + ("\n" if before else ""), "\n".join(after) + ("\n" if after else "")
