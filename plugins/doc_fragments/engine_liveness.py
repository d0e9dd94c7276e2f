# -*- coding: utf-8 -*-
# sparkfleet: the engine_liveness_info options beside engine_api's (shared with the deprecated alias engine_liveness).
from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  api_key_file:
    description: File holding the API key (the head's C(/state/api-key) on the host); a missing or empty file means no key.
    type: path
  model:
    description: Model name to request (the server's default when omitted).
    type: str
  prompt:
    description: Prompt of the liveness request (varied prose; a repeated-token prompt would overstate speed).
    type: str
  max_tokens:
    description: Completion tokens the liveness request asks for (at least O(min_tokens)).
    type: int
    default: 64
  min_tokens:
    description: Completion tokens that must be generated within O(timeout_s).
    type: int
    default: 16
  timeout_s:
    description: Seconds the liveness request has to reach O(min_tokens).
    type: float
    default: 120
  stall_s:
    description: Longest wait for the next chunk (and for the first token) before the engine counts as hung.
    type: float
    default: 30
  smoke:
    description: Exact-answer prompts, each C({prompt, answer}); asked only when the engine is live.
    type: list
    elements: dict
    default: []
  smoke_timeout_s:
    description: Seconds each smoke prompt may take.
    type: float
    default: 60
"""
