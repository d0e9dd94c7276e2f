#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# sparkfleet: move stale Engram shards to an archive volume. Logic: module_utils/engram_relocate.py.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: engram_relocate
short_description: Archive stale Engram shards on another volume, verified, removing the source only on request
description:
  - Finds stale packed shards (C(engram-l{L}-r{r}of{tp}.bin)) - files or directories listed in O(stale_paths), and
    shards of another tensor-parallel size in O(engram_dir) - and copies each to O(archive_dir) under its own
    absolute path, through a C(.partial) file with fsync, rename and a directory fsync.
  - Each copy is verified by size and sha256 against its source before anything else happens.
  - The source is removed only when O(remove_source) is true, and only after its copy verified; C(freed_bytes)
    counts only what is really removed.
  - Refuses when the archive is on the source's volume (relocating there frees nothing), when the archive
    volume lacks the space, or when the archive already holds a different file at the same path.
  - Never deletes the only copy. Below O(archive_dir) every directory must be a real directory on the archive
    volume (a symlink or a bind mount anywhere there is refused before anything is copied); a copy that is the
    source's own file (same device and inode) is no copy. Copies go to a fresh C(.partial) created with
    O_CREAT|O_EXCL|O_NOFOLLOW and are renamed within their own directory; a pre-existing C(.partial) that is a
    link or has other names is refused. Before a source is removed its archive copy is hashed again and
    compared with the source's sha256; the C(.sha256) record next to a copy is never taken as proof.
  - A whole copy found without its C(.sha256) record (a run killed between the rename and the record) is hashed
    against its source and gets its record (action C(record)), so a rerun leaves what an uninterrupted run does.
  - A failure in the middle of a run reports what the run already did (C(removed_sources), C(verified_copies),
    C(left), C(changed)); rerunning finishes the job without copying finished shards again.
version_added: "1.0.0"
author: sparkfleet contributors (!UNKNOWN)
options:
  stale_paths:
    description: Files, or directories whose C(engram-l*-r*of*.bin) files are stale.
    type: list
    elements: path
    default: []
  engram_dir:
    description: The live engram dir; its shards of a tensor-parallel size other than O(tp) are stale.
    type: path
  tp:
    description: The fleet's tensor-parallel size (needed with O(engram_dir)).
    type: int
  archive_dir:
    description: Where copies go (another volume). Created if missing.
    type: path
    required: true
  remove_source:
    description: Remove each source after its archive copy verified. Nothing is deleted otherwise.
    type: bool
    default: false
  margin_bytes:
    description: Space that must remain free on the archive volume after the copies.
    type: int
    default: 16777216
attributes:
  check_mode:
    support: full
    description: Finds, sizes and checks everything (space, volumes, existing copies) and writes nothing.
  diff_mode:
    support: full
    description: One line per stale shard, before and after.
"""

EXAMPLES = r"""
- name: Archive spark2's old TP2 shards and free their space
  engram_relocate:
    stale_paths: [/home/zurih/dsv41-engram]
    engram_dir: /home/zurih/dsv41-3x-spark/engram
    tp: 3
    archive_dir: /srv/archive/sparkfleet
    remove_source: true
"""

RETURN = r"""
files:
  description:
    - One entry per stale shard. C(state) is C(stale), C(copied) (verified copy, source present), C(relocated)
      (source removed) or C(failed); C(verified) says how the copy is known to match its source, C(record)
      (its C(.sha256) record only, a plan's hint, hashed again before any removal) or C(sha256) (hashed now).
  returned: always
  type: list
  elements: dict
  sample: [{source: /home/zurih/dsv41-engram/engram-l1-r1of2.bin,
            archive: /srv/archive/sparkfleet/home/zurih/dsv41-engram/engram-l1-r1of2.bin,
            bytes: 15844624, reason: listed in engram_stale_paths, state: relocated, action: copy+remove,
            sha256: 9f2c..., verified: sha256}]
copy_bytes:
  description: Bytes copied (or to copy, in check mode) to the archive.
  returned: always
  type: int
  sample: 28520984
freed_bytes:
  description: Bytes freed on the source volumes (only with O(remove_source)).
  returned: always
  type: int
  sample: 28520984
removed_sources:
  description: On failure, the sources this run removed (each after its archive copy verified).
  returned: failure in the middle of a run
  type: list
  elements: str
  sample: [/home/zurih/dsv41-engram/engram-l1-r1of2.bin]
verified_copies:
  description: On failure, the archive copies hashed against their sources in this run.
  returned: failure in the middle of a run
  type: list
  elements: str
  sample: [/srv/archive/sparkfleet/home/zurih/dsv41-engram/engram-l1-r1of2.bin]
left:
  description: On failure, the sources this run was to relocate that are still in place.
  returned: failure in the middle of a run
  type: list
  elements: str
  sample: [/home/zurih/dsv41-engram/engram-l14-r1of2.bin]
archive_available_bytes:
  description: Space available on the archive volume before this run.
  returned: always
  type: int
  sample: 268435456
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.engram_relocate import RelocateError, apply, diff_lines, plan


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            stale_paths=dict(type="list", elements="path", default=[]),
            engram_dir=dict(type="path"),
            tp=dict(type="int"),
            archive_dir=dict(type="path", required=True),
            remove_source=dict(type="bool", default=False),
            margin_bytes=dict(type="int", default=16 * 1024 * 1024),
        ),
        required_by={"engram_dir": "tp"},
        supports_check_mode=True,
    )
    p = module.params
    try:
        result = plan(p["stale_paths"], p["archive_dir"], p["remove_source"], p["engram_dir"], p["tp"],
                      margin_bytes=p["margin_bytes"])
        before, after = diff_lines(result)
        changed = any(f.action != "none" for f in result.files)
        if changed and not module.check_mode:
            apply(result)
    except RelocateError as exc:
        # a failure in the middle says what this run already did: changed, removed_sources,
        # verified_copies, left, files (module_utils/engram_relocate.py apply)
        extra = dict(exc.extra)
        extra.setdefault("changed", False)
        module.fail_json(msg=exc.msg, **extra)
    except OSError as exc:
        module.fail_json(msg=f"reading the stale shards or the archive dir failed before anything was copied: "
                             f"{exc}; nothing was changed", changed=False)
    out = result.as_result()
    if changed:
        out["diff"] = {"before": before, "after": after}
    module.exit_json(changed=changed, **out)


if __name__ == "__main__":
    main()
