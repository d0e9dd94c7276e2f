#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# sparkfleet: pack one rank's Engram shards (docs/reference.md section 3). Logic: module_utils/engram_packer.py.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: engram_pack
short_description: Pack one rank's Engram rows into C(engram-l{L}-r{r}of{tp}.bin) shards
description:
  - Reads the Engram tensors C(layers.{L}.engram.embed.weight) (F8_E4M3, [N, 256]) and
    C(layers.{L}.engram.embed.scale) (F8_E8M0, [N, 8]) of a DeepSeek-V4.1-Flash safetensors checkpoint and
    writes this rank's rows, [N*rank//tp, N*(rank+1)//tp), in the packed format the engine loads from
    C(/engram) - a 4096-byte header, then 264-byte rows (256 weight bytes, then 8 scale bytes).
  - Every size comes from the checkpoint headers. The module refuses when the bytes still to write plus
    O(margin_bytes) exceed the space available in O(dest), naming host, path and both numbers.
  - Streams in chunks through fixed buffers (memory does not grow with the shard), drops source and
    destination pages from the page cache as it goes (on GB10 page cache is GPU memory), writes
    C(.partial), verifies, fsyncs, renames to C(.bin) and fsyncs the directory. A C(.bin) is therefore
    complete and verified, or absent, whatever interrupts the pack.
  - An interrupted C(.partial) resumes after its last chunk that still matches the source. A valid C(.bin)
    is left alone (C(changed=false)). An invalid C(.bin) is never overwritten unless O(replace_invalid).
  - Progress (rows done, bytes/s, ETA) goes to C(engram-l{L}-r{r}of{tp}.progress.json) next to the partial,
    rewritten atomically about once a second and marked C(done) at the end, so a play can poll an async task.
  - On a worker the checkpoint is only visible inside a container that mounts the C(dsv41-weights) docker
    volume. With O(checkpoint_volume) the same packer runs inside O(container_image) with that volume
    mounted read-only, like the recipe's C(./start.sh pack).
  - O(dest) must exist, be a directory and not be a symlink into another volume.
version_added: "1.0.0"
author: sparkfleet contributors (!UNKNOWN)
extends_documentation_fragment:
  - engram_rank
options:
  checkpoint:
    description:
      - Directory holding C(model.safetensors.index.json) and the shards, on this host (direct mode).
      - Exactly one of O(checkpoint) and O(checkpoint_volume) is required.
    type: path
  layers:
    description: Engram layers to pack.
    type: list
    elements: int
    default: [1, 14]
  margin_bytes:
    description: Free space that must remain on the volume after the pack.
    type: int
    default: 1073741824
  chunk_rows:
    description:
      - Rows per streamed chunk (264 bytes each). Memory is about 3 x chunk x 264 bytes plus a fixed part;
        the page cache holds about one chunk of the destination and none of the source (read with O_DIRECT).
      - Raise it (e.g. 65536) when the checkpoint is read over NFS.
    type: int
    default: 16384
  verify:
    description:
      - After writing, C(sample) compares header, size and 1024 rows spread over the range (first and last
        included) byte for byte with the checkpoint; C(full) compares every row; C(none) checks header and
        size only.
    type: str
    choices: [none, sample, full]
    default: sample
  resume:
    description: Resume an interrupted C(.partial) instead of starting it again.
    type: bool
    default: true
  nice:
    description: Run at the lowest CPU priority (nice 19) and IO priority best-effort/7, best effort.
    type: bool
    default: true
  replace_invalid:
    description: Repack over a C(.bin) that exists but is invalid (wrong header, size or range).
    type: bool
    default: false
  container_image:
    description: Engine image whose C(python3) runs the packer in container mode (e.g. C(dsv41-3x-spark:local)).
    type: str
  checkpoint_volume:
    description:
      - Docker volume holding the checkpoint (e.g. C(dsv41-weights)). Selects container mode.
    type: str
  container_checkpoint_path:
    description: Where the volume is mounted (read-only) inside the container.
    type: str
    default: /models/DeepSeek-V4.1-Flash
  packer_dir:
    description:
      - Host directory holding the packer's files (C(engram_packer.py) and the modules it imports), mounted
        read-only into the container.
      - By default the module writes its own copy of them (the module_utils it was shipped with, byte for
        byte) to a private temporary directory for the run and removes it afterwards; set this only to run
        a packer installed elsewhere.
    type: path
attributes:
  check_mode:
    support: full
    description: Reads headers and the disk, computes every shard, byte count and failure; writes nothing.
  diff_mode:
    support: full
    description: "One line per shard, e.g. C(engram-l1-r0of3.bin: absent -> valid (12345 rows, 3260928 bytes))." 
notes:
  - Run it with C(async) and C(poll=0), and read the C(*.progress.json) files to show the progress of a
    long pack.
  - In container mode, killing the task does not stop the container (C(sparkfleet-pack-l1-14-r{rank}));
    a new run fails on the directory lock until that container ends (C(docker stop) it to abort).
"""

EXAMPLES = r"""
- name: Pack this rank's Engram shards (checkpoint on this host)
  engram_pack:
    checkpoint: /home/mia/models/DeepSeek-V4.1-Flash
    dest: /home/mia/dsv41-engram
    rank: 0
    tp: 3
  async: 7200
  poll: 0
  register: pack_job

- name: Pack on a worker that sees the checkpoint only through the NFS docker volume
  engram_pack:
    checkpoint_volume: dsv41-weights
    container_image: dsv41-3x-spark:local
    dest: /home/zurih/dsv41-3x-spark/engram
    rank: "{{ node_rank | int }}"
    tp: 3
    chunk_rows: 65536
    margin_bytes: "{{ 2 * 1024 ** 3 }}"

- name: How much would be written, and does it fit? (read-only)
  engram_pack:
    checkpoint: /home/mia/models/DeepSeek-V4.1-Flash
    dest: /home/mia/dsv41-engram
    rank: 0
    tp: 3
  check_mode: true
  register: pack_plan
"""

RETURN = r"""
shards:
  description: One entry per layer.
  returned: always (empty when the inputs could not be read)
  type: list
  elements: dict
  contains:
    layer:
      description: Engram layer.
      type: int
      sample: 1
    path:
      description: The packed shard on this host.
      type: str
      sample: /home/mia/dsv41-engram/engram-l1-r0of3.bin
    partial_path:
      description: Its partial while being written.
      type: str
      sample: /home/mia/dsv41-engram/engram-l1-r0of3.partial
    progress_path:
      description: Progress file next to it.
      type: str
      sample: /home/mia/dsv41-engram/engram-l1-r0of3.progress.json
    lo:
      description: First row (inclusive).
      type: int
      sample: 0
    hi:
      description: Last row (exclusive).
      type: int
      sample: 40001
    n:
      description: Rows of the layer in the checkpoint.
      type: int
      sample: 120003
    rows:
      description: hi - lo.
      type: int
      sample: 40001
    bytes:
      description: Exact size of the packed shard, 4096 + rows * 264.
      type: int
      sample: 10564360
    state_before:
      description: absent, partial, valid or invalid.
      type: str
      sample: absent
    reason_before:
      description: Why (invalid or partial), or empty.
      type: str
      sample: "resumable at row 16384 of 40001"
    state_after:
      description: State after the run (predicted in check mode).
      type: str
      sample: valid
    action:
      description: skip, write, resume, finish, replace or refuse.
      type: str
      sample: write
    resume_rows:
      description: Rows kept from the partial.
      type: int
      sample: 0
    partial_rows:
      description: Rows the partial holds on disk after this run (0 once the shard is valid or absent).
      type: int
      sample: 0
    required_bytes:
      description: Bytes this shard still needed before the run.
      type: int
      sample: 10564360
    written_bytes:
      description: Bytes written in this run.
      type: int
      sample: 10564360
    seconds:
      description: Time spent on this shard in this run (null when not written).
      type: float
      sample: 1.8
    mb_per_s:
      description: Written MB (10^6 bytes) per second in this run (null when not written).
      type: float
      sample: 412.3
    verify:
      description: Verification mode applied.
      type: str
      sample: sample
    verified_rows:
      description: Rows compared with the checkpoint.
      type: int
      sample: 1024
    verify_seconds:
      description: Time the verification took, included in RV(shards[].seconds) (null when not written).
      type: float
      sample: 0.4
required_bytes:
  description: Bytes still to write for this rank before the run (missing shards plus the rest of partial ones).
  returned: always
  type: int
  sample: 67645000000
available_bytes:
  description:
    - Free bytes of O(dest) for an unprivileged writer (statvfs f_bavail * f_frsize, on this host), measured
      before writing; the free-space rule compares it with RV(required_bytes) + O(margin_bytes).
  returned: always
  type: int
  sample: 81604378624
available_bytes_after:
  description: Free bytes of O(dest) after the run (as RV(available_bytes)), when something was written.
  returned: when the pack wrote (or tried to write)
  type: int
  sample: 60475891712
dest:
  description: The destination on this host.
  returned: always
  type: str
  sample: /home/zurih/dsv41-3x-spark/engram
checkpoint:
  description: The checkpoint directory, or C(volume:path) in container mode.
  returned: always
  type: str
  sample: dsv41-weights:/models/DeepSeek-V4.1-Flash
rank:
  description: The rank packed.
  returned: when the inputs could be read
  type: int
  sample: 1
tp:
  description: The tensor parallel size packed for.
  returned: when the inputs could be read
  type: int
  sample: 3
layers:
  description: The layers packed.
  returned: when the inputs could be read
  type: list
  elements: int
  sample: [1, 14]
check_mode:
  description: Whether this was a check-mode run (nothing written).
  returned: when the inputs could be read
  type: bool
  sample: false
margin_bytes:
  description: The margin applied.
  returned: always
  type: int
  sample: 1073741824
summary:
  description: One line per shard, C(<name>) colon C(<before> -> <after>).
  returned: when the shards could be planned
  type: list
  elements: str
  sample: ["engram-l1-r0of3.bin: absent -> valid (40001 rows, 10564360 bytes)"]
priority:
  description: CPU and IO priority applied when O(nice) (best effort).
  returned: when something was written with O(nice)
  type: dict
  sample: {nice: "19", ioprio: best-effort/7}
host:
  description: Host name used in messages.
  returned: always
  type: str
  sample: spark2
container:
  description: Container mode only; the name, the argv run and its exit code.
  returned: when O(checkpoint_volume) is set
  type: dict
  sample: {name: sparkfleet-pack-l1-14-r1, rc: 0, argv: [docker, run, "..."]}
msg:
  description: What happened, or what failed and what to do.
  returned: always
  type: str
  sample: Packed layer 1 (write), layer 14 (write) for rank 1 of tp 3 in /home/zurih/dsv41-3x-spark/engram.
"""

import json
import os
import re
import shutil
import socket
import sys
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.engram_packer import (
    DEFAULT_CHUNK_ROWS, DEFAULT_MARGIN_BYTES, PACKER_FILES, PackError, PackOptions, available_bytes, check_dest, pack)
from ansible.module_utils import engram_packer

CONTAINER_DEST = "/engram"
CONTAINER_PACKER_DIR = "/opt/sparkfleet-packer"



def container_argv(docker: str, params: dict, check_mode: bool, host: str) -> list:
    """The ``docker run`` command that runs the packer next to the checkpoint volume."""
    layers = params["layers"]
    cpath = params["container_checkpoint_path"]
    argv = [docker, "run", "--rm",
            "--name", "sparkfleet-pack-l%s-r%d" % ("-".join(str(x) for x in layers), params["rank"]),
            "--network", "none",
            "-v", "%s:%s:ro" % (params["checkpoint_volume"], cpath),
            "-v", "%s:%s" % (params["dest"], CONTAINER_DEST),
            "-v", "%s:%s:ro" % (params["packer_dir"], CONTAINER_PACKER_DIR),
            "--entrypoint", "python3", params["container_image"],
            CONTAINER_PACKER_DIR + "/engram_packer.py",
            "--checkpoint", cpath, "--dest", CONTAINER_DEST,
            "--rank", str(params["rank"]), "--tp", str(params["tp"]),
            "--layers", ",".join(str(x) for x in layers),
            "--margin-bytes", str(params["margin_bytes"]), "--chunk-rows", str(params["chunk_rows"]),
            "--verify", params["verify"]]
    if not params["resume"]:
        argv.append("--no-resume")
    if params["replace_invalid"]:
        argv.append("--replace-invalid")
    if params["nice"]:
        argv.append("--nice")
    if check_mode:
        argv.append("--check")
    argv += ["--host-label", host, "--json"]
    return argv


_CONTAINER_DEST_RE = re.compile(r"(?<![\w./-])%s(?=/|[\s.,;:)]|$)" % re.escape(CONTAINER_DEST))


def to_host_paths(result: dict, dest: str) -> dict:
    """Rewrite the container's /engram paths (shard paths, message) to the host's ``dest``."""
    dest = dest.rstrip("/") or "/"
    for shard in result.get("shards") or []:
        for key in ("path", "partial_path", "progress_path"):
            value = shard.get(key)
            if isinstance(value, str) and value.startswith(CONTAINER_DEST + "/"):
                shard[key] = os.path.join(dest, value[len(CONTAINER_DEST) + 1:])
    for key in ("msg",):
        if isinstance(result.get(key), str):
            result[key] = _CONTAINER_DEST_RE.sub(lambda _: dest, result[key])
    if "dest" in result:
        result["dest"] = dest
    return result


def packer_sources() -> dict:
    """{file name: bytes} of the packer as this module was shipped with it (its module_utils, unchanged)."""
    package = engram_packer.__name__.rpartition(".")[0]
    sources = {}
    for name in PACKER_FILES:
        mod = sys.modules.get("%s.%s" % (package, name[:-3])) if package else None
        if mod is None:
            mod = sys.modules[name[:-3]]
        sources[name] = mod.__loader__.get_data(mod.__file__)  # a file, or a member of the AnsiballZ zip
    return sources


def write_packer(directory: str) -> None:
    for name, data in packer_sources().items():
        with open(os.path.join(directory, name), "wb") as handle:
            handle.write(data)


def run_in_container(module: AnsibleModule, host: str) -> dict:
    params = module.params
    check_dest(params["dest"], host)
    if params["packer_dir"]:
        return _run_in_container(module, host, params["packer_dir"])
    directory = tempfile.mkdtemp(prefix="sparkfleet-packer.")
    try:
        os.chmod(directory, 0o755)  # the container's user reads it
        write_packer(directory)
        return _run_in_container(module, host, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _run_in_container(module: AnsibleModule, host: str, packer_dir: str) -> dict:
    params = dict(module.params, packer_dir=packer_dir)
    missing = [name for name in PACKER_FILES if not os.path.isfile(os.path.join(params["packer_dir"], name))]
    if missing:
        raise PackError("The packer is not installed in %s on %s (missing %s): copy the packer's module_utils files "
                        "there, or leave packer_dir unset (the module then ships its own)." % (
                            params["packer_dir"], host, ", ".join(missing)))
    docker = module.get_bin_path("docker")
    if not docker:
        raise PackError("docker is not installed on %s, but checkpoint_volume=%s needs it to reach the checkpoint."
                        % (host, params["checkpoint_volume"]))
    argv = container_argv(docker, params, module.check_mode, host)
    before = available_bytes(params["dest"])  # /engram is this directory: the same filesystem, seen from here
    rc, out, err = module.run_command(argv)
    lines = [line for line in (out or "").splitlines() if line.strip()]
    try:
        result = json.loads(lines[-1])
        if not isinstance(result, dict):
            raise ValueError("not an object")
    except (IndexError, ValueError):
        tail = " ".join((err or out or "").strip().splitlines()[-5:])
        raise PackError("The packer container on %s ended with rc=%d and no result: %s. Check the image %s, the "
                        "volume %s and docker logs." % (host, rc, tail or "no output", params["container_image"],
                                                        params["checkpoint_volume"]),
                        {"container": {"name": argv[argv.index("--name") + 1], "argv": argv, "rc": rc},
                         "available_bytes": before})
    result = to_host_paths(result, params["dest"])
    result["checkpoint"] = "%s:%s" % (params["checkpoint_volume"], params["container_checkpoint_path"])
    result["container"] = {"name": argv[argv.index("--name") + 1], "argv": argv, "rc": rc}
    result["available_bytes"] = before
    if "available_bytes_after" in result:
        result["available_bytes_after"] = available_bytes(params["dest"])
    if rc != 0 or result.get("failed"):
        raise PackError(result.get("msg") or "The packer container on %s failed with rc=%d." % (host, rc), result)
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            checkpoint=dict(type="path"),
            dest=dict(type="path", required=True),
            rank=dict(type="int", required=True),
            tp=dict(type="int", required=True),
            layers=dict(type="list", elements="int", default=[1, 14]),
            margin_bytes=dict(type="int", default=DEFAULT_MARGIN_BYTES),
            chunk_rows=dict(type="int", default=DEFAULT_CHUNK_ROWS),
            verify=dict(type="str", choices=["none", "sample", "full"], default="sample"),
            resume=dict(type="bool", default=True),
            nice=dict(type="bool", default=True),
            replace_invalid=dict(type="bool", default=False),
            container_image=dict(type="str"),
            checkpoint_volume=dict(type="str"),
            container_checkpoint_path=dict(type="str", default="/models/DeepSeek-V4.1-Flash"),
            packer_dir=dict(type="path"),
        ),
        mutually_exclusive=[("checkpoint", "checkpoint_volume")],
        required_one_of=[("checkpoint", "checkpoint_volume")],
        required_together=[("checkpoint_volume", "container_image")],
        supports_check_mode=True,
    )
    params = module.params
    host = socket.gethostname()
    try:
        if params["checkpoint_volume"]:
            result = run_in_container(module, host)
        else:
            result = pack(PackOptions(
                checkpoint=params["checkpoint"], dest=params["dest"], rank=params["rank"], tp=params["tp"],
                layers=params["layers"], margin_bytes=params["margin_bytes"], chunk_rows=params["chunk_rows"],
                verify=params["verify"], resume=params["resume"], nice=params["nice"],
                replace_invalid=params["replace_invalid"], check_mode=module.check_mode, host=host))
    except PackError as exc:
        result = dict(exc.result)
        result.pop("failed", None)
        result.pop("msg", None)
        result.setdefault("host", host)
        result.setdefault("shards", [])
        result.setdefault("required_bytes", 0)
        if result.get("available_bytes") is None:
            try:
                result["available_bytes"] = available_bytes(params["dest"])
            except OSError:
                result["available_bytes"] = None
        if not module._diff:
            result.pop("diff", None)
        module.fail_json(msg=exc.msg, **result)
    result.pop("failed", None)
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
