# -*- coding: utf-8 -*-
# sparkfleet: how a module reaches the head's OpenAI API, shared by decode_bench and engine_liveness.
from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  url:
    description: Base URL of the head's OpenAI API, e.g. C(http://10.213.0.11:8888).
    type: str
    required: true
  api_key:
    description: The API key (C(/state/api-key) on the head), sent as an C(Authorization) bearer token. Never logged.
    type: str
"""
