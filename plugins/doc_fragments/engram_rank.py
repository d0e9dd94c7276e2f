# -*- coding: utf-8 -*-
# sparkfleet: the options naming one rank's Engram shards, shared by engram_pack and engram_status.
from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  dest:
    description:
      - Engram directory of this rank (the one mounted at C(/engram) in the engine container).
    type: path
    required: true
  rank:
    description: This node's rank, C(0 <= rank < tp).
    type: int
    required: true
  tp:
    description: Tensor parallel size the shards are for (TP3 and TP4 shards can share O(dest)).
    type: int
    required: true
"""
