"""File helpers the modules share.

``write_atomic``: crash-safe replacement: a temporary file in the same directory, written and fsync'd,
given its mode (and owner), renamed over the target, then the directory fsync'd so the rename survives
a power cut. A failure removes the temporary file and leaves the old content in place.
``sha256_file``: the sha256 of a file read in 1 MiB blocks. (Engram relocation and checkpoint
verification hash with their own readers: they drop page cache and report progress as they go.)"""
from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Optional, Tuple, Union


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: Union[bytes, str], mode: int = 0o644,
                 owner: Optional[Tuple[int, int]] = None, sync_dir: bool = True) -> None:
    """Replace ``path`` with ``data`` (str is written as UTF-8) so that readers see the old or the new
    content, never a mix, and the new content is on disk when this returns."""
    directory = os.path.dirname(os.path.abspath(path))
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        if owner:
            os.chown(tmp, *owner)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    if sync_dir:
        fsync_dir(directory)


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
