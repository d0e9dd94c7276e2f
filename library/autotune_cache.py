#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: autotune_cache
short_description: Inventory, stamp and invalidate one rank's FlashInfer autotune caches
description:
  - Works on the FlashInfer autotune cache of one host (one TP rank), laid out as
    C(<root>/<flashinfer_version>/<smXY>/<key16>/rank_tp{r}_pp0_dp0.json) with the keep adapter's
    C(rank_tp{r}_pp0_dp0.launch) sidecar next to it. A B(key) is a key directory relative to O(root),
    for example C(0.6.1/sm121/0123456789abcdef).
  - O(state=present) only reads; it returns every key with its files, sidecars, recorded provenance and,
    when O(expected) is given, whether the cache is compatible with the image and environment about to run.
  - O(state=provenance) writes C(sparkfleet-provenance.json) into every key directory that holds this rank's
    cache; the record pins the SHA-256 of the cache and sidecar it describes, so a cache the engine retunes
    later reads as stale, not as trusted.
  - O(state=invalidated) moves the listed O(keys) aside (a rename, never a delete), keeping the
    C(<version>/<sm>/<key16>) structure under O(aside_dir), and records the move in
    C(<aside_dir>/sparkfleet-aside.json). A key already moved or absent is no change.
  - >-
    The fleet rule (docs/reference.md section 4) is that a key is reused only when every rank has a compatible cache;
    otherwise it is invalidated on all ranks together. Run O(state=present) with O(expected) on every rank,
    combine the results with the C(autotune_plan) filter, then run O(state=invalidated) with the plan's
    C(invalidate) list on every rank.
version_added: "0.1.0"
author: sparkfleet contributors (!UNKNOWN)
options:
  root:
    description:
      - The autotune cache root on the host. C(~) expands to the home of the user the module runs as
        (with C(become) that is root's home, so give the serving user's path explicitly then).
    type: path
    default: ~/.cache/sglang/flashinfer/autotune
  rank:
    description:
      - This host's TP rank. Required with O(state=provenance) and O(state=invalidated); with O(state=present)
        it adds the reason "no cache for rank R" to keys that lack this rank's file.
    type: int
  state:
    description:
      - C(present) inventories (read-only), C(provenance) stamps this rank's key directories,
        C(invalidated) moves O(keys) aside.
    type: str
    choices: [present, provenance, invalidated]
    default: present
  provenance:
    description:
      - With O(state=provenance), what produced the cache. Needs C(image_digest), C(flashinfer_version),
        C(engine_version) and C(env_fingerprint); any other keys (kernel versions, adapter hashes) are kept too.
    type: dict
  expected:
    description:
      - The provenance the caller is about to run with. Every key of it must equal the recorded provenance
        for a cache to be compatible; C(flashinfer_version) and C(sm) are also checked against the key's path.
        Without it the C(compatible) field of each RV(keys) entry is null.
    type: dict
  keys:
    description:
      - Key paths relative to O(root). With O(state=invalidated) the keys to move aside (an empty list moves
        nothing); with the other states they restrict the inventory or the stamping to these keys.
    type: list
    elements: str
    default: []
  aside_dir:
    description:
      - Where invalidated keys go. Default is C(autotune-aside/<UTC timestamp>) next to O(root), for the
        default root C(~/.cache/sglang/flashinfer/autotune-aside/20261129T100102Z). Give one value to every rank of a play
        so that all ranks' caches land under the same name. Must be outside O(root).
      - An existing destination is never overwritten; the move goes to C(<dest>.2), C(<dest>.3), ...
    type: path
  reason:
    description:
      - Why the keys are invalidated, recorded with each move in C(sparkfleet-aside.json).
    type: str
attributes:
  check_mode:
    support: full
    description: Inventories, computes the plan (which key directories would move where, which provenance files
      would change) and reports it with C(changed); moves and writes nothing.
  diff_mode:
    support: full
    description: Invalidation shows the key directories before and after with each move's destination;
      provenance shows each provenance file's JSON before and after.
notes:
  - Standard library only on the host. Cache files are small; each is hashed with SHA-256 on every run.
seealso:
  - module: boot_log_info
"""

EXAMPLES = r"""
- name: Inventory this rank's autotune caches against the image about to run
  autotune_cache:
    root: /home/mia/.cache/sglang/flashinfer/autotune
    rank: "{{ node_rank }}"
    expected:
      image_digest: "{{ engine_image_digest }}"
      flashinfer_version: "0.6.1"
      engine_version: "{{ engine_version }}"
      env_fingerprint: "{{ serving_env | to_json | hash('sha256') }}"
  register: autotune_inventory

- name: Decide once which keys every rank may reuse
  ansible.builtin.set_fact:
    autotune_plan: >-
      {{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, 'autotune_inventory')))
         | autotune_plan(dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, 'node_rank'))), 3) }}
  run_once: true

- name: Move incompatible or one-sided caches aside on all ranks together
  autotune_cache:
    root: /home/mia/.cache/sglang/flashinfer/autotune
    rank: "{{ node_rank }}"
    state: invalidated
    keys: "{{ autotune_plan.invalidate }}"
    aside_dir: "/home/mia/.cache/sglang/flashinfer/autotune-aside/{{ run_id }}"
    reason: "{{ autotune_plan.reasons | to_json }}"

- name: After a boot that tuned, record what produced the caches
  autotune_cache:
    root: /home/mia/.cache/sglang/flashinfer/autotune
    rank: "{{ node_rank }}"
    state: provenance
    provenance:
      image_digest: "{{ engine_image_digest }}"
      flashinfer_version: "0.6.1"
      engine_version: "{{ engine_version }}"
      env_fingerprint: "{{ serving_env | to_json | hash('sha256') }}"
      kernel: "{{ ansible_kernel | default('') }}"
"""

RETURN = r"""
root:
  description: The cache root, expanded.
  returned: always
  type: str
  sample: /home/mia/.cache/sglang/flashinfer/autotune
root_exists:
  description: Whether the root directory exists (a missing root is an empty inventory, not an error).
  returned: always
  type: bool
  sample: true
rank:
  description: The O(rank) option.
  returned: always
  type: int
  sample: 0
keys:
  description:
    - Key directories after the run (in check mode, as they would be), each with its cache files, sidecars,
      recorded provenance and compatibility with O(expected).
    - C(sidecars[].content_sha256) is the fingerprint the sidecar holds (null if it is not a sha256).
  returned: always
  type: list
  elements: dict
  sample:
    - key: 0.6.1/sm121/0123456789abcdef
      path: /home/mia/.cache/sglang/flashinfer/autotune/0.6.1/sm121/0123456789abcdef
      flashinfer_version: 0.6.1
      sm: sm121
      key16: 0123456789abcdef
      files: [{name: rank_tp0_pp0_dp0.json, rank: 0, bytes: 2120, sha256: "9f2c...e1"}]
      sidecars: [{name: rank_tp0_pp0_dp0.launch, rank: 0, sha256: "51aa...07", content_sha256: "3b9d...c4"}]
      other_files: []
      ranks_present: [0]
      provenance: {image_digest: "sha256:5c1d...", flashinfer_version: 0.6.1, engine_version: 0.5.6, env_fingerprint: "3b9d...c4"}
      compatible: false
      reasons: ["image_digest differs: cache 'sha256:5c1d...', about to run 'sha256:77ab...'"]
unexpected:
  description: Paths under O(root) that do not fit C(<version>/<smXY>/<key16>) (left alone).
  returned: always
  type: list
  elements: str
  sample: ["0.6.1/sm121/tmp-download"]
moves:
  description: With O(state=invalidated), one entry per requested key; C(state) is C(moved), C(planned)
    (check mode) or C(absent) (nothing to move).
  returned: when state is invalidated
  type: list
  elements: dict
  sample: [{key: 0.6.1/sm121/0123456789abcdef, src: /home/mia/.cache/sglang/flashinfer/autotune/0.6.1/sm121/0123456789abcdef,
            dest: /home/mia/.cache/sglang/flashinfer/autotune-aside/20261129T100102Z/0.6.1/sm121/0123456789abcdef,
            files: [rank_tp0_pp0_dp0.json, rank_tp0_pp0_dp0.launch], state: moved}]
aside_dir:
  description: Where invalidated keys go.
  returned: when state is invalidated
  type: str
  sample: /home/mia/.cache/sglang/flashinfer/autotune-aside/20261129T100102Z
provenance_written:
  description: With O(state=provenance), one entry per key directory of this rank; C(changed) says whether the
    file was (or, in check mode, would be) written.
  returned: when state is provenance
  type: list
  elements: dict
  sample: [{key: 0.6.1/sm121/0123456789abcdef, path: /home/mia/.cache/sglang/flashinfer/autotune/0.6.1/sm121/0123456789abcdef/sparkfleet-provenance.json, changed: true}]
msg:
  description: One line saying what happened.
  returned: always
  type: str
  sample: "rank 0: moved 2 key directories aside to /home/mia/.cache/sglang/flashinfer/autotune-aside/20261129T100102Z"
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.autotune_store import (
    DEFAULT_ROOT,
    AutotuneError,
    apply_invalidation,
    apply_provenance,
    assess,
    default_aside_dir,
    describe_keys,
    inventory,
    plan_invalidation,
    plan_provenance,
    public,
    validate_key,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", default=DEFAULT_ROOT),
            rank=dict(type="int"),
            state=dict(type="str", default="present", choices=["present", "provenance", "invalidated"]),
            provenance=dict(type="dict"),
            expected=dict(type="dict"),
            keys=dict(type="list", elements="str", default=[], no_log=False),
            aside_dir=dict(type="path"),
            reason=dict(type="str"),
        ),
        required_if=[("state", "provenance", ("rank", "provenance")), ("state", "invalidated", ("rank",))],
        supports_check_mode=True,
    )
    p = module.params
    root = os.path.abspath(os.path.expanduser(p["root"]))
    rank, state, expected = p["rank"], p["state"], p["expected"]
    result = dict(changed=False, root=root, rank=rank, state=state)
    if rank is not None and rank < 0:
        module.fail_json(msg=f"rank must be 0 or more, got {rank}.", **result)
    try:
        keys = [validate_key(k) for k in p["keys"]]
    except AutotuneError as exc:
        module.fail_json(msg=f"Bad keys option: {exc}.", **result)
    only = keys if keys and state != "invalidated" else None

    try:
        before = inventory(root, rank, expected, only)
    except OSError as exc:
        module.fail_json(msg=f"rank {rank}: cannot read the autotune cache under {root}: {exc}.", **result)
    diff = None

    if state == "invalidated":
        aside = os.path.abspath(os.path.expanduser(p["aside_dir"])) if p["aside_dir"] else default_aside_dir(root)
        try:
            moves = plan_invalidation(root, keys, aside)
        except AutotuneError as exc:
            module.fail_json(msg=f"rank {rank}: {exc}.", **result)
        planned = [m for m in moves if m.state == "planned"]
        result["changed"] = bool(planned)
        moved_keys = {m.key for m in planned}
        remaining = [e for e in before["entries"] if e["key"] not in moved_keys]
        diff = {
            "before_header": f"{root} (key directories)",
            "after_header": f"{root} (key directories)",
            "before": describe_keys(before["entries"]),
            "after": describe_keys(remaining) + "".join(f"moved aside: {m.key} -> {m.dest}\n" for m in planned),
        }
        if planned and not module.check_mode:
            try:
                apply_invalidation(moves, rank, p["reason"], aside)
            except OSError as exc:
                done = [m.as_dict() for m in moves if m.state == "moved"]
                module.fail_json(msg=f"rank {rank}: moving autotune caches aside to {aside} failed: {exc}. "
                                     f"{len(done)} of {len(planned)} key directories were moved; nothing was deleted. "
                                     f"Fix the cause and run again (moved keys are skipped).",
                                 moves=[m.as_dict() for m in moves], aside_dir=aside, **result)
        result["moves"] = [m.as_dict() for m in moves]
        result["aside_dir"] = aside
        verb = "would move" if module.check_mode else "moved"
        result["msg"] = (f"rank {rank}: {verb} {len(planned)} key director{'y' if len(planned) == 1 else 'ies'} "
                         f"aside to {aside}" if planned else
                         f"rank {rank}: nothing to move ({len(moves)} key(s) requested, none present under {root})")
        entries = remaining if module.check_mode else inventory(root, rank, expected)["entries"]

    elif state == "provenance":
        try:
            writes = plan_provenance(root, rank, p["provenance"], only)
        except AutotuneError as exc:
            module.fail_json(msg=f"rank {rank}: {exc}.", **result)
        changed = [w for w in writes if w.changed]
        result["changed"] = bool(changed)
        diff = [{"before_header": w.path, "after_header": w.path, "before": w.before or "", "after": w.after}
                for w in changed]
        if changed and not module.check_mode:
            try:
                apply_provenance(changed)
            except OSError as exc:
                module.fail_json(msg=f"rank {rank}: writing provenance under {root} failed: {exc}.", **result)
        result["provenance_written"] = [{"key": w.key, "path": w.path, "changed": w.changed} for w in writes]
        verb = "would write" if module.check_mode else "wrote"
        result["msg"] = (f"rank {rank}: {verb} provenance for {len(changed)} of {len(writes)} key director"
                         f"{'y' if len(writes) == 1 else 'ies'} holding this rank's cache")
        if module.check_mode:
            records = {w.key: w.record for w in writes}
            entries = []
            for entry in before["entries"]:
                if entry["key"] in records:
                    entry.update(provenance_record=records[entry["key"]], provenance_problem=None,
                                 provenance=records[entry["key"]]["provenance"])
                    assess(entry, expected, rank)
                entries.append(entry)
        else:
            entries = inventory(root, rank, expected, only)["entries"]
    else:
        entries = before["entries"]
        incompatible = [e["key"] for e in entries if e["compatible"] is False]
        result["msg"] = (f"rank {rank}: {len(entries)} key director{'y' if len(entries) == 1 else 'ies'} under {root}"
                         + (f", {len(incompatible)} incompatible with the expected provenance" if expected else ""))

    result.update(root_exists=os.path.isdir(root), keys=[public(e) for e in entries], unexpected=before["unexpected"])
    if diff and module._diff:
        result["diff"] = diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
