#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# sparkfleet: post-ready liveness of the serving engine (generated tokens advancing) and exact-answer smoke prompts.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_liveness_info
short_description: Judge a ready engine live by generated tokens advancing during a real request, then ask exact-answer prompts
description:
  - docs/reference.md section 11 - a fleet served one repeated token, another deadlocked in a collective, both with C(/health)
    green. This module never looks at C(/health).
  - Sends one real streaming chat completion (temperature 0, thinking off, C(ignore_eos)) with
    C(stream_options.include_usage) and C(continuous_usage_stats). The completion token count (per-chunk usage,
    else one per text chunk, and the final usage) must reach O(min_tokens) within O(timeout_s), with no gap longer
    than O(stall_s) between two chunks carrying text. Chunks are not tokens - with speculative decoding one
    chunk carries several.
  - Then asks every O(smoke) prompt (non-streaming, temperature 0) and requires exactly its answer (only
    surrounding whitespace is ignored).
  - Fails with one message per problem (RV(problems)). Nothing is restarted - the caller keeps the logs and reports.
version_added: "1.0.0"
author: sparkfleet contributors (!UNKNOWN)
extends_documentation_fragment:
  - engine_api
  - engine_liveness
attributes:
  check_mode:
    support: full
    description: The requests change nothing on the server; check mode sends them too.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
"""

EXAMPLES = r"""
- name: Judge the head live by generated tokens, then the exact-answer prompts
  engine_liveness_info:
    url: http://127.0.0.1:8888
    api_key_file: /home/mia/dsv41-3x-spark/state/api-key
    min_tokens: 16
    timeout_s: 120
    stall_s: 30
    smoke:
      - {prompt: "What is 19 + 23? Reply only with the number.", answer: "42"}
  register: liveness
"""

RETURN = r"""
live:
  description: Whether generated tokens reached O(min_tokens) within O(timeout_s) without a stall.
  returned: always
  type: bool
  sample: true
liveness:
  description: >-
    The liveness request - C(tokens) reached, C(first_token_s), C(seconds), C(max_gap_s), C(progress) ([[s, tokens]]),
    C(usage_per_chunk) (the server sent per-chunk usage), C(finish_reason), C(reason) (why not live).
  returned: always
  type: dict
  sample: {live: true, tokens: 17, first_token_s: 0.041, seconds: 0.09, max_gap_s: 0.006, reason: ""}
smoke:
  description: Every smoke prompt with its expected and actual answer.
  returned: always
  type: list
  elements: dict
  sample: [{prompt: "What is 19 + 23? Reply only with the number.", expected: "42", answer: "42", ok: true, error: null}]
problems:
  description: One line per problem (not live, a wrong smoke answer); empty when the engine is live and answers right.
  returned: always
  type: list
  elements: str
  sample: ["not live: no token within 30.0 s of the request (TimeoutError): the stream opened but generation does not advance"]
"""

from ansible.module_utils.engine_liveness import run_module


def main() -> None:
    run_module("engine_liveness_info")


if __name__ == "__main__":
    main()
