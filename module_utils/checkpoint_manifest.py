# -*- coding: utf-8 -*-
"""Checkpoint integrity (docs/reference.md section 11): one manifest (path, size, sha256) built once on the head,
verified on every node through the path that node's engine reads (the head's directory, a worker's NFS
docker volume), plus index completeness (every tensor of model.safetensors.index.json present in the
header of the file the index names).

A corrupted shard passes the size check and kills the engine at 33% of load; a missing indexed shard can
load silently; a worker that cannot read the export fails only at boot. This finds all three before a boot.

- ``build`` hashes every file under the checkpoint directory (hidden names skipped). With a previous
  manifest, a file whose size and mtime are unchanged keeps its hash unless ``full``.
- ``verify`` checks every manifest entry (exists, size, sha256) with a pool of readers; a per-node cache
  (path, size, mtime, sha256 last verified) lets an unchanged file skip rehashing unless ``full``. Pages are
  dropped as they are hashed: on GB10 the GPU's free memory is MemFree, and page cache counts as used.
- ``measure`` first reads the same files once sequentially (one stream, cold: pages dropped before each
  pass) and reports both throughputs: the figure docs/preflight.md records. ``measure_rounds`` > 1 alternates
  that many (cold read, cold verification) pairs and compares the medians: a small checkpoint passes in tens of
  milliseconds, where one pair measures the machine's noise more than the code.

Standard library only (bare hosts, the engine image). Also a CLI, run inside the engine image on workers:

    python3 checkpoint_manifest.py verify --root DIR --manifest FILE [--cache FILE] [--full] [--measure] --json
    python3 checkpoint_manifest.py build --root DIR [--previous FILE] [--full] --json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import stat
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional

try:
    from ansible.module_utils.safetensors_header import INDEX_NAME, SafetensorsError, read_header, read_index
except ImportError:  # the CLI inside the engine image, next to safetensors_header.py
    from safetensors_header import INDEX_NAME, SafetensorsError, read_header, read_index  # type: ignore

MANIFEST_VERSION = 1
# 4 MiB reads: finer interleaving of reading and hashing across the pool than 8 MiB, and half the per-thread
# buffer (measured on the testbed: ratio of medians 0.78-0.83 against 0.71-0.74 with 8 MiB, docs/preflight.md).
CHUNK = 4 * 1024 * 1024
DROP_EVERY = 64 * 1024 * 1024
MAX_PROBLEMS = 200


class ManifestError(Exception):
    """Bad input (a manifest path outside the checkpoint, a malformed manifest, a missing directory)."""


# ------------------------------------------------------------------ files

def _drop(fd: int, offset: int = 0, length: int = 0) -> None:
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    except (OSError, AttributeError):
        pass


def evict(paths: List[str]) -> None:
    """Drop the files' pages from the page cache (so the next read comes from disk or the server)."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            _drop(fd)
        finally:
            os.close(fd)


_BUFFERS = threading.local()


def _buffer() -> bytearray:
    """One CHUNK-sized read buffer per thread, reused for every file (allocating it per file costs more than
    hashing a small file)."""
    buf = getattr(_BUFFERS, "buf", None)
    if buf is None:
        buf = _BUFFERS.buf = bytearray(CHUNK)
    return buf


def hash_file(path: str, drop_cache: bool = True) -> tuple:
    """(sha256 hex, bytes read) of one file, reading CHUNK bytes at a time and dropping its pages as it goes."""
    digest = hashlib.sha256()
    buf = _buffer()
    view = memoryview(buf)
    total, dropped = 0, 0
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except (OSError, AttributeError):
            pass
        while True:
            n = os.readv(fd, [buf])
            if not n:
                break
            digest.update(view[:n])
            total += n
            if drop_cache and total - dropped >= DROP_EVERY:
                _drop(fd, dropped, total - dropped)
                dropped = total
        if drop_cache:
            _drop(fd)
    finally:
        os.close(fd)
    return digest.hexdigest(), total


def sequential_read(paths: List[str]) -> int:
    """Read the files one after another in one stream (the baseline of ``measure``); returns bytes read."""
    buf = _buffer()
    total = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            while True:
                n = os.readv(fd, [buf])
                if not n:
                    break
                total += n
        finally:
            os.close(fd)
    return total


def default_workers() -> int:
    return max(2, min(16, (os.cpu_count() or 2) * 2))


# ------------------------------------------------------------------ manifest

def list_files(root: str) -> List[str]:
    """Every regular file under root (relative, sorted), hidden names skipped; a link out of root is refused."""
    real_root = os.path.realpath(root)
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            full = os.path.join(dirpath, name)
            real = os.path.realpath(full)
            if not (real + os.sep).startswith(real_root + os.sep):
                raise ManifestError(f"{full} links outside the checkpoint directory {root} (to {real})")
            if stat.S_ISREG(os.stat(full).st_mode):
                out.append(os.path.relpath(full, root))
    return out


def check_manifest(manifest: dict, root: str) -> List[dict]:
    """The manifest's entries, after refusing anything that is not a plain file inside root."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
        raise ManifestError("the manifest has no files list (build it with state=built)")
    real_root = os.path.realpath(root)
    entries, seen = [], set()
    for entry in manifest["files"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise ManifestError(f"manifest entry {entry!r} has no path")
        rel = entry["path"]
        if not isinstance(entry.get("size"), int) or not isinstance(entry.get("sha256"), str) \
                or len(entry["sha256"]) != 64:
            raise ManifestError(f"manifest entry {rel} needs an integer size and a 64-hex sha256")
        norm = os.path.normpath(rel)
        if os.path.isabs(rel) or norm != rel or norm == ".." or norm.startswith(".." + os.sep) or "\x00" in rel:
            raise ManifestError(f"the manifest lists {rel}, which is outside the checkpoint directory {root}: "
                                "refusing to read anything")
        real = os.path.realpath(os.path.join(root, rel))
        if os.path.lexists(os.path.join(root, rel)) and not (real + os.sep).startswith(real_root + os.sep):
            raise ManifestError(f"the manifest lists {rel}, which resolves outside the checkpoint directory "
                                f"{root} (to {real}): refusing to read anything")
        if rel in seen:
            raise ManifestError(f"the manifest lists {rel} twice")
        seen.add(rel)
        entries.append(entry)
    return entries


def manifest_digest(manifest: dict) -> str:
    body = json.dumps([[e["path"], e["size"], e["sha256"]] for e in manifest["files"]], separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def build(root: str, previous: Optional[dict] = None, full: bool = False, workers: int = 0) -> dict:
    if not os.path.isdir(root):
        raise ManifestError(f"checkpoint directory {root} does not exist or is not a directory")
    started = time.monotonic()
    known = {}
    if previous and not full:
        known = {e["path"]: e for e in check_manifest(previous, root)}
    files, todo = [], []
    for rel in list_files(root):
        st = os.stat(os.path.join(root, rel))
        old = known.get(rel)
        entry = {"path": rel, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        if old and old.get("size") == st.st_size and old.get("mtime_ns") == st.st_mtime_ns:
            entry["sha256"] = old["sha256"]
        else:
            todo.append(entry)
        files.append(entry)
    for (entry, _), got, exc in _hash_all(root, [(e, os.stat(os.path.join(root, e["path"]))) for e in todo], workers,
                                          True):
        if exc is not None:
            raise exc
        entry["sha256"] = got[0]
    manifest = {"version": MANIFEST_VERSION, "root": root, "host": socket.gethostname(),
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "files": files,
                "total_bytes": sum(e["size"] for e in files)}
    manifest["digest"] = manifest_digest(manifest)
    return {"manifest": manifest, "files": len(files), "hashed_files": len(todo),
            "hashed_bytes": sum(e["size"] for e in todo), "reused_files": len(files) - len(todo),
            "seconds": round(time.monotonic() - started, 3)}


def index_problems(root: str, listed: set, skip: set) -> List[dict]:
    """Index completeness: every file the index names is listed, and every tensor is in its file's header
    (files in ``skip`` already have a problem of their own)."""
    problems = []
    try:
        weight_map = read_index(root)
    except SafetensorsError as exc:
        return [{"path": INDEX_NAME, "kind": "index", "detail": str(exc)}]
    by_file: Dict[str, List[str]] = {}
    for tensor, shard in weight_map.items():
        by_file.setdefault(shard, []).append(tensor)
    for shard, tensors in sorted(by_file.items()):
        if shard not in listed:
            problems.append({"path": shard, "kind": "index", "detail": f"the index maps {len(tensors)} tensors to "
                             f"{shard}, which the manifest does not list"})
            continue
        if shard in skip:
            continue
        try:
            header = read_header(os.path.join(root, shard))
        except SafetensorsError as exc:
            problems.append({"path": shard, "kind": "header", "detail": str(exc)})
            continue
        missing = sorted(t for t in tensors if t not in header.tensors)
        if missing:
            problems.append({"path": shard, "kind": "index", "detail": f"{len(missing)} tensor(s) of the index are "
                             f"not in the file's header: {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else "")})
    return problems


def _hash_all(root: str, todo: list, workers: int, drop_cache: bool) -> list:
    """[((entry, st), (sha, bytes) or None, exc or None)] for every file, in ``todo``'s order, hashed by a pool of
    readers that takes the largest files first: a large file started last would run alone at the end (one file is
    one sequential sha256), which is what made a checkpoint of many small files and two large ones slow."""
    def one(item):
        entry, st = item
        try:
            return item, hash_file(os.path.join(root, entry["path"]), drop_cache), None
        except OSError as exc:
            return item, None, exc

    order = sorted(range(len(todo)), key=lambda i: -todo[i][1].st_size)
    with ThreadPoolExecutor(max_workers=workers or default_workers()) as pool:
        done = dict(zip(order, pool.map(one, [todo[i] for i in order])))
    return [done[i] for i in range(len(todo))]


def _median(values: List[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def verify(root: str, manifest: dict, cache: Optional[dict] = None, full: bool = False, workers: int = 0,
           measure: bool = False, check_index: bool = True, drop_cache: bool = True, measure_rounds: int = 1) -> dict:
    """Check every manifest entry under root. Returns the result and the new cache; raises ManifestError on
    bad input before anything is read."""
    entries = check_manifest(manifest, root)
    if not os.path.isdir(root):
        raise ManifestError(f"checkpoint directory {root} does not exist or is not readable here")
    digest = manifest.get("digest") or manifest_digest(manifest)
    cached = {}
    if cache and not full and not measure and cache.get("root") == root:
        cached = cache.get("files") or {}
    started = time.monotonic()
    problems, todo, ok_cached, present = [], [], [], []
    for entry in entries:
        path = os.path.join(root, entry["path"])
        try:
            st = os.stat(path)
        except OSError as exc:
            problems.append({"path": entry["path"], "kind": "missing" if exc.errno == 2 else "unreadable",
                             "detail": f"{exc.strerror or exc}"})
            continue
        if not os.access(path, os.R_OK):
            problems.append({"path": entry["path"], "kind": "unreadable", "detail": "permission denied"})
            continue
        if st.st_size != entry["size"]:
            problems.append({"path": entry["path"], "kind": "size",
                             "detail": f"{st.st_size} bytes, the manifest says {entry['size']}"})
            continue
        present.append(entry["path"])
        hit = cached.get(entry["path"])
        if hit and hit.get("size") == st.st_size and hit.get("mtime_ns") == st.st_mtime_ns \
                and hit.get("sha256") == entry["sha256"]:
            ok_cached.append((entry, st))
        else:
            todo.append((entry, st))
    measured = None
    reads, hashes = [], []          # seconds of each cold sequential read / cold verification pass
    if measure:
        paths = [os.path.join(root, e["path"]) for e, _ in todo]
        for rnd in range(max(1, measure_rounds)):
            evict(paths)
            t0 = time.monotonic()
            read_bytes = sequential_read(paths)
            reads.append(time.monotonic() - t0)
            evict(paths)
            if rnd < max(1, measure_rounds) - 1:     # the last round's verification is the real one below
                t0 = time.monotonic()
                _hash_all(root, todo, workers, drop_cache)
                hashes.append(time.monotonic() - t0)
        measured = {"read_bytes": read_bytes, "read_seconds": round(_median(reads), 4), "rounds": len(reads)}
    t0 = time.monotonic()
    new_cache = {"root": root, "manifest": digest, "files": {}}
    for entry, st in ok_cached:
        new_cache["files"][entry["path"]] = cached[entry["path"]]

    hashed_bytes, hashed_files = 0, 0
    for (entry, st), got, exc in _hash_all(root, todo, workers, drop_cache):
        if exc is not None:
            problems.append({"path": entry["path"], "kind": "unreadable", "detail": exc.strerror or str(exc)})
            continue
        sha, nbytes = got
        hashed_bytes += nbytes
        hashed_files += 1
        if sha != entry["sha256"]:
            problems.append({"path": entry["path"], "kind": "sha256",
                             "detail": f"sha256 {sha}, the manifest says {entry['sha256']} (same size: "
                                       "corrupted content)"})
            continue
        new_cache["files"][entry["path"]] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha}
    hash_seconds = time.monotonic() - t0
    if measured is not None:
        hashes.append(hash_seconds)
        verify_seconds = _median(hashes)
        measured.update(verify_bytes=hashed_bytes, verify_seconds=round(verify_seconds, 4),
                        pairs=[[round(r, 4), round(h, 4)] for r, h in zip(reads, hashes)])
        if measured["read_seconds"] > 0 and verify_seconds > 0:
            read_rate = measured["read_bytes"] / measured["read_seconds"]
            verify_rate = hashed_bytes / verify_seconds
            measured.update(read_mb_per_s=round(read_rate / 1e6, 1), verify_mb_per_s=round(verify_rate / 1e6, 1),
                            ratio=round(verify_rate / read_rate, 3))
    listed = {e["path"] for e in entries}
    if check_index:
        problems += index_problems(root, listed, {p["path"] for p in problems})
    unlisted = sorted(set(list_files(root)) - listed)
    return {
        "ok": not problems,
        "root": root,
        "host": socket.gethostname(),
        "manifest_digest": digest,
        "files": len(entries),
        "bytes": sum(e["size"] for e in entries),
        "hashed_files": hashed_files,
        "hashed_bytes": hashed_bytes,
        "cached_files": len(ok_cached),
        "problems": problems[:MAX_PROBLEMS],
        "problem_count": len(problems),
        "unlisted": unlisted[:50],
        "seconds": round(time.monotonic() - started, 3),
        "measure": measured,
        "cache": new_cache,
    }


def describe(result: dict, host: str) -> str:
    """One line per problem: host, file, what is wrong."""
    return "; ".join(f"{host}: {p['path']}: {p['kind']}: {p['detail']}" for p in result["problems"])


# ------------------------------------------------------------------ CLI (inside the engine image)

def _load(path: Optional[str]) -> Optional[dict]:
    if not path or not os.path.exists(path):
        return None
    with open(path) as fh:
        return json.load(fh)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="checkpoint_manifest.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    for verb in ("build", "verify"):
        p = sub.add_parser(verb)
        p.add_argument("--root", required=True)
        p.add_argument("--full", action="store_true")
        p.add_argument("--workers", type=int, default=0)
        p.add_argument("--json", action="store_true")
    sub.choices["build"].add_argument("--previous")
    v = sub.choices["verify"]
    v.add_argument("--manifest", required=True)
    v.add_argument("--cache")
    v.add_argument("--measure", action="store_true")
    v.add_argument("--measure-rounds", type=int, default=1)
    v.add_argument("--no-index", dest="check_index", action="store_false")
    args = parser.parse_args(argv)
    try:
        if args.verb == "build":
            result = build(args.root, _load(args.previous), args.full, args.workers)
        else:
            result = verify(args.root, _load(args.manifest), _load(args.cache), args.full, args.workers,
                            args.measure, args.check_index, measure_rounds=args.measure_rounds)
    except (ManifestError, OSError, ValueError) as exc:
        result = {"failed": True, "msg": str(exc)}
    print(json.dumps(result))
    return 1 if result.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
