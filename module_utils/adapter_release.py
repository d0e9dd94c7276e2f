"""Adapter releases on one node: the engine image built from a bundle, tested inside itself, tagged by its
bundle hash, put into service by moving the serving tag, and kept (the last N) for rollback.

Plain Python, standard library only (nodes have a bare Debian python3). The build, the in-image test and the move
of the release tag are community.docker's (roles/adapters/tasks/build.yml: ``docker_image`` builds
``<repo>:candidate-<hash12>``, ``docker_container`` runs the test, ``docker_image_tag`` moves the release tag to the
candidate only after a pass), and so is the serving tag's move (``docker_image_tag``) and the pruning
(``docker_image_remove``, roles/adapters/tasks/serve.yml). Here are the decisions around them (``prepare``: the
context and whether to build; ``tested``: the verdict and the record; ``serve``: the move, the adoption, the pruning
and the record after them; ``record_serving`` writes it) and the reads (``docker image inspect``, ``docker
container inspect``, ``docker exec <c> cat`` of the manifest: docs/engine.md says why they stay CLI). The node's
record of releases lives in
``<state_dir>/releases.json``::

    {"format": 1, "serving_image": "dsv41-3x-spark:local",
     "releases": {"<tag>": {"tag", "bundle", "image_id", "base_image", "base_id", "dockerfile_sha256",
                            "built_at", "tested_at", "adopted"}},
     "history": [{"at", "action": "adopt"|"deploy"|"rollback"|"restore", "tag", "image_id", "bundle",
                  "previous"}]}

``previous`` (the rollback selector) is the release that served before the last deploy; selecting it twice
changes nothing the second time. A release's tag is ``<repo>:bundle-<first 12 hex of the bundle hash>``; an
image that served before sparkfleet managed releases is kept as ``<repo>:adopted-<first 12 hex of its id>``.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from ansible.module_utils.adapter_bundle import (
    MANIFEST_NAME, SHORT, BundleError, parse_manifest, read_archive, sync_context)
from ansible.module_utils.file_io import sha256_file, write_atomic

RECORD_FORMAT = 1
RECORD_NAME = "releases.json"
HISTORY_KEEP = 100
# argv, timeout -> rc, stdout, stderr
Runner = Callable[[List[str], Optional[float]], Tuple[int, str, str]]


class ReleaseError(Exception):
    def __init__(self, msg: str, **extra):
        super().__init__(msg)
        self.msg = msg
        self.extra = extra


def subprocess_runner(argv: List[str], timeout: Optional[float] = None) -> Tuple[int, str, str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return 124, out, f"timed out after {timeout:.0f} s"
    except FileNotFoundError as exc:
        return 127, "", str(exc)
    return proc.returncode, proc.stdout, proc.stderr


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def bundle_tag(repo: str, bundle: str) -> str:
    return f"{repo}:bundle-{bundle[:SHORT]}"


def candidate_tag(repo: str, bundle: str) -> str:
    """The tag a bundle's new image is built to; it becomes the release only after its in-image test passed."""
    return f"{repo}:candidate-{bundle[:SHORT]}"


def adopted_tag(repo: str, image_id: str) -> str:
    return f"{repo}:adopted-{image_id.split(':', 1)[-1][:SHORT]}"


def tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


class Docker:
    def __init__(self, run: Runner):
        self._run = run

    def call(self, *argv: str, timeout: Optional[float] = None) -> Tuple[int, str, str]:
        return self._run(["docker", *argv], timeout)

    def image(self, ref: str) -> Optional[dict]:
        rc, out, err = self.call("image", "inspect", ref)
        if rc != 0:
            if "No such image" in (err + out) or "No such object" in (err + out):
                return None
            raise ReleaseError(f"docker image inspect {ref} failed (rc={rc}): {tail(err or out, 4)}")
        data = json.loads(out or "[]")
        return data[0] if data else None

    def image_id(self, ref: str) -> Optional[str]:
        image = self.image(ref)
        return image["Id"] if image else None

    def container(self, name: str) -> Optional[dict]:
        rc, out, _ = self.call("container", "inspect", name)
        if rc != 0:
            return None
        data = json.loads(out or "[]")
        return data[0] if data else None


# ---------------------------------------------------------------- the node's record

def empty_record(serving_image: str) -> dict:
    return {"format": RECORD_FORMAT, "serving_image": serving_image, "releases": {}, "history": []}


def load_record(state_dir: str, serving_image: str) -> dict:
    path = os.path.join(state_dir, RECORD_NAME)
    try:
        with open(path) as fh:
            record = json.load(fh)
    except FileNotFoundError:
        return empty_record(serving_image)
    except ValueError as exc:
        raise ReleaseError(f"{path} is not valid JSON ({exc}); move it away to start a new record", path=path)
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise ReleaseError(f"{path} is not a format-{RECORD_FORMAT} release record; move it away", path=path)
    record.setdefault("releases", {})
    record.setdefault("history", [])
    record["serving_image"] = serving_image
    return record


def record_text(record: dict) -> str:
    return json.dumps(record, sort_keys=True, indent=1) + "\n"


def save_record(state_dir: str, record: dict) -> None:
    os.makedirs(state_dir, mode=0o755, exist_ok=True)
    write_atomic(os.path.join(state_dir, RECORD_NAME), record_text(record))


def activation_order(record: dict) -> List[str]:
    """Release tags, most recently put into service first; releases never in service (built, then another node
    failed) come after them, newest build first."""
    last: Dict[str, int] = {}
    for index, entry in enumerate(record["history"]):
        if entry.get("action") in ("adopt", "deploy", "rollback", "restore"):
            last[entry["tag"]] = index
    return sorted(record["releases"],
                  key=lambda tag: (last.get(tag, -1), record["releases"][tag].get("built_at") or ""), reverse=True)


def release_of_image(record: dict, image_id: Optional[str]) -> Optional[dict]:
    if not image_id:
        return None
    matches = [r for r in record["releases"].values() if r.get("image_id") == image_id]
    matches.sort(key=lambda r: (not r.get("adopted"), r.get("built_at") or ""), reverse=True)
    return matches[0] if matches else None


def previous_tag(record: dict) -> Optional[str]:
    for entry in reversed(record["history"]):
        if entry.get("action") == "deploy":
            return entry.get("previous")
    return None


def resolve(record: dict, selector: str, serving_id: Optional[str]) -> dict:
    """The release a selector names: current, previous, a tag (full or the part after ':'), or a bundle
    hash prefix (12 hex digits or more)."""
    selector = (selector or "current").strip()
    releases = record["releases"]
    if selector == "current":
        rel = release_of_image(record, serving_id)
        if rel is None:
            raise ReleaseError("the serving image is not a recorded release on this node (no deploy yet)")
        return rel
    if selector == "previous":
        tag = previous_tag(record)
        if not tag:
            raise ReleaseError("no previous release is recorded on this node: nothing was deployed over another "
                               "release yet")
        if tag not in releases:
            raise ReleaseError(f"the previous release {tag} is no longer kept on this node (adapters_keep_releases)",
                               tag=tag)
        return releases[tag]
    if selector in releases:
        return releases[selector]
    matches = [r for t, r in releases.items() if t.split(":")[-1] == selector]
    if not matches and re.fullmatch(r"[0-9a-f]{12,64}", selector):
        matches = [r for r in releases.values() if (r.get("bundle") or "").startswith(selector)]
    if len(matches) == 1:
        return matches[0]
    kept = ", ".join(activation_order(record)) or "none"
    if not matches:
        raise ReleaseError(f"release {selector!r} is not kept on this node (kept: {kept})", kept=kept)
    raise ReleaseError(f"release {selector!r} is ambiguous on this node ({', '.join(r['tag'] for r in matches)})")


def describe(record: dict, docker: Docker) -> List[dict]:
    """The kept releases, newest activation first, with whether their tag still points at their image."""
    out = []
    for tag in activation_order(record):
        rel = dict(record["releases"][tag])
        rel["present"] = docker.image_id(tag) == rel.get("image_id")
        out.append(rel)
    return out


# ---------------------------------------------------------------- build and test

def dockerfile_base(path: str) -> str:
    """The first FROM of a Dockerfile (options and ``AS name`` dropped)."""
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError as exc:
        raise ReleaseError(f"cannot read the Dockerfile {path}: {exc.strerror or exc}", path=path)
    for line in text.splitlines():
        parts = line.strip().split()
        if parts and parts[0].upper() == "FROM":
            args = [p for p in parts[1:] if not p.startswith("--")]
            if args and "$" not in args[0]:
                return args[0]
            raise ReleaseError(f"the FROM line of {path} ({line.strip()}) uses a build argument: set base_image")
    raise ReleaseError(f"{path} has no FROM line", path=path)


@dataclass
class BuildRequest:
    context: str
    manifest: dict
    image_repo: str
    state_dir: str
    serving_image: str
    dockerfile: str = "Dockerfile"
    base_image: str = ""
    archive: str = ""                       # the bundle archive on this node (adapter_bundle's archive, copied)
    owner: Optional[Tuple[int, int]] = None  # uid, gid of the files written into the context
    preview: Optional[Dict[str, str]] = None  # check mode without the archive: text content for the diff


def build_reasons(rel: Optional[dict], tag: str, tag_id: Optional[str], bundle: str, base_image: str,
                  base_id: str, dockerfile: str, dockerfile_sha: str) -> List[str]:
    """Why the release image of a bundle must be built (empty: the tagged, tested image is current). ``rel``: the
    node's record of the release tag (None when not recorded); ``tag_id``: the image the tag points at now."""
    if tag_id is None:
        return [f"no image is tagged {tag}"]
    if rel is None:
        return [f"{tag} is not a recorded, tested release"]
    reasons = []
    if rel.get("image_id") != tag_id:
        reasons.append(f"{tag} points at {tag_id[:19]}, not the tested {str(rel.get('image_id'))[:19]}")
    if rel.get("bundle") != bundle:
        reasons.append(f"{tag} holds bundle {rel.get('bundle')}")
    if rel.get("base_id") != base_id:
        reasons.append(f"the base image {base_image} changed ({str(rel.get('base_id'))[:19]} -> {base_id[:19]})")
    if rel.get("dockerfile_sha256") != dockerfile_sha:
        reasons.append(f"{dockerfile} changed")
    if not rel.get("tested_at"):
        reasons.append("the image was never tested")
    return reasons


def prepare(req: BuildRequest, docker: Docker, check_mode: bool) -> dict:
    """Make the context hold exactly the bundle and decide whether its image must be built: not when a tested
    image of the same bundle, base image and Dockerfile holds the release tag. Builds nothing: the build
    (community.docker.docker_image to the candidate tag), the in-image test (docker_container) and the tag
    (docker_image_tag, candidate -> release tag) are the role's tasks; ``tested`` records the result."""
    manifest = parse_manifest(req.manifest)
    bundle = manifest["bundle"]
    tag = bundle_tag(req.image_repo, bundle)
    if not os.path.isdir(req.context):
        raise ReleaseError(f"the build context {req.context} does not exist on this node", context=req.context)
    dockerfile = os.path.join(req.context, req.dockerfile)
    if not os.path.isfile(dockerfile):
        raise ReleaseError(f"the build context has no {req.dockerfile} ({dockerfile})", context=req.context)
    base_image = req.base_image or dockerfile_base(dockerfile)
    base_id = docker.image_id(base_image)
    if base_id is None:
        raise ReleaseError(f"the base image {base_image} (FROM of {dockerfile}) is not on this node; nothing is "
                           "pulled here: load it first", base_image=base_image)
    dockerfile_sha = sha256_file(dockerfile)
    have_archive = bool(req.archive) and os.path.isfile(req.archive)
    if not have_archive and not check_mode:
        raise ReleaseError(f"the bundle archive {req.archive or '(none given)'} is not on this node; copy it first",
                           archive=req.archive)
    contents = read_archive(req.archive, manifest) if have_archive else None
    sync = sync_context(req.context, manifest, contents, req.owner, check_mode, req.preview)
    record = load_record(req.state_dir, req.serving_image)
    tag_id = docker.image_id(tag)
    reasons = build_reasons(record["releases"].get(tag), tag, tag_id, bundle, base_image, base_id, req.dockerfile,
                            dockerfile_sha)
    candidate = candidate_tag(req.image_repo, bundle)
    result = {"tag": tag, "candidate": candidate, "candidate_name": candidate.rsplit(":", 1)[0],
              "candidate_tag": candidate.rsplit(":", 1)[1], "bundle": bundle, "base_image": base_image,
              "base_id": base_id, "dockerfile_sha256": dockerfile_sha, "image_id": tag_id,
              "build": bool(reasons), "build_reasons": reasons, "files": len(manifest["files"]),
              "written": sync["written"], "removed": sync["removed"],
              "changed": bool(sync["written"] or sync["removed"])}
    if sync["written"] or sync["removed"]:
        result["diff"] = sync["diff"]
    return result


def failing_lines(output: str, lines: int = 12) -> str:
    """The lines of a test's output that name what failed (``FAIL ...``), else its last lines."""
    failed = [line.strip() for line in (output or "").splitlines() if line.lstrip().startswith("FAIL")]
    return "; ".join(failed[:lines]) if failed else tail(output or "(no output)", lines)


def tested(state_dir: str, serving_image: str, prepared: dict, image_id: Optional[str], test_status: Optional[int],
           test_output: str, node: str, evidence: str = "", check_mode: bool = False) -> dict:
    """The in-image test's verdict on a new image (``prepared``: what ``prepare`` returned). A pass records the
    release (its tag, which the role has just moved to the candidate's image); anything else fails naming the
    node and the failing test. Nothing is put back: the release tag and the serving tag only ever move after a
    pass, so a failure leaves both where they were."""
    tag, candidate = prepared["tag"], prepared["candidate"]
    if test_status != 0:
        where = f" (output: {evidence})" if evidence else ""
        raise ReleaseError(
            f"{node}: the in-image test of {candidate} ({str(image_id)[:19]}) failed "
            f"({'exit ' + str(test_status) if test_status is not None else 'it did not run'}): "
            f"{failing_lines(test_output)}. {tag} and the serving tag were not moved: this node stays on its "
            f"previous image{where}", tag=tag, candidate=candidate, test_status=test_status, test_output=test_output)
    if not image_id:
        raise ReleaseError(f"{node}: no image id for the tested {candidate}", candidate=candidate)
    record = load_record(state_dir, serving_image)
    before = record_text(record)
    now = now_iso()
    old = record["releases"].get(tag) or {}
    entry = {"tag": tag, "bundle": prepared["bundle"], "image_id": image_id, "base_image": prepared["base_image"],
             "base_id": prepared["base_id"], "dockerfile_sha256": prepared["dockerfile_sha256"],
             "built_at": now, "tested_at": now, "adopted": False, "files": prepared.get("files")}
    same = {k: v for k, v in old.items() if k not in ("built_at", "tested_at")} == \
        {k: v for k, v in entry.items() if k not in ("built_at", "tested_at")} and old.get("tested_at")
    if not same:
        record["releases"][tag] = entry
    changed = record_text(record) != before
    if changed and not check_mode:
        save_record(state_dir, record)
    return {"tag": tag, "candidate": candidate, "bundle": prepared["bundle"], "image_id": image_id,
            "tested": True, "changed": changed}


# ---------------------------------------------------------------- serving and pruning

@dataclass
class ServeRequest:
    image_repo: str
    serving_image: str
    state_dir: str
    release: str
    keep_releases: int = 3
    action: str = "deploy"          # deploy | rollback | restore
    pending: bool = False           # check mode: the release's image would be built by this run first


def serve(req: ServeRequest, docker: Docker, check_mode: bool = True) -> dict:
    """What putting a release into service takes, read-only: the serving tag's move to the release (``moved``),
    the tag that keeps the image it pointed at before as a release (``adopted``, from ``previous_image_id``), the
    release tags to remove beyond keep_releases (``remove``), the bundle archives that go with them
    (``pruned_archives``) and the record after it all (``record``). The role moves and removes the tags with
    community.docker (docker_image_tag, docker_image_remove), then ``record_serving`` writes the record."""
    record = load_record(req.state_dir, req.serving_image)
    before_text = record_text(record)
    serving_id = docker.image_id(req.serving_image)
    if check_mode and req.pending:
        # The image does not exist yet (a check run does not build it): the tag would move to it.
        current = release_of_image(record, serving_id)
        was = current["tag"] if current else None
        return {"serving_image": req.serving_image, "release": req.release, "bundle": "", "image_id": None,
                "previous_image_id": serving_id, "previous_release": was,
                "adopted": adopted_tag(req.image_repo, serving_id) if serving_id and not current else None,
                "moved": True, "pruned": [], "pruned_archives": [], "changed": True, "remove": [], "record": None,
                "releases": [dict(record["releases"][t]) for t in activation_order(record)],
                "diff": {"before": f"{req.serving_image} -> {was or '(not a recorded release)'} ({serving_id or 'absent'})\n",
                         "after": f"{req.serving_image} -> {req.release} (to be built by this run)\n"}}
    target = resolve(record, req.release, serving_id)
    target_id = docker.image_id(target["tag"])
    if target_id != target.get("image_id"):
        raise ReleaseError(f"release {target['tag']} is recorded as {str(target.get('image_id'))[:19]} but the tag "
                           f"{'is missing' if target_id is None else 'points at ' + target_id[:19]} on this node; "
                           "deploy the bundle again to rebuild it", tag=target["tag"])
    result = {"serving_image": req.serving_image, "release": target["tag"], "bundle": target.get("bundle") or "",
              "image_id": target_id, "previous_image_id": serving_id, "previous_release": None,
              "adopted": None, "moved": False, "pruned": []}
    now = now_iso()
    current = release_of_image(record, serving_id)
    actions: List[Tuple[str, ...]] = []
    if serving_id != target_id:
        if serving_id and current is None:
            tag = adopted_tag(req.image_repo, serving_id)
            image = docker.image(serving_id) or {}
            known = [t for t in image.get("RepoTags") or [] if ":bundle-" in t]
            record["releases"][tag] = {"tag": tag, "bundle": "", "image_id": serving_id, "base_image": "",
                                       "base_id": "", "dockerfile_sha256": "", "built_at": now, "tested_at": "",
                                       "adopted": True, "tags_then": known}
            record["history"].append({"at": now, "action": "adopt", "tag": tag, "image_id": serving_id,
                                      "bundle": "", "previous": None})
            actions.append(("tag", serving_id, tag))
            current = record["releases"][tag]
            result["adopted"] = tag
        record["history"].append({"at": now, "action": req.action, "tag": target["tag"], "image_id": target_id,
                                  "bundle": target.get("bundle") or "",
                                  "previous": current["tag"] if current else None})
        actions.append(("tag", target["tag"], req.serving_image))
        result.update(moved=True, previous_release=current["tag"] if current else None)
    else:
        result["previous_release"] = current["tag"] if current else None
    record["history"] = record["history"][-HISTORY_KEEP:]
    # Keep the newest keep_releases by activation; never the one serving or the one it replaced.
    protected = {target["tag"]} | ({result["previous_release"]} if result["previous_release"] else set())
    order = activation_order(record)
    keep = set(order[:max(req.keep_releases, 1)]) | protected
    for tag in order:
        if tag not in keep:
            result["pruned"].append(tag)
            del record["releases"][tag]
            if docker.image_id(tag) is not None:
                actions.append(("rmi", tag))
    # Bundle archives (<state_dir>/bundles) go with their releases; one whose image failed its test goes now too.
    bundles_dir = os.path.join(req.state_dir, "bundles")
    kept_archives = {f"bundle-{r['bundle'][:SHORT]}.tar" for r in record["releases"].values() if r.get("bundle")}
    stale_archives = sorted(n for n in (os.listdir(bundles_dir) if os.path.isdir(bundles_dir) else [])
                            if n.endswith(".tar") and n not in kept_archives)
    result["pruned_archives"] = stale_archives
    after_text = record_text(record)
    changed = bool(actions or stale_archives) or after_text != before_text
    result["releases"] = [dict(record["releases"][t]) for t in activation_order(record)]
    result["changed"] = changed
    result["diff"] = {
        "before": _serving_lines(req.serving_image, serving_id, current["tag"] if current else None, before_text),
        "after": _serving_lines(req.serving_image, target_id, target["tag"], after_text)}
    result["remove"] = [act[1] for act in actions if act[0] == "rmi"]
    result["record"] = record
    return result


def record_serving(state_dir: str, serving_image: str, record: dict, pruned_archives: List[str],
                   check_mode: bool) -> dict:
    """Write the record ``serve`` computed (after the role moved the tags) and remove the pruned bundle archives."""
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise ReleaseError("record is not a format-1 release record (the serving state's record result)")
    record = dict(record, serving_image=serving_image)
    before = load_record(state_dir, serving_image)
    bundles_dir = os.path.join(state_dir, "bundles")
    archives = [n for n in pruned_archives if os.path.basename(n) == n and n.endswith(".tar")
                and os.path.isfile(os.path.join(bundles_dir, n))]
    changed = record_text(before) != record_text(record) or bool(archives)
    if changed and not check_mode:
        for name in archives:
            os.unlink(os.path.join(bundles_dir, name))
        save_record(state_dir, record)
    return {"changed": changed, "pruned_archives": archives}


def _serving_lines(serving_image: str, image_id: Optional[str], tag: Optional[str], text: str) -> str:
    kept = ", ".join(json.loads(text)["releases"]) or "none"
    return f"{serving_image} -> {tag or '(not a recorded release)'} ({image_id or 'absent'})\nkept: {kept}\n"


# ---------------------------------------------------------------- read-only view

def running_bundle(docker: Docker, container: str, manifest_path: str) -> Tuple[Optional[str], str]:
    """The bundle hash the running container's image carries (read inside it), and a note."""
    rc, out, err = docker.call("exec", container, "cat", manifest_path, timeout=30)
    if rc != 0:
        return None, f"no {manifest_path} in the container"
    try:
        return parse_manifest(out)["bundle"], ""
    except BundleError as exc:
        return None, exc.msg


def context_view(context: str, dockerfile: str, base_image: str, lines: List[str], docker: Docker) -> dict:
    """What a build needs from the node, read-only: the Dockerfile, its base image on this node, required lines."""
    path = os.path.join(context, dockerfile)
    view = {"path": context, "dockerfile": path, "exists": os.path.isfile(path), "base_image": None,
            "base_id": None, "missing_lines": [], "problems": []}
    if not view["exists"]:
        view["problems"].append(f"the build context {context} has no {dockerfile} (the recipe checkout the engine "
                                "image is built from)")
        return view
    try:
        view["base_image"] = base_image or dockerfile_base(path)
    except ReleaseError as exc:
        view["problems"].append(exc.msg)
        return view
    view["base_id"] = docker.image_id(view["base_image"])
    if view["base_id"] is None:
        view["problems"].append(f"the base image {view['base_image']} (FROM of {path}) is not on this node; nothing "
                                "is pulled here: load it first")
    with open(path) as fh:
        have = {line.strip() for line in fh}
    view["missing_lines"] = [line for line in lines if line.strip() not in have]
    return view


def query(image_repo: str, serving_image: str, state_dir: str, containers: List[str], docker: Docker,
          selector: str = "", manifest_path: str = "/opt/dsv41/" + MANIFEST_NAME) -> dict:
    record = load_record(state_dir, serving_image)
    serving_id = docker.image_id(serving_image)
    current = release_of_image(record, serving_id)
    prev = previous_tag(record)
    out = {"serving_image": serving_image, "serving_image_id": serving_id,
           "current": current, "previous": record["releases"].get(prev) if prev else None,
           "previous_tag": prev, "releases": describe(record, docker), "containers": [], "resolved": None}
    for name in containers:
        c = docker.container(name)
        if c is None:
            continue
        image_id = c.get("Image")
        status = (c.get("State") or {}).get("Status", "unknown")
        image = docker.image(image_id) if image_id else None
        tags = sorted((image or {}).get("RepoTags") or [])
        rel = release_of_image(record, image_id)
        bundle, note = (running_bundle(docker, name, manifest_path) if status == "running"
                        else ((rel or {}).get("bundle") or None, "not running: bundle from the release record"))
        out["containers"].append({
            "name": name, "status": status, "image": (c.get("Config") or {}).get("Image"), "image_id": image_id,
            "tags": tags, "release": rel["tag"] if rel else None,
            "tag": (rel["tag"] if rel else None) or next((t for t in tags if ":bundle-" in t), None)
            or (c.get("Config") or {}).get("Image"),
            "bundle": bundle, "note": note})
    if selector:
        try:
            rel = resolve(record, selector, serving_id)
            out["resolved"] = dict(rel, present=docker.image_id(rel["tag"]) == rel.get("image_id"))
        except ReleaseError as exc:
            out["resolve_error"] = exc.msg
    return out
