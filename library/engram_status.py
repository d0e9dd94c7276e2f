#!/usr/bin/python
# -*- coding: utf-8 -*-
# sparkfleet: read-only status of one rank's packed Engram shards and of the engine's packed= flags.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: engram_status
short_description: Report the state of this rank's packed Engram shards and the engine's packed= flags
description:
  - For each layer, the state of C(engram-l{L}-r{rank}of{tp}.bin) in O(dest) from its header and size only
    (C(absent), C(partial) when only a C(.partial) exists, C(valid), or C(invalid) with the reason, e.g. the
    wrong row range or a truncated file).
  - Without O(checkpoint) a shard is valid when it is consistent with itself for this layer, rank and tp
    (its own N gives the expected range and size); with O(checkpoint) its N must also match the
    checkpoint's headers.
  - Given the engine's boot log (O(log_path) or O(log_content)), reads the C(packed=True|False) flag of the
    line C(Exact nvme Engram layer=L rank=R rows=...) of every layer. The LAST boot in the log counts (a
    layer and rank seen again starts the next boot).
  - Never changes anything.
version_added: "1.0.0"
author: sparkfleet
extends_documentation_fragment:
  - engram_rank
options:
  layers:
    description: Engram layers to report.
    type: list
    elements: int
    default: [1, 14]
  checkpoint:
    description: Optional checkpoint directory; when set, each shard's N must match the checkpoint.
    type: path
  log_path:
    description: File holding the engine's boot log (for example saved C(docker logs) output).
    type: path
  log_content:
    description: The boot log itself (for example the registered stdout of C(docker logs dsv41-worker)).
    type: str
attributes:
  check_mode:
    support: full
    description: The module only reads; check mode returns the same result.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
"""

EXAMPLES = r"""
- name: Read the engine's boot log of this rank
  ansible.builtin.command: docker logs dsv41-worker
  register: boot_log
  changed_when: false

- name: Are this rank's shards valid and loaded as packed?
  engram_status:
    dest: /home/zurih/dsv41-3x-spark/engram
    rank: 1
    tp: 3
    log_content: "{{ boot_log.stdout }}\n{{ boot_log.stderr }}"
  register: engram

- name: Stop unless every layer is packed on disk and in the engine
  ansible.builtin.assert:
    that: engram.all_packed
    fail_msg: "{{ engram.layers | map(attribute='summary') | join('; ') }}"
"""

RETURN = r"""
layers:
  description: One entry per layer.
  returned: always
  type: list
  elements: dict
  contains:
    layer:
      description: Engram layer.
      type: int
      sample: 14
    path:
      description: Path of the packed shard.
      type: str
      sample: /home/zurih/dsv41-3x-spark/engram/engram-l14-r1of3.bin
    state:
      description: absent, partial, valid or invalid.
      type: str
      sample: valid
    reason:
      description: Why a shard is invalid or partial; empty otherwise.
      type: str
      sample: "is truncated: 4096 bytes, expected 10564360"
    lo:
      description: First row this rank owns (null when unknown).
      type: int
      sample: 32000
    hi:
      description: Row after the last one this rank owns (null when unknown).
      type: int
      sample: 64000
    n:
      description: Rows of the layer (from the checkpoint, else from the shard header).
      type: int
      sample: 96001
    size:
      description: Size of the file on disk (null when absent).
      type: int
      sample: 8452096
    expected_size:
      description: Size a valid shard has (null when unknown).
      type: int
      sample: 8452096
    partial_path:
      description: The C(.partial) next to it, if any.
      type: str
      sample: null
    partial_size:
      description: Size of that partial.
      type: int
      sample: null
    packed:
      description: The engine's packed= flag for this layer and rank in the last boot; null without a log or line.
      type: bool
      sample: true
    log_line:
      description: The boot line that flag was read from.
      type: str
      sample: "Exact nvme Engram layer=14 rank=1 rows=[32000,64000) cache=0.0GiB ... packed=True"
    log_rows_match:
      description: Whether that line's rows equal the shard's range (null when either is unknown).
      type: bool
      sample: true
    summary:
      description: One line for humans.
      type: str
      sample: "engram-l14-r1of3.bin: valid (32000 rows), engine packed=True"
all_valid:
  description: Every layer's shard is valid on disk.
  returned: always
  type: bool
  sample: true
all_packed:
  description: Every layer is valid on disk AND, when a log was given, packed=True in its last boot.
  returned: always
  type: bool
  sample: false
log_given:
  description: Whether a boot log was given.
  returned: always
  type: bool
  sample: true
log_boots:
  description: Boots found in the log (0 without a log or without Engram lines).
  returned: always
  type: int
  sample: 2
"""

import os
import socket

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.engram_format import (
    EngramFormatError, STATE_VALID, check_rank, inspect_shard, last_boot_packed)
from ansible.module_utils.engram_packer import PackError, load_sources


def status(dest, rank, tp, layers, checkpoint=None, log_text=None):
    """The module's result, without Ansible; raises EngramFormatError or PackError on bad input."""
    check_rank(rank, tp)
    rows = {}
    if checkpoint:
        rows = {layer: src.n for layer, src in load_sources(checkpoint, layers).items()}
    boots, lines = (0, {}) if log_text is None else last_boot_packed(log_text, rank, layers)
    entries = []
    for layer in layers:
        state = inspect_shard(dest, layer, rank, tp, rows.get(layer))
        entry = state.as_dict()
        line = lines.get(layer)
        entry["packed"] = None if line is None else line.packed
        entry["log_line"] = None if line is None else line.line
        entry["log_rows_match"] = (None if line is None or state.lo is None
                                   else (line.lo, line.hi) == (state.lo, state.hi))
        name = os.path.basename(state.path)
        text = "%s: %s" % (name, state.state)
        if state.state == STATE_VALID:
            text += " (%d rows)" % (state.hi - state.lo)
        elif state.reason:
            text += " (%s)" % state.reason
        if log_text is not None:
            text += ", engine packed=%s" % ("not reported in the last boot" if line is None else line.packed)
        entry["summary"] = text
        entries.append(entry)
    all_valid = all(e["state"] == STATE_VALID for e in entries)
    all_packed = all_valid and (log_text is None or all(e["packed"] is True for e in entries))
    return {"changed": False, "layers": entries, "all_valid": all_valid, "all_packed": all_packed,
            "log_given": log_text is not None, "log_boots": boots}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type="path", required=True),
            rank=dict(type="int", required=True),
            tp=dict(type="int", required=True),
            layers=dict(type="list", elements="int", default=[1, 14]),
            checkpoint=dict(type="path"),
            log_path=dict(type="path"),
            log_content=dict(type="str"),
        ),
        mutually_exclusive=[("log_path", "log_content")],
        supports_check_mode=True,
    )
    p = module.params
    host = socket.gethostname()
    if not os.path.isdir(p["dest"]):
        module.fail_json(msg="Engram directory %s does not exist on %s (or is not a directory): check dest."
                         % (p["dest"], host), dest=p["dest"])
    log_text = p["log_content"]
    if p["log_path"]:
        try:
            with open(p["log_path"], "r", errors="replace") as handle:
                log_text = handle.read()
        except OSError as exc:
            module.fail_json(msg="Cannot read the boot log %s on %s: %s. Save the engine's log there (docker logs) "
                                 "or pass log_content." % (p["log_path"], host, exc.strerror or exc),
                             log_path=p["log_path"])
    try:
        result = status(p["dest"], p["rank"], p["tp"], p["layers"], p["checkpoint"], log_text)
    except EngramFormatError as exc:
        module.fail_json(msg="Invalid rank/tp on %s: %s." % (host, exc))
    except PackError as exc:
        module.fail_json(msg=exc.msg)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
