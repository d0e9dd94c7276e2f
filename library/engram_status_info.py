#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# sparkfleet: read-only status of one rank's packed Engram shards and of the engine's packed= flags.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: engram_status_info
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
author: sparkfleet contributors (!UNKNOWN)
extends_documentation_fragment:
  - engram_rank
  - engram_status
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
  ansible.builtin.command:
    argv: [docker, logs, "{{ fleet_engine_container }}"]
  register: boot_log
  changed_when: false

- name: Are this rank's shards valid and loaded as packed?
  engram_status_info:
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

from ansible.module_utils.engram_status import run_module


def main() -> None:
    run_module("engram_status_info")


if __name__ == "__main__":
    main()
