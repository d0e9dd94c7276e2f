# -*- coding: utf-8 -*-
"""FlashInfer autotune caches on one host: inventory, provenance, compatibility, invalidation (docs/reference.md section 4).

Layout (host side; the engine sees it under /root/.cache)::

    <root>/<flashinfer_version>/<smXY>/<key16>/rank_tp{r}_pp0_dp0.json     the tuned tactics of rank r
    <root>/<flashinfer_version>/<smXY>/<key16>/rank_tp{r}_pp0_dp0.launch   keep adapter's sidecar (argv+env sha256)
    <root>/<flashinfer_version>/<smXY>/<key16>/sparkfleet-provenance.json  written by sparkfleet (this module)

``root`` defaults to ``~/.cache/sglang/flashinfer/autotune``. A key is the path of a key directory relative to
root, e.g. ``0.6.1/sm121/0123456789abcdef``. One rank per host is the fleet's layout; a key directory that
holds several ranks' files (a shared cache on one machine) is handled, and invalidating it moves all of them.

Provenance file (deterministic JSON, no timestamp, so a second write of the same facts changes nothing)::

    {"schema": "sparkfleet-autotune-provenance/1", "key": "0.6.1/sm121/0123456789abcdef", "rank": 0,
     "provenance": {"image_digest": ..., "flashinfer_version": ..., "engine_version": ..., "env_fingerprint": ...},
     "files": {"rank_tp0_pp0_dp0.json": "<sha256>", "rank_tp0_pp0_dp0.launch": "<sha256>"}}

``files`` pins the provenance to the exact cache it describes: a cache the engine retuned afterwards no longer
matches and is reported stale (incompatible), never silently trusted.

Invalidation never deletes: a key directory is renamed (moved) to ``<aside_dir>/<key>``, keeping the
``<version>/<sm>/<key16>`` structure; ``aside_dir`` defaults to ``<dirname(root)>/autotune-aside/<UTC timestamp>``.
A key that is already gone from root is no change.

Plain Python, standard library only (runs on the hosts).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from typing import Iterable, Optional

from ansible.module_utils.file_io import sha256_file, write_atomic

SCHEMA = "sparkfleet-autotune-provenance/1"
PROVENANCE_FILE = "sparkfleet-provenance.json"
ASIDE_MANIFEST = "sparkfleet-aside.json"
REQUIRED_PROVENANCE = ("image_digest", "flashinfer_version", "engine_version", "env_fingerprint")
DEFAULT_ROOT = "~/.cache/sglang/flashinfer/autotune"

_CACHE = re.compile(r"^rank_tp(\d+)_pp(\d+)_dp(\d+)\.json$")
_SIDECAR = re.compile(r"^rank_tp(\d+)_pp(\d+)_dp(\d+)\.launch$")
_SM = re.compile(r"^sm_?\d+[a-z]?$")
_KEY16 = re.compile(r"^[0-9a-f]{16}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class AutotuneError(Exception):
    """A request the store cannot carry out (bad key path, missing provenance fields...)."""


@dataclass
class Move:
    key: str
    src: str
    dest: str
    files: list
    state: str  # "planned", "moved", "absent"

    def as_dict(self) -> dict:
        return {"key": self.key, "src": self.src, "dest": self.dest, "files": self.files, "state": self.state}


@dataclass
class ProvenanceWrite:
    key: str
    path: str
    before: Optional[str]
    after: str
    record: dict = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return self.before != self.after


def validate_key(key: str) -> str:
    """Return the normalised key path ``<version>/<sm>/<key16>`` or raise AutotuneError."""
    if not isinstance(key, str) or not key.strip():
        raise AutotuneError(f"key {key!r} is empty; give <flashinfer_version>/<smXY>/<key16>")
    parts = [p for p in key.strip().strip("/").split("/") if p not in ("", ".")]
    if key.strip().startswith("/") or len(parts) != 3 or ".." in parts:
        raise AutotuneError(f"key {key!r} is not a path relative to root of the form "
                            f"<flashinfer_version>/<smXY>/<key16> (e.g. 0.6.1/sm121/0123456789abcdef)")
    if not _SM.match(parts[1]) or not _KEY16.match(parts[2]):
        raise AutotuneError(f"key {key!r}: expected an smXY directory and 16 lowercase hex digits, "
                            f"got {parts[1]!r} and {parts[2]!r}")
    return "/".join(parts)


def _read_sidecar(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as fh:
            text = fh.read(4096).decode("utf-8", "replace").strip()
    except OSError:
        return None
    return text if _HEX64.match(text) else None


def _read_provenance(path: str) -> tuple:
    """Return (record or None, problem or None)."""
    try:
        with open(path, "rb") as fh:
            record = json.loads(fh.read().decode("utf-8"))
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        return None, f"{PROVENANCE_FILE} cannot be read as JSON ({exc})"
    if not isinstance(record, dict) or not isinstance(record.get("provenance"), dict):
        return None, f"{PROVENANCE_FILE} is not a sparkfleet provenance record"
    return record, None


def key_entry(root: str, key: str) -> dict:
    """Inventory one key directory (no judgement yet)."""
    version, sm, key16 = key.split("/")
    path = os.path.join(root, version, sm, key16)
    files, sidecars, other = [], [], []
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if not os.path.isfile(full):
            other.append(name + "/")
            continue
        m = _CACHE.match(name)
        if m:
            files.append({"name": name, "rank": int(m.group(1)), "bytes": os.path.getsize(full),
                          "sha256": sha256_file(full)})
            continue
        m = _SIDECAR.match(name)
        if m:
            sidecars.append({"name": name, "rank": int(m.group(1)), "sha256": sha256_file(full),
                             "content_sha256": _read_sidecar(full)})
            continue
        if name != PROVENANCE_FILE:
            other.append(name)
    record, problem = _read_provenance(os.path.join(path, PROVENANCE_FILE))
    return {
        "key": key,
        "path": path,
        "flashinfer_version": version,
        "sm": sm,
        "key16": key16,
        "files": files,
        "sidecars": sidecars,
        "other_files": other,
        "ranks_present": sorted({f["rank"] for f in files}),
        "provenance": record["provenance"] if record else None,
        "provenance_record": record,
        "provenance_problem": problem,
        "compatible": None,
        "reasons": [],
    }


def _same(a, b) -> bool:
    if a == b:
        return True
    return str(a) == str(b)


def assess(entry: dict, expected: Optional[dict], rank: Optional[int]) -> dict:
    """Fill ``compatible`` and ``reasons`` of an inventory entry.

    Integrity reasons (always): this rank has no cache, unreadable or stale provenance. With ``expected``
    (the provenance the caller is about to run with): a missing provenance, a FlashInfer version or SM that is
    not the one of the path, and every key of ``expected`` that the recorded provenance lacks or differs on.
    ``compatible`` is None without ``expected``, else True exactly when there is no reason.
    """
    reasons = []
    files = {f["name"]: f for f in entry["files"]}
    sidecars = {s["name"]: s for s in entry["sidecars"]}
    if rank is not None and rank not in entry["ranks_present"]:
        reasons.append(f"no cache for rank {rank} (rank_tp{rank}_pp0_dp0.json missing)")
    if entry["provenance_problem"]:
        reasons.append(entry["provenance_problem"])
    record = entry["provenance_record"]
    if record is not None:
        recorded_rank = record.get("rank")
        if rank is not None and recorded_rank is not None and recorded_rank != rank:
            reasons.append(f"provenance was recorded for rank {recorded_rank}, not rank {rank}")
        pinned = record.get("files") or {}
        for name, digest in sorted(pinned.items()):
            current = files.get(name) or sidecars.get(name)
            if current is None:
                reasons.append(f"{name} was removed since its provenance was recorded")
            elif current["sha256"] != digest:
                reasons.append(f"{name} changed since its provenance was recorded (retuned or edited)")
        owner = recorded_rank if recorded_rank is not None else rank
        for item in entry["files"] + entry["sidecars"]:
            if item["name"] not in pinned and (owner is None or item["rank"] == owner):
                reasons.append(f"{item['name']} is not covered by the recorded provenance")
    if expected is not None:
        prov = entry["provenance"]
        if "flashinfer_version" in expected and not _same(expected["flashinfer_version"], entry["flashinfer_version"]):
            reasons.append(f"cache directory is for FlashInfer {entry['flashinfer_version']}, "
                           f"about to run {expected['flashinfer_version']}")
        if "sm" in expected and not _same(expected["sm"], entry["sm"]):
            reasons.append(f"cache directory is for {entry['sm']}, about to run {expected['sm']}")
        if prov is None:
            if not entry["provenance_problem"]:
                reasons.append(f"no provenance recorded ({PROVENANCE_FILE} missing): origin unknown")
        else:
            for name in sorted(expected):
                if name == "sm" and name not in prov:
                    continue
                if name not in prov:
                    reasons.append(f"provenance lacks {name}")
                elif not _same(prov[name], expected[name]):
                    reasons.append(f"{name} differs: cache {prov[name]!r}, about to run {expected[name]!r}")
    entry["reasons"] = reasons
    entry["compatible"] = None if expected is None else not reasons
    return entry


def list_keys(root: str) -> tuple:
    """Return (keys, unexpected paths) under root: exactly three directory levels down."""
    keys, unexpected = [], []
    if not os.path.isdir(root):
        return keys, unexpected
    for version in sorted(os.listdir(root)):
        vpath = os.path.join(root, version)
        if not os.path.isdir(vpath):
            unexpected.append(version)
            continue
        for sm in sorted(os.listdir(vpath)):
            spath = os.path.join(vpath, sm)
            if not os.path.isdir(spath) or not _SM.match(sm):
                unexpected.append(f"{version}/{sm}")
                continue
            for key16 in sorted(os.listdir(spath)):
                if os.path.isdir(os.path.join(spath, key16)) and _KEY16.match(key16):
                    keys.append(f"{version}/{sm}/{key16}")
                else:
                    unexpected.append(f"{version}/{sm}/{key16}")
    return keys, unexpected


def public(entry: dict) -> dict:
    """The entry as the module returns it (internal fields dropped)."""
    return {k: v for k, v in entry.items() if k not in ("provenance_record", "provenance_problem")}


def inventory(root: str, rank: Optional[int] = None, expected: Optional[dict] = None,
              only: Optional[Iterable[str]] = None) -> dict:
    """Every key under root with its files, sidecars, provenance and (with ``expected``) compatibility."""
    keys, unexpected = list_keys(root)
    if only is not None:
        wanted = set(only)
        keys = [k for k in keys if k in wanted]
    entries = [assess(key_entry(root, k), expected, rank) for k in keys]
    return {"root": root, "root_exists": os.path.isdir(root), "entries": entries, "unexpected": unexpected}


# ---------------------------------------------------------------- provenance

def check_provenance(provenance: Optional[dict]) -> dict:
    if not isinstance(provenance, dict) or not provenance:
        raise AutotuneError("state=provenance needs the provenance option: a dict with "
                            + ", ".join(REQUIRED_PROVENANCE))
    missing = [k for k in REQUIRED_PROVENANCE if provenance.get(k) in (None, "")]
    if missing:
        raise AutotuneError(f"provenance lacks {', '.join(missing)} (required: {', '.join(REQUIRED_PROVENANCE)})")
    return provenance


def render_provenance(key: str, rank: int, provenance: dict, entry: dict) -> tuple:
    files = {f["name"]: f["sha256"] for f in entry["files"] + entry["sidecars"] if f["rank"] == rank}
    record = {"schema": SCHEMA, "key": key, "rank": rank, "provenance": provenance, "files": files}
    return record, json.dumps(record, indent=2, sort_keys=True) + "\n"


def plan_provenance(root: str, rank: int, provenance: dict, keys: Optional[Iterable[str]] = None) -> list:
    """One ProvenanceWrite per key directory that holds this rank's cache (optionally only ``keys``)."""
    check_provenance(provenance)
    writes = []
    for entry in inventory(root, rank, None, keys)["entries"]:
        if rank not in entry["ranks_present"]:
            continue
        path = os.path.join(entry["path"], PROVENANCE_FILE)
        try:
            with open(path, "r", encoding="utf-8", errors="replace") as fh:
                before = fh.read()
        except FileNotFoundError:
            before = None
        record, after = render_provenance(entry["key"], rank, provenance, entry)
        writes.append(ProvenanceWrite(key=entry["key"], path=path, before=before, after=after, record=record))
    return writes


def apply_provenance(writes: Iterable[ProvenanceWrite]) -> None:
    for w in writes:
        if w.changed:
            write_atomic(w.path, w.after)


# ---------------------------------------------------------------- invalidation

def default_aside_dir(root: str, now: Optional[float] = None) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now if now is not None else time.time()))
    return os.path.join(os.path.dirname(os.path.normpath(root)), "autotune-aside", stamp)


def _free_dest(dest: str) -> str:
    if not os.path.lexists(dest):
        return dest
    n = 2
    while os.path.lexists(f"{dest}.{n}"):
        n += 1
    return f"{dest}.{n}"


def plan_invalidation(root: str, keys: Iterable[str], aside_dir: str) -> list:
    """A Move per requested key: ``planned`` when its directory exists under root, else ``absent``."""
    moves = []
    root_n = os.path.normpath(root)
    aside_n = os.path.normpath(aside_dir)
    if aside_n == root_n or aside_n.startswith(root_n + os.sep):
        raise AutotuneError(f"aside_dir {aside_dir} is inside root {root}: the engine would find the caches again; "
                            f"choose a directory outside root")
    for key in dict.fromkeys(validate_key(k) for k in keys):
        src = os.path.join(root, *key.split("/"))
        dest = _free_dest(os.path.join(aside_dir, *key.split("/")))
        if os.path.isdir(src):
            files = sorted(os.listdir(src))
            moves.append(Move(key=key, src=src, dest=dest, files=files, state="planned"))
        else:
            moves.append(Move(key=key, src=src, dest=dest, files=[], state="absent"))
    return moves


def apply_invalidation(moves: Iterable[Move], rank: Optional[int], reason: Optional[str], aside_dir: str,
                       now: Optional[float] = None) -> None:
    """Rename each planned key directory into aside_dir (copy then remove across filesystems); record it."""
    done = []
    for move in moves:
        if move.state != "planned":
            continue
        os.makedirs(os.path.dirname(move.dest), exist_ok=True)
        try:
            os.rename(move.src, move.dest)
        except OSError as exc:
            if exc.errno != 18:  # EXDEV: aside_dir on another filesystem
                raise
            shutil.copytree(move.src, move.dest, symlinks=True)
            shutil.rmtree(move.src)
        move.state = "moved"
        done.append(move)
    if not done:
        return
    manifest = os.path.join(aside_dir, ASIDE_MANIFEST)
    try:
        with open(manifest, "r", encoding="utf-8") as fh:
            record = json.load(fh)
        if not isinstance(record, dict) or not isinstance(record.get("moves"), list):
            record = {"moves": []}
    except (OSError, ValueError):
        record = {"moves": []}
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now if now is not None else time.time()))
    for move in done:
        record["moves"].append({"key": move.key, "from": move.src, "to": move.dest, "files": move.files,
                                "rank": rank, "reason": reason, "at": stamp})
    write_atomic(manifest, json.dumps(record, indent=2, sort_keys=True) + "\n")


def describe_keys(entries: Iterable[dict]) -> str:
    """One line per key directory, for diffs."""
    lines = []
    for e in entries:
        names = [f["name"] for f in e["files"]] + [s["name"] for s in e["sidecars"]]
        if e["provenance_record"] is not None or e["provenance_problem"]:
            names.append(PROVENANCE_FILE)
        lines.append(f"{e['key']}: {', '.join(names) if names else '(empty)'}")
    return "\n".join(lines) + ("\n" if lines else "")
