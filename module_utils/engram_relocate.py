"""Relocate stale Engram shards to an archive volume: copy, fsync, verify by size and sha256, and only
then (and only when asked) remove the source. Plain Python, standard library only.

A shard is stale when it is listed (a file, or a directory whose `engram-l*-r*of*.bin` files count) or
when it sits in the live engram dir but belongs to another tensor-parallel size. The archive keeps the
source's absolute path under the archive dir, so provenance is never lost.
"""
from __future__ import annotations

import hashlib
import os
import re
import socket
from dataclasses import asdict, dataclass, field
from typing import Callable, List, Optional

SHARD_RE = re.compile(r"^engram-l(\d+)-r(\d+)of(\d+)\.bin$")
CHUNK = 8 * 1024 * 1024
ARCHIVE_MARGIN = 16 * 1024 * 1024


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
    state: str = "stale"          # stale | copied | relocated | archived-only
    action: str = "none"          # none | copy | copy+remove | remove
    sha256: str = ""


@dataclass
class Plan:
    files: List[StaleFile] = field(default_factory=list)
    copy_bytes: int = 0
    freed_bytes: int = 0
    archive_available: int = 0

    def as_result(self) -> dict:
        return {"files": [asdict(f) for f in self.files], "copy_bytes": self.copy_bytes,
                "freed_bytes": self.freed_bytes, "archive_available_bytes": self.archive_available}


def parse_shard_name(name: str) -> Optional[tuple]:
    m = SHARD_RE.match(name)
    return tuple(int(g) for g in m.groups()) if m else None


def _available(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _existing_parent(path: str) -> str:
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        offset = 0
        while True:
            block = os.read(fd, CHUNK)
            if not block:
                break
            digest.update(block)
            os.posix_fadvise(fd, offset, len(block), os.POSIX_FADV_DONTNEED)
            offset += len(block)
    finally:
        os.close(fd)
    return digest.hexdigest()


def find_stale(stale_paths: List[str], engram_dir: Optional[str], tp: Optional[int]) -> List[tuple]:
    """(path, reason) of every stale shard; paths that do not exist are skipped (already relocated)."""
    found = {}
    for path in stale_paths:
        if os.path.isdir(path):
            for name in sorted(os.listdir(path)):
                full = os.path.join(path, name)
                if parse_shard_name(name) and os.path.isfile(full):
                    found[full] = f"listed in engram_stale_paths ({path})"
        elif os.path.isfile(path):
            found[path] = "listed in engram_stale_paths"
    if engram_dir and tp and os.path.isdir(engram_dir):
        for name in sorted(os.listdir(engram_dir)):
            parsed = parse_shard_name(name)
            if parsed and parsed[2] != tp:
                found.setdefault(os.path.join(engram_dir, name), f"packed for TP{parsed[2]}, the fleet runs TP{tp}")
    return sorted(found.items())


def plan(stale_paths: List[str], archive_dir: str, remove_source: bool, engram_dir: Optional[str] = None,
         tp: Optional[int] = None, hash_fn: Callable[[str], str] = sha256_file,
         margin_bytes: int = ARCHIVE_MARGIN) -> Plan:
    host = socket.gethostname()
    if not os.path.isabs(archive_dir):
        raise RelocateError(f"{host}: archive dir {archive_dir!r} must be an absolute path")
    result = Plan()
    archive_root = _existing_parent(archive_dir)
    archive_dev = os.stat(archive_root).st_dev
    result.archive_available = _available(archive_root)
    for source, reason in find_stale(stale_paths, engram_dir, tp):
        archive = os.path.join(archive_dir, source.lstrip("/"))
        size = os.path.getsize(source)
        if os.stat(source).st_dev == archive_dev:
            raise RelocateError(
                f"{host}: archive dir {archive_dir} is on the same volume as {source}: relocating there frees "
                "nothing; choose an archive dir on another volume (engram_archive_dir)",
                source=source, archive_dir=archive_dir)
        item = StaleFile(source=source, archive=archive, bytes=size, reason=reason)
        if os.path.exists(archive):
            if _sidecar_matches(source, archive) or (
                    os.path.getsize(archive) == size and hash_fn(archive) == hash_fn(source)):
                item.state = "copied"
            else:
                raise RelocateError(
                    f"{host}: the archive already holds a different file at {archive} (size or sha256 differs "
                    f"from {source}); move it away or choose another engram_archive_dir",
                    source=source, archive=archive)
        if item.state == "stale":
            item.action = "copy+remove" if remove_source else "copy"
            result.copy_bytes += size
        elif remove_source:
            item.action = "remove"
        if remove_source:
            result.freed_bytes += size
        result.files.append(item)
    if result.copy_bytes and result.copy_bytes + margin_bytes > result.archive_available:
        raise RelocateError(
            f"{host}: the archive volume at {archive_dir} has {result.archive_available} bytes available; "
            f"relocating needs {result.copy_bytes} bytes plus a {margin_bytes}-byte margin",
            required_bytes=result.copy_bytes, available_bytes=result.archive_available)
    return result


def _stamp(source: str) -> str:
    st = os.stat(source)
    return f"{st.st_size} {st.st_mtime_ns}"


def _sidecar_matches(source: str, archive: str) -> bool:
    """The verified copy's record: skip rehashing 100 GB when neither file changed since."""
    try:
        sha, stamp = open(archive + ".sha256").read().split("  ", 1)
    except (OSError, ValueError):
        return False
    return stamp.strip() == _stamp(source) and os.path.getsize(archive) == int(stamp.split()[0]) and len(sha) == 64


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _makedirs(path: str) -> None:
    if os.path.isdir(path):
        return
    _makedirs(os.path.dirname(path))
    os.mkdir(path, 0o755)
    _fsync_dir(os.path.dirname(path))


def copy_verified(source: str, archive: str) -> str:
    """Copy through a .partial with fsync and rename; return the verified sha256 of both files."""
    _makedirs(os.path.dirname(archive))
    partial = archive + ".partial"
    digest = hashlib.sha256()
    src = os.open(source, os.O_RDONLY)
    dst = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        offset = 0
        while True:
            block = os.read(src, CHUNK)
            if not block:
                break
            view = memoryview(block)
            while view:
                written = os.write(dst, view)
                view = view[written:]
            digest.update(block)
            os.fdatasync(dst)
            for fd in (src, dst):
                os.posix_fadvise(fd, offset, len(block), os.POSIX_FADV_DONTNEED)
            offset += len(block)
        os.fsync(dst)
    finally:
        os.close(src)
        os.close(dst)
    st = os.stat(source)
    os.chown(partial, st.st_uid, st.st_gid)
    os.rename(partial, archive)
    _fsync_dir(os.path.dirname(archive))
    source_sha = digest.hexdigest()
    if os.path.getsize(archive) != os.path.getsize(source) or sha256_file(archive) != source_sha:
        raise RelocateError(f"{socket.gethostname()}: verification of {archive} against {source} failed "
                            "(size or sha256 differs); the source is untouched", source=source, archive=archive)
    with open(archive + ".sha256", "w") as fh:
        fh.write(f"{source_sha}  {_stamp(source)}\n")
    return source_sha


def apply(result: Plan) -> List[StaleFile]:
    changed = []
    for item in result.files:
        if item.action in ("copy", "copy+remove"):
            item.sha256 = copy_verified(item.source, item.archive)
            item.state = "copied"
            changed.append(item)
        if item.action in ("copy+remove", "remove"):
            if item.state != "copied":
                raise RelocateError(f"refusing to remove {item.source}: its archive copy is not verified")
            os.unlink(item.source)
            _fsync_dir(os.path.dirname(item.source))
            item.state = "relocated"
            if item not in changed:
                changed.append(item)
    return changed


def diff_lines(result: Plan) -> tuple[str, str]:
    before, after = [], []
    for item in result.files:
        before.append(f"{item.source}: present ({item.bytes} bytes); archive {item.archive}: "
                      f"{'present' if item.state == 'copied' else 'absent'}")
        src_after = "removed" if item.action in ("copy+remove", "remove") else "present"
        after.append(f"{item.source}: {src_after}; archive {item.archive}: present (verified sha256)")
    return "\n".join(before) + ("\n" if before else ""), "\n".join(after) + ("\n" if after else "")
