#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# sparkfleet: post-ready liveness of the serving engine (generated tokens advancing) and exact-answer smoke prompts.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_liveness
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
  engine_liveness:
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

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.engine_liveness import DEFAULT_PROMPT, LivenessError, check


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            api_key_file=dict(type="path"),
            model=dict(type="str"),
            prompt=dict(type="str"),
            max_tokens=dict(type="int", default=64, no_log=False),
            min_tokens=dict(type="int", default=16, no_log=False),
            timeout_s=dict(type="float", default=120.0),
            stall_s=dict(type="float", default=30.0),
            smoke=dict(type="list", elements="dict", default=[]),
            smoke_timeout_s=dict(type="float", default=60.0),
        ),
        mutually_exclusive=[("api_key", "api_key_file")],
        supports_check_mode=True,
    )
    p = module.params
    key = p["api_key"]
    if p["api_key_file"] and os.path.exists(p["api_key_file"]):
        try:
            with open(p["api_key_file"]) as fh:
                key = fh.read().strip() or None
        except OSError as exc:
            module.fail_json(msg=f"cannot read the API key file {p['api_key_file']}: {exc.strerror or exc}")
    try:
        result = check(p["url"], key, p["model"], p["prompt"] or DEFAULT_PROMPT, p["max_tokens"], p["min_tokens"],
                       p["timeout_s"], p["stall_s"], p["smoke"], p["smoke_timeout_s"])
    except LivenessError as exc:
        module.fail_json(msg=str(exc))
    result.pop("ok")
    if result["problems"]:
        module.fail_json(msg=f"{p['url']}: " + "; ".join(result["problems"]), changed=False, **result)
    lv = result["liveness"]
    module.exit_json(changed=False, msg=f"{p['url']}: live ({lv['tokens']} tokens in {lv['seconds']} s, first after "
                                        f"{lv['first_token_s']} s); {len(result['smoke'])} smoke prompt(s) answered exactly",
                     **result)


if __name__ == "__main__":
    main()
