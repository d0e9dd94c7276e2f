"""Adapter bundles (docs/reference.md section 5): the operator's adapter directory plus sparkfleet's kernels package,
described by a manifest (path, size, sha256 per file) whose own hash names the bundle.

Plain Python, standard library only: the controller module (library/adapter_bundle.py) builds the bundle,
the node module (library/adapter_release.py) checks a build context against a manifest, and the in-image
test (roles/adapters/files/adapter_selftest.py) recomputes the same hash inside the image.

The bundle hash is the sha256 of the manifest's canonical JSON without its own hash field:
``json.dumps({"format": 1, "files": [{"path", "size", "sha256"}...]}, sort_keys=True, separators=(",", ":"))``
with the files sorted by path. Paths are relative to the build context and to /opt/dsv41 in the image:
``adapter/<file>`` (the adapter directory), ``kernels/<file>`` (the kernels package) and any extra files.
"""
from __future__ import annotations

import errno
import fnmatch
import hashlib
import io
import json
import os
import re
import stat
import tarfile
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

from ansible.module_utils.file_io import sha256_file, write_atomic

FORMAT = 1
MANIFEST_NAME = "sparkfleet-bundle.json"
DEFAULT_EXCLUDE = ("__pycache__", "*.pyc", "*.pyo", ".*")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
SHORT = 12


class BundleError(Exception):
    """A bundle that cannot be built or that breaks a pin; ``msg`` is for the operator, ``extra`` for results."""

    def __init__(self, msg: str, **extra):
        super().__init__(msg)
        self.msg = msg
        self.extra = extra


@dataclass
class BundleFile:
    path: str          # relative, with "/" separators: adapter/wo_a_w8.py
    source: str        # where it is read from (the controller's file, or the build context's)
    size: int
    sha256: str

    def entry(self) -> dict:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


@dataclass
class Bundle:
    files: List[BundleFile]
    pins: List[dict] = field(default_factory=list)

    @property
    def hash(self) -> str:
        return bundle_hash(f.entry() for f in self.files)

    def manifest(self) -> dict:
        return {"format": FORMAT, "bundle": self.hash, "files": [f.entry() for f in self.files]}

    def manifest_text(self) -> str:
        return manifest_text(self.manifest())

    def preview(self, limit: int = 65536) -> Dict[str, str]:
        """The text of every small UTF-8 file: a check run shows content diffs before the archive reaches a node."""
        out = {}
        for f in self.files:
            if f.size <= limit:
                try:
                    with open(f.source, "rb") as fh:
                        out[f.path] = fh.read().decode()
                except (OSError, UnicodeDecodeError):
                    continue
        return out

    def as_result(self) -> dict:
        h = self.hash
        dirs, tops = managed_roots(self.manifest())
        parents = sorted({"/".join(f.path.split("/")[:i]) for f in self.files for i in range(1, f.path.count("/") + 1)})
        return {"bundle": h, "bundle_short": h[:SHORT], "manifest": self.manifest(), "preview": self.preview(),
                "manifest_text": self.manifest_text(), "total_bytes": sum(f.size for f in self.files),
                "files": [dict(f.entry(), source=f.source) for f in self.files], "pins": self.pins,
                "roots": {"dirs": dirs, "files": tops}, "dirs": parents}


def bundle_hash(entries: Iterable[dict]) -> str:
    files = sorted(({"path": e["path"], "size": int(e["size"]), "sha256": e["sha256"]} for e in entries),
                   key=lambda e: e["path"])
    canonical = json.dumps({"format": FORMAT, "files": files}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def manifest_text(manifest: dict) -> str:
    """The manifest file's exact bytes (identical on every node, so every node builds the same image)."""
    return json.dumps(manifest, sort_keys=True, indent=1) + "\n"


def _excluded(name: str, exclude: Iterable[str]) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in exclude)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _read_problem(path: str, st: os.stat_result) -> Optional[str]:
    """Why a regular file cannot go into the bundle (None when it can)."""
    if not st.st_mode & 0o444:
        # root reads anything, but the image's engine user and the copy to the nodes need a readable file.
        return f"has no read permission (mode {stat.S_IMODE(st.st_mode):04o}); make it readable (chmod a+r)"
    try:
        with open(path, "rb") as fh:
            fh.read(1)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc}); fix its permissions"
    return None


def scan_dir(root: str, prefix: str, exclude: Iterable[str], problems: List[str]) -> List[BundleFile]:
    """Every file under ``root`` as ``<prefix>/<relative path>``. Symlinks are followed only while they stay
    inside ``root``; anything else (a link out of it, a dangling link, a fifo, an unreadable file) is a problem."""
    exclude = tuple(exclude)
    real_root = os.path.realpath(root)
    out: List[BundleFile] = []
    seen_dirs = set()

    def walk(real_dir: str, rel_dir: str) -> None:
        if real_dir in seen_dirs:
            problems.append(f"{prefix}/{rel_dir}: a symlink loop in {root}")
            return
        seen_dirs.add(real_dir)
        try:
            names = sorted(os.listdir(real_dir))
        except OSError as exc:
            problems.append(f"{prefix}/{rel_dir or '.'}: directory cannot be listed ({exc.strerror or exc})")
            return
        for name in names:
            if _excluded(name, exclude):
                continue
            rel = f"{rel_dir}/{name}" if rel_dir else name
            shown = f"{prefix}/{rel}" if prefix else rel
            path = os.path.join(real_dir, name)
            if os.path.islink(path):
                target = os.path.realpath(path)
                if not _inside(target, real_root):
                    problems.append(f"{shown} is a symlink to {os.readlink(path)} ({target}), outside the bundle "
                                    f"directory {root}: copy the file into {root} or remove the link")
                    continue
                if not os.path.exists(target):
                    problems.append(f"{shown} is a dangling symlink ({os.readlink(path)})")
                    continue
            try:
                st = os.stat(path)
            except OSError as exc:
                problems.append(f"{shown} cannot be read ({exc.strerror or exc})")
                continue
            if stat.S_ISDIR(st.st_mode):
                walk(os.path.realpath(path), rel)
                continue
            if not stat.S_ISREG(st.st_mode):
                problems.append(f"{shown} is not a regular file (a fifo, socket or device cannot be bundled)")
                continue
            problem = _read_problem(path, st)
            if problem:
                problems.append(f"{shown} {problem}")
                continue
            try:
                sha = sha256_file(path)
            except OSError as exc:
                problems.append(f"{shown} cannot be read ({exc.strerror or exc}); fix its permissions")
                continue
            out.append(BundleFile(shown, path, st.st_size, sha))

    walk(real_root, "")
    return out


def _check_dir(label: str, path: str) -> str:
    if not path:
        raise BundleError(f"{label} is empty: give the directory to bundle")
    if not os.path.lexists(path):
        raise BundleError(f"{label} {path} does not exist on the controller: check the path "
                          "(it is the operator's adapter directory in their recipe checkout)", path=path)
    if not os.path.isdir(path):
        raise BundleError(f"{label} {path} is not a directory", path=path)
    if not os.access(path, os.R_OK | os.X_OK):
        raise BundleError(f"{label} {path} cannot be read: fix its permissions", path=path)
    return path


def valid_bundle_path(path: str) -> bool:
    parts = path.split("/")
    return bool(path) and not path.startswith("/") and all(p not in ("", ".", "..") for p in parts) \
        and path != MANIFEST_NAME


def build(adapter_dir: str, kernels_dir: Optional[str] = None, extra_files: Optional[Dict[str, str]] = None,
          exclude: Iterable[str] = DEFAULT_EXCLUDE, pins: Optional[Dict[str, str]] = None) -> Bundle:
    """Walk the sources, refuse bad input (every problem in one message), check the pins, return the bundle."""
    problems: List[str] = []
    files = scan_dir(_check_dir("adapter_dir", adapter_dir), "adapter", exclude, problems)
    if not any(f.path.endswith(".py") for f in files) and not problems:
        raise BundleError(f"adapter_dir {adapter_dir} holds no adapter file (*.py): is it the right directory?",
                          path=adapter_dir)
    if kernels_dir:
        files += scan_dir(_check_dir("kernels_dir", kernels_dir), "kernels", exclude, problems)
    for rel, source in sorted((extra_files or {}).items()):
        if not valid_bundle_path(rel) or rel.split("/")[0] in ("adapter", "kernels"):
            problems.append(f"extra file name {rel!r} must be a relative path outside adapter/ and kernels/")
            continue
        if not os.path.isfile(source):
            problems.append(f"{rel}: {source} does not exist or is not a file")
            continue
        st = os.stat(source)
        problem = _read_problem(source, st)
        if problem:
            problems.append(f"{rel} ({source}) {problem}")
            continue
        files.append(BundleFile(rel, source, st.st_size, sha256_file(source)))
    if problems:
        raise BundleError(f"the adapter bundle cannot be built: {'; '.join(problems)}", problems=problems)
    files.sort(key=lambda f: f.path)
    bundle = Bundle(files)
    bundle.pins = check_pins(files, pins or {})
    return bundle


def check_pins(files: List[BundleFile], pins: Dict[str, str]) -> List[dict]:
    """Every pinned file must be in the bundle with exactly its pinned sha256; all violations in one error."""
    by_path = {f.path: f for f in files}
    results, problems = [], []
    for path, want in sorted(pins.items()):
        want = str(want).strip().lower()
        if not SHA256_RE.match(want):
            problems.append(f"the pin of {path} is not a sha256 (64 hex digits): {want!r}")
            continue
        got = by_path.get(path)
        if got is None:
            near = [p for p in by_path if p.rsplit("/", 1)[-1] == path.rsplit("/", 1)[-1]]
            hint = f" (did you mean {', '.join(near)}? pins name bundle paths like adapter/<file>)" if near else \
                " (pins name bundle paths like adapter/<file> or kernels/<file>)"
            problems.append(f"pinned file {path} is not in the bundle{hint}")
            continue
        ok = got.sha256 == want
        results.append({"path": path, "pinned": want, "sha256": got.sha256, "ok": ok})
        if not ok:
            problems.append(f"pin violated: {path} has sha256 {got.sha256}, pinned {want}")
    if problems:
        raise BundleError(
            "the adapter bundle breaks its pins (adapters_pins), nothing was copied: " + "; ".join(problems)
            + ". Restore the pinned file (the local wo_a_w8.py must never be replaced by the TP4 one) "
              "or change the pin deliberately.", pins=results, problems=problems)
    return results


# ---------------------------------------------------------------- manifests on nodes and in images

def parse_manifest(data) -> dict:
    """A manifest dict (or its JSON text), checked: format, paths, sizes, hashes and the bundle hash."""
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise BundleError(f"the bundle manifest is not JSON: {exc}")
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("files"), list):
        raise BundleError(f"the bundle manifest is not a format-{FORMAT} sparkfleet manifest")
    for entry in data["files"]:
        if not isinstance(entry, dict) or not valid_bundle_path(str(entry.get("path", ""))) \
                or not SHA256_RE.match(str(entry.get("sha256", ""))) or not isinstance(entry.get("size"), int):
            raise BundleError(f"the bundle manifest has a bad entry: {entry!r}")
    if bundle_hash(data["files"]) != data.get("bundle"):
        raise BundleError(f"the bundle manifest's hash {data.get('bundle')} does not match its files "
                          f"({bundle_hash(data['files'])})")
    return data


def managed_roots(manifest: dict) -> Tuple[List[str], List[str]]:
    """The directories a bundle owns in a build context (every file under them is the bundle's) and its
    top-level files."""
    dirs, tops = set(), set()
    for entry in manifest["files"]:
        head, sep, _ = entry["path"].partition("/")
        (dirs if sep else tops).add(head)
    return sorted(dirs), sorted(tops)


def context_state(context: str, manifest: dict) -> dict:
    """How a build context differs from a manifest: files missing or different, and files that are not in
    the bundle under the directories it owns (to remove)."""
    want = {e["path"]: e for e in manifest["files"]}
    differing = []
    for path, entry in sorted(want.items()):
        full = os.path.join(context, path)
        if not os.path.isfile(full) or os.path.islink(full):
            differing.append({"path": path, "want": entry["sha256"], "have": None})
            continue
        have = sha256_file(full)
        if have != entry["sha256"]:
            differing.append({"path": path, "want": entry["sha256"], "have": have})
    extras = []
    dirs, _ = managed_roots(manifest)
    for top in dirs:
        base = os.path.join(context, top)
        if not os.path.isdir(base):
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for name in sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                rel = os.path.relpath(os.path.join(dirpath, name), context).replace(os.sep, "/")
                if rel not in want:
                    extras.append(rel)
    manifest_file = os.path.join(context, MANIFEST_NAME)
    try:
        with open(manifest_file) as fh:
            manifest_ok = fh.read() == manifest_text(manifest)
    except OSError:
        manifest_ok = False
    return {"differing": differing, "extras": extras, "manifest_ok": manifest_ok}


def remove_extras(context: str, extras: List[str], manifest: dict) -> None:
    """Delete files the bundle does not list from the directories it owns, then their empty folders."""
    for rel in extras:
        full = os.path.join(context, rel)
        if os.path.islink(full) or os.path.isfile(full):
            os.unlink(full)
        elif os.path.isdir(full):
            for dirpath, _, filenames in os.walk(full, topdown=False):
                for name in filenames:
                    os.unlink(os.path.join(dirpath, name))
                os.rmdir(dirpath)
    dirs, _ = managed_roots(manifest)
    keep = {os.path.dirname(os.path.join(context, e["path"])) for e in manifest["files"]}
    for top in dirs:
        for dirpath, _, _ in sorted(os.walk(os.path.join(context, top)), key=lambda t: -len(t[0])):
            if dirpath not in keep and not any(k.startswith(dirpath + os.sep) for k in keep):
                try:
                    os.rmdir(dirpath)
                except OSError as exc:
                    if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                        raise


# ---------------------------------------------------------------- the archive that carries a bundle to the nodes

def archive_bytes(bundle: Bundle) -> bytes:
    """An uncompressed tar of the bundle's files and its manifest, byte-identical for the same bundle (sorted
    members, mtime 0, root-owned, modes 0644): one file to copy to every node instead of one copy per file."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        members = [(f.path, open(f.source, "rb").read()) for f in bundle.files]
        members.append((MANIFEST_NAME, bundle.manifest_text().encode()))
        for path, data in sorted(members):
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime, info.uid, info.gid = len(data), 0o644, 0, 0, 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def write_archive(bundle: Bundle, directory: str) -> dict:
    """Write ``<directory>/bundle-<hash12>.tar`` unless it already holds exactly these bytes."""
    data = archive_bytes(bundle)
    # The files were hashed when the bundle was built; a file that changed since would make a wrong archive.
    check = read_archive_bytes(data, bundle.manifest())
    if len(check) != len(bundle.files) + 1:
        raise BundleError("the bundle's files changed while the archive was written: run again")
    path = os.path.join(directory, f"bundle-{bundle.hash[:SHORT]}.tar")
    sha = hashlib.sha256(data).hexdigest()
    if os.path.isfile(path) and sha256_file(path) == sha:
        return {"path": path, "sha256": sha, "bytes": len(data), "written": False}
    os.makedirs(directory, exist_ok=True)
    write_atomic(path, data, 0o644)
    # The manifest beside it, readable without unpacking (the run's evidence of what was deployed).
    write_atomic(os.path.join(directory, f"bundle-{bundle.hash[:SHORT]}.json"), bundle.manifest_text().encode(), 0o644)
    return {"path": path, "sha256": sha, "bytes": len(data), "written": True}


def read_archive_bytes(data: bytes, manifest: dict) -> Dict[str, bytes]:
    """{bundle path: bytes} from an archive, each checked against the manifest (and the manifest file itself)."""
    want = {e["path"]: e for e in manifest["files"]}
    out: Dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for info in tar.getmembers():
                if not info.isreg():
                    raise BundleError(f"the bundle archive holds {info.name}, which is not a regular file")
                if info.name != MANIFEST_NAME and info.name not in want:
                    raise BundleError(f"the bundle archive holds {info.name}, which its manifest does not list")
                out[info.name] = tar.extractfile(info).read()
    except tarfile.TarError as exc:
        raise BundleError(f"the bundle archive cannot be read: {exc}")
    for path, entry in want.items():
        got = out.get(path)
        if got is None or hashlib.sha256(got).hexdigest() != entry["sha256"] or len(got) != entry["size"]:
            raise BundleError(f"the bundle archive's {path} does not match the manifest (sha256 {entry['sha256']})")
    if out.get(MANIFEST_NAME) != manifest_text(manifest).encode():
        raise BundleError("the bundle archive's manifest is not the manifest of this bundle")
    return out


def read_archive(path: str, manifest: dict) -> Dict[str, bytes]:
    try:
        with open(path, "rb") as fh:
            return read_archive_bytes(fh.read(), manifest)
    except OSError as exc:
        raise BundleError(f"cannot read the bundle archive {path}: {exc.strerror or exc}", path=path)


def _text(data: Optional[bytes]) -> str:
    if data is None:
        return "(absent)\n"
    if len(data) > 65536 or b"\0" in data:
        return f"({len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()})\n"
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return f"({len(data)} bytes of binary, sha256 {hashlib.sha256(data).hexdigest()})\n"
    return text if text.endswith("\n") else text + "\n"


FILE_MODE, DIR_MODE = 0o644, 0o755


def sync_context(context: str, manifest: dict, contents: Optional[Dict[str, bytes]],
                 owner: Optional[Tuple[int, int]], check_mode: bool, preview: Optional[Dict[str, str]] = None) -> dict:
    """Make the build context hold exactly the bundle: every manifest file (mode 0644) and the manifest file,
    nothing else under the directories the bundle owns. Without ``contents`` (check mode before the archive
    reached the node) files are compared by sha256 only. Returns written, removed and a text diff."""
    want = {e["path"]: e for e in manifest["files"]}
    want_bytes = dict(contents or {})
    if contents is None:
        # Check mode before the archive reached the node: the controller's preview shows text content.
        for path, text in (preview or {}).items():
            if path in want and hashlib.sha256(text.encode()).hexdigest() == want[path]["sha256"]:
                want_bytes[path] = text.encode()
        want_bytes[MANIFEST_NAME] = manifest_text(manifest).encode()
    targets = sorted(set(want) | {MANIFEST_NAME})
    written, before, after = [], [], []
    for rel in targets:
        full = os.path.join(context, rel)
        expected_sha = want[rel]["sha256"] if rel in want else hashlib.sha256(want_bytes[rel]).hexdigest()
        have = None
        if os.path.isfile(full) and not os.path.islink(full):
            with open(full, "rb") as fh:
                have = fh.read()
            if hashlib.sha256(have).hexdigest() == expected_sha and stat.S_IMODE(os.stat(full).st_mode) == FILE_MODE:
                continue
        elif os.path.isdir(full) and not os.path.islink(full):
            raise BundleError(f"{full} is a directory where the bundle has a file; move it away")
        written.append(rel)
        new = want_bytes.get(rel)
        before.append(f"== {rel}\n" + _text(have))
        after.append(f"== {rel}\n" + (_text(new) if new is not None else f"(sha256 {expected_sha})\n"))
        if check_mode:
            continue
        if new is None:
            raise BundleError(f"no content for {rel}: the bundle archive is missing")
        _makedirs(context, os.path.dirname(rel), owner)
        if os.path.islink(full):
            os.unlink(full)
        write_atomic(full, new, FILE_MODE, owner)
    extras = context_state(context, manifest)["extras"] if os.path.isdir(context) else []
    for rel in extras:
        before.append(f"== {rel}\n(not in the bundle)\n")
        after.append(f"== {rel}\n(absent)\n")
    if extras and not check_mode:
        remove_extras(context, extras, manifest)
    return {"written": written, "removed": extras, "diff": {"before": "".join(before), "after": "".join(after)}}


def _makedirs(context: str, rel_dir: str, owner: Optional[Tuple[int, int]]) -> None:
    path = context
    for part in [p for p in rel_dir.split("/") if p]:
        path = os.path.join(path, part)
        if not os.path.isdir(path):
            os.mkdir(path, DIR_MODE)
            os.chmod(path, DIR_MODE)
            if owner:
                os.chown(path, *owner)
