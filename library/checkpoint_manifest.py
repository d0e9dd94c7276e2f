#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: checkpoint_manifest
short_description: Build a checkpoint manifest (path, size, sha256) and verify a node's view of the checkpoint against it
description:
  - C(state=built) hashes every file under O(path) (hidden names skipped) and returns the manifest. With
    O(previous), a file whose size and mtime are unchanged keeps its hash unless O(full).
  - C(state=verified) checks every manifest entry (exists, readable, size, sha256) and the index completeness
    (every tensor of C(model.safetensors.index.json) in the header of the file it names) and fails, naming
    the host, the file and the problem, when anything is wrong.
  - On the head it reads O(path). On a worker, which sees the checkpoint only through the NFS docker volume,
    it runs the same code inside O(image) with O(volume) mounted at O(container_path), so the worker proves
    that it can read every file it needs through the path its engine uses.
  - A per-node cache (O(cache)) of files verified before lets unchanged files (same size and mtime) skip
    rehashing unless O(full). O(measure) also reads the same files sequentially first and reports both
    throughputs (cold reads, pages dropped before each pass).
  - A manifest that lists a file outside the checkpoint directory is refused before anything is read.
version_added: "0.1.0"
author: sparkfleet contributors (!UNKNOWN)
options:
  state:
    description: C(built) returns a new manifest; C(verified) checks this node against O(manifest).
    type: str
    choices: [built, verified]
    default: verified
  path:
    description: The checkpoint directory on this host (the head's). Required unless O(volume) is set.
    type: path
  volume:
    description: The docker volume through which this host sees the checkpoint (a worker's C(dsv41-weights)).
    type: str
  image:
    description: The image whose python3 runs the verification next to O(volume) (the engine image).
    type: str
  container_path:
    description: Where O(volume) is mounted in the container (the engine's model mount).
    type: str
    default: /models/DeepSeek-V4.1-Flash
  manifest:
    description: The manifest to verify against (C(state=verified)), as returned by C(state=built).
    type: dict
  previous:
    description: An earlier manifest whose hashes unchanged files keep (C(state=built)).
    type: dict
  full:
    description: Rehash every file, ignoring O(previous) and O(cache).
    type: bool
    default: false
  measure:
    description: Read the files sequentially first and report both throughputs (implies a full verification).
    type: bool
    default: false
  measure_rounds:
    description:
      - With O(measure), alternate this many (cold sequential read, cold verification) pairs and compare their
        medians; the last verification is the one reported. More than 1 for a small checkpoint, whose passes
        take tens of milliseconds.
    type: int
    default: 1
  workers:
    description: Parallel readers (0 = twice the CPU count, 2 to 16).
    type: int
    default: 0
  check_index:
    description: Check that every tensor of the index is in its file's header.
    type: bool
    default: true
  cache:
    description: This host's cache of verified files; empty to keep none. Not written in check mode.
    type: path
    default: /var/lib/sparkfleet/checkpoint-verify.json
attributes:
  check_mode:
    support: full
    description: Reads and hashes exactly as without check mode; only the cache file is not written.
  diff_mode:
    support: none
    description: Nothing in the fleet changes.
notes:
  - Standard library only on the host; container mode needs C(docker) and an image with C(python3).
"""

EXAMPLES = r"""
- name: Build the manifest on the head
  checkpoint_manifest:
    state: built
    path: /srv/models/DeepSeek-V4.1-Flash
  register: built

- name: Verify the head's checkpoint
  checkpoint_manifest:
    path: /srv/models/DeepSeek-V4.1-Flash
    manifest: "{{ built.manifest }}"

- name: Verify what a worker reads through its NFS docker volume
  checkpoint_manifest:
    volume: dsv41-weights
    image: dsv41-3x-spark:local
    manifest: "{{ built.manifest }}"
"""

RETURN = r"""
manifest:
  description: The manifest (C(state=built)) with C(files) (path, size, mtime_ns, sha256), C(total_bytes) and C(digest).
  returned: state=built
  type: dict
  sample: {"version": 1, "root": "/srv/models/DeepSeek-V4.1-Flash", "digest": "5be0...",
           "files": [{"path": "model-00001-of-00048.safetensors", "size": 4352, "mtime_ns": 1764390000000000000,
                      "sha256": "9c1e..."}], "total_bytes": 57416704}
files:
  description: Files in the manifest.
  returned: always
  type: int
  sample: 49
hashed_files:
  description: Files hashed in this run (the others were unchanged and cached or reused).
  returned: always
  type: int
  sample: 49
hashed_bytes:
  description: Bytes hashed in this run.
  returned: always
  type: int
  sample: 57416704
cached_files:
  description: Files that were unchanged since this host last verified them (not rehashed).
  returned: state=verified
  type: int
  sample: 0
problems:
  description: Per bad file, its path, the kind (missing, unreadable, size, sha256, index, header) and the detail.
  returned: state=verified
  type: list
  elements: dict
  sample: [{"path": "model-00004-of-00048.safetensors", "kind": "sha256",
            "detail": "sha256 1f0c..., the manifest says 9ab2... (same size: corrupted content)"}]
ok:
  description: Whether every file verified and the index is complete.
  returned: state=verified
  type: bool
  sample: true
through:
  description: How this host read the checkpoint (C(path) or C(volume:<name>)).
  returned: always
  type: str
  sample: "volume:dsv41-weights"
measure:
  description: With O(measure), sequential read and verification throughputs and their ratio (verify / read).
  returned: state=verified
  type: dict
  sample: {"read_mb_per_s": 1180.2, "verify_mb_per_s": 1105.4, "ratio": 0.937}
seconds:
  description: Wall time of the work.
  returned: always
  type: float
  sample: 0.42
"""

import inspect
import json
import os
import shutil
import socket
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils import checkpoint_manifest as cm
from ansible.module_utils import safetensors_header as sh

TOOL_DIR = "/opt/sparkfleet-manifest"


def _source(mod) -> str:
    try:
        return inspect.getsource(mod)
    except (OSError, TypeError):
        return mod.__loader__.get_source(mod.__name__)


def _read_cache(path: str):
    if not path:
        return None
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _write_cache(path: str, cache: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".checkpoint-verify.")
    with os.fdopen(fd, "w") as fh:
        json.dump(cache, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def in_container(module: AnsibleModule, p: dict, cache) -> dict:
    """Run the verification inside the image next to the volume, the way a worker's engine reads it."""
    docker = module.get_bin_path("docker")
    if not docker:
        raise cm.ManifestError("docker is not installed, but volume=%s needs it" % p["volume"])
    tmp = tempfile.mkdtemp(prefix="sparkfleet-manifest.")
    try:
        os.chmod(tmp, 0o755)
        for name, mod in (("checkpoint_manifest.py", cm), ("safetensors_header.py", sh)):
            with open(os.path.join(tmp, name), "w") as fh:
                fh.write(_source(mod))
        with open(os.path.join(tmp, "manifest.json"), "w") as fh:
            json.dump(p["manifest"], fh)
        argv = [docker, "run", "--rm", "--network", "none",
                "-v", "%s:%s:ro" % (p["volume"], p["container_path"]),
                "-v", "%s:%s:ro" % (tmp, TOOL_DIR),
                "--entrypoint", "python3", p["image"], TOOL_DIR + "/checkpoint_manifest.py", "verify",
                "--root", p["container_path"], "--manifest", TOOL_DIR + "/manifest.json"]
        if cache is not None:
            with open(os.path.join(tmp, "cache.json"), "w") as fh:
                json.dump(cache, fh)
            argv += ["--cache", TOOL_DIR + "/cache.json"]
        argv += [flag for flag, on in (("--full", p["full"]), ("--measure", p["measure"]),
                                       ("--no-index", not p["check_index"])) if on]
        if p["measure"] and p["measure_rounds"] > 1:
            argv += ["--measure-rounds", str(p["measure_rounds"])]
        if p["workers"]:
            argv += ["--workers", str(p["workers"])]
        argv.append("--json")
        rc, out, err = module.run_command(argv)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lines = [line for line in (out or "").splitlines() if line.strip()]
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = " ".join((err or out or "").strip().splitlines()[-3:])
        raise cm.ManifestError(
            "cannot read the checkpoint through the %s volume: %s. Check the head's NFS export of the model "
            "directory (read-only, with crossmnt, exported to this worker, exporter running) and `docker volume "
            "inspect %s`, then re-run." % (p["volume"], tail.rstrip(".") or "rc=%d, no output" % rc,
                                           p["volume"]))
    if result.get("failed"):
        raise cm.ManifestError("%s (inside %s with volume %s)" % (result.get("msg"), p["image"], p["volume"]))
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", default="verified", choices=["built", "verified"]),
            path=dict(type="path"),
            volume=dict(type="str"),
            image=dict(type="str"),
            container_path=dict(type="str", default="/models/DeepSeek-V4.1-Flash"),
            manifest=dict(type="dict"),
            previous=dict(type="dict"),
            full=dict(type="bool", default=False),
            measure=dict(type="bool", default=False),
            measure_rounds=dict(type="int", default=1),
            workers=dict(type="int", default=0),
            check_index=dict(type="bool", default=True),
            cache=dict(type="path", default="/var/lib/sparkfleet/checkpoint-verify.json"),
        ),
        required_one_of=[("path", "volume")],
        mutually_exclusive=[("path", "volume")],
        required_together=[("volume", "image")],
        required_if=[("state", "verified", ("manifest",))],
        supports_check_mode=True,
    )
    p = module.params
    host = socket.gethostname()
    through = "volume:%s" % p["volume"] if p["volume"] else "path"
    try:
        if p["state"] == "built":
            if p["volume"]:
                raise cm.ManifestError("build the manifest on the head from its directory (path), not through a volume")
            result = cm.build(p["path"], p["previous"], p["full"], p["workers"])
            module.exit_json(changed=False, through=through, **result)
        # Refuse a bad manifest on this host before any file (or any container) is touched.
        cm.check_manifest(p["manifest"], p["container_path"] if p["volume"] else p["path"])
        cache = None if p["full"] else _read_cache(p["cache"])
        if p["volume"]:
            result = in_container(module, p, cache)
        else:
            result = cm.verify(p["path"], p["manifest"], cache, p["full"], p["workers"], p["measure"],
                               p["check_index"], measure_rounds=p["measure_rounds"])
    except (cm.ManifestError, OSError) as exc:
        module.fail_json(msg="%s: %s" % (host, exc), through=through)
    new_cache = result.pop("cache", None)
    if p["cache"] and new_cache is not None and not module.check_mode:
        try:
            _write_cache(p["cache"], new_cache)
        except OSError as exc:
            module.warn("could not keep the verification cache %s: %s" % (p["cache"], exc))
    result["through"] = through
    result["host"] = host
    if not result["ok"]:
        where = "through its %s volume" % p["volume"] if p["volume"] else "in %s" % p["path"]
        module.fail_json(
            msg="%s: %d checkpoint problem(s) %s: %s. Fix: replace the file(s) from a good copy (re-download, "
                "then rebuild the manifest only if the new file is known good); when the head's copy verifies "
                "and a worker's does not, remount that worker's volume." % (
                    host, result["problem_count"], where, cm.describe(result, host).replace(host + ": ", "")),
            **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
