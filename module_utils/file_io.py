"""File helpers the modules share.

``write_atomic``: crash-safe replacement: a temporary file in the same directory, written and fsync'd,
given its mode (and owner), renamed over the target, then the directory fsync'd so the rename survives
a power cut. A failure removes the temporary file and leaves the old content in place.
``sha256_file`` / ``sha256_fd``: the sha256 of a file read in 8 MiB blocks, optionally dropping each block from the
page cache as it goes (on GB10 page cache is GPU memory) and refusing a symlink. (Checkpoint verification hashes
with its own reader: it measures its throughput against a sequential read.)"""
from __future__ import annotations

import hashlib
import os
import stat
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


HASH_BLOCK = 8 * 1024 * 1024


def sha256_fd(fd: int, drop_cache: bool = False) -> str:
    """The sha256 of everything an open file holds, read from offset 0 (the file position is not moved)."""
    digest = hashlib.sha256()
    offset = 0
    while True:
        block = os.pread(fd, HASH_BLOCK, offset)
        if not block:
            break
        digest.update(block)
        if drop_cache:
            os.posix_fadvise(fd, offset, len(block), os.POSIX_FADV_DONTNEED)
        offset += len(block)
    return digest.hexdigest()


def sha256_file(path: str, drop_cache: bool = False, follow_symlinks: bool = True) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW))
    try:
        return sha256_fd(fd, drop_cache)
    finally:
        os.close(fd)


def regular_stat(path: str) -> Optional[os.stat_result]:
    """``path``'s own stat (a link is not followed), None when it does not exist. A path that exists and is not a
    regular file (a folder, a link, a device) raises IsADirectoryError: it is never read or replaced as a file."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        raise IsADirectoryError(f"{path} exists and is not a regular file")
    return st


def _make_folders(folder: str) -> None:
    """Every missing folder down to ``folder``, 0755 whatever the umask (as ``file: state=directory, mode=0755``
    sets the last one); a folder another worker made meanwhile (the ranks of one task write at once) is fine."""
    missing = []
    while not os.path.isdir(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    for path in reversed(missing):
        try:
            os.mkdir(path)
            os.chmod(path, 0o755)
        except FileExistsError:
            pass


def write_if_changed(path: str, data: Union[bytes, str], mode: int = 0o644, check: bool = False,
                     make_folders: bool = False) -> dict:
    """``path`` holds ``data`` with ``mode`` afterwards (write_atomic where it does not already): {changed, dest,
    size, mode}. ``check``: report whether it would change and change nothing. The parent folder must exist (the
    caller makes it: a missing run folder is an error, not something to create silently), unless ``make_folders``:
    then every missing folder down to it is made first (0755 each whatever the umask; none in check mode)."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        if not make_folders:
            raise FileNotFoundError(f"destination folder {directory} does not exist")
        if check:
            return {"changed": True, "dest": path, "size": len(payload), "mode": "%04o" % mode}
        _make_folders(directory)
    st = regular_stat(path)
    same = False
    if st is not None:
        if st.st_size == len(payload):
            with open(path, "rb") as fh:
                same = fh.read() == payload
        if same and stat.S_IMODE(st.st_mode) != mode:
            same = False
    if not same and not check:
        write_atomic(path, payload, mode=mode)
    return {"changed": not same, "dest": path, "size": len(payload), "mode": "%04o" % mode}
