# -*- coding: utf-8 -*-
# sparkfleet: the engram_status_info options beside engram_rank's (shared with the deprecated alias engram_status).
from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
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
    description: The boot log itself (for example the registered stdout of C(docker logs) of this rank's engine container).
    type: str
"""
