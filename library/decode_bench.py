#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module: decode benchmark of the fleet's OpenAI API (thin layer over module_utils/decode_client)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: decode_bench
short_description: Streaming decode benchmark of an SGLang OpenAI-compatible server, with guards
description:
  - Runs waves of concurrent streaming chat completions against O(url) for every prompt type and
    concurrency, and reports per request and per condition (type x concurrency) statistics.
  - Run it on the bench host (default in the playbooks, the last worker; never the head, whose CPU
    would compete with the engine). Standard library only; the prompt catalog ships as the
    C(prompt_catalog) module_util, so hosts need neither network nor PyYAML.
  - Tokens come from C(usage.completion_tokens) of the final usage chunk (C(stream_options.include_usage)),
    never from counting chunks. Decode rate = (tokens - 1) / (t_last - t_first) over the chunks carrying text.
  - Thinking is off (C(chat_template_kwargs={"thinking":false})). Warm-up waves are discarded; measured
    waves give median, min-max, IQR and CV, aggregate tok/s per wave and the speculative view (tokens per
    step, step time) when the server reports its counters.
  - A condition is invalid, with its reasons and without statistics, when any request failed (HTTP error,
    broken stream, no usage), when a request did not end with exactly O(max_tokens) completion tokens and
    finish_reason C(length), when foreign traffic was seen (the server reported more running plus queued
    requests than the concurrency during a wave, counted more new requests than the wave sent, or stayed
    busy before it), or when greedy (temperature 0) text hashes differ between repetitions.
  - In check mode the module only runs the read-only preflight (server reachable, key accepted, model
    name, load reporting) and returns C(skipped=true) with C(skip_reason) and C(changed=false); it never
    sends load in check mode. A real run also reports C(changed=false) because it changes no state.
  - docs/bench.md has the full definitions.
version_added: "0.1.0"
author: sparkfleet contributors (!UNKNOWN)
extends_documentation_fragment:
  - engine_api
options:
  model:
    description: Model name to request; default the first one C(/v1/models) lists.
    type: str
    required: false
  types:
    description: Prompt types to run, in order; each needs prompts in the catalog or in O(prompts).
    type: list
    elements: str
    default: [prose, code, structured, json]
  prompts:
    description:
      - Prompts per type (type -> list of prompts) overriding the built-in catalog for the types it names.
      - Request slot i of a wave sends prompt i modulo the list's length, in every repetition.
    type: dict
    required: false
  concurrency:
    description: Concurrency levels (simultaneous requests per wave); each at least 1.
    type: list
    elements: int
    default: [1, 2, 4]
  max_tokens:
    description: Completion tokens per request; a valid request returns exactly this many.
    type: int
    default: 256
  warmup:
    description: Waves run and discarded before the measured ones, per condition.
    type: int
    default: 2
  reps:
    description: Measured waves per condition; at least 3.
    type: int
    default: 5
  temperature:
    description: Sampling temperature; 0 is greedy and enables the hash guard.
    type: float
    default: 0.0
  ignore_eos:
    description: Ask the server to ignore end-of-sequence (SGLang C(ignore_eos)) so every request fills O(max_tokens).
    type: bool
    default: false
  request_timeout:
    description: Seconds a request may take (socket timeout and bound of a wave).
    type: float
    default: 300.0
  poll_interval:
    description: Seconds between load polls of C(/server_info) or C(/metrics) during a wave.
    type: float
    default: 0.2
  idle_wait:
    description: Seconds to wait for the server to be idle before each wave; still busy means foreign traffic.
    type: float
    default: 30.0
  fail_on_invalid:
    description: Fail the task when any condition is invalid (the result still carries every condition).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Can run in check mode.
    details: Read-only preflight only; no load is sent and the result says C(skipped=true).
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
notes:
  - Statistics of an invalid condition are withheld (C(stats=null)); the raw requests stay in C(requests).
"""

EXAMPLES = r"""
- name: Benchmark decode from the last worker
  decode_bench:
    url: "http://{{ hostvars[groups['head'][0]].ansible_host }}:8888"
    api_key: "{{ engine_api_key | default(omit) }}"
    types: [prose, code]
    concurrency: [1, 2, 4]
    reps: 5
  register: bench

- name: Quick check with custom prompts, failing on any invalid condition
  decode_bench:
    url: http://127.0.0.1:8888
    prompts:
      prose: ["Describe a harbour at dawn in three paragraphs."]
    types: [prose]
    concurrency: [1]
    max_tokens: 128
    reps: 3
    warmup: 1
    fail_on_invalid: true
"""

RETURN = r"""
conditions:
  description: One entry per type x concurrency, in run order.
  returned: success, not in check mode
  type: list
  elements: dict
  sample:
    - type: prose
      concurrency: 1
      valid: true
      reasons: []
      warnings: []
      reps: 5
      n_requests: 5
      hashes: {"0": ["38549aa159254c64"]}
      monitor: {source: server_info, max_load_per_rep: [1, 1, 1, 1, 1]}
      stats:
        decode_tok_s: {n: 5, median: 26.2, min: 25.9, max: 26.5, iqr: 0.2, cv: 0.009, mean: 26.2}
        ttft_ms: {n: 5, median: 31.0, min: 29.5, max: 33.0, iqr: 1.1, cv: 0.04, mean: 31.2}
        tpot_ms: {n: 5, median: 38.2, min: 37.7, max: 38.6, iqr: 0.3, cv: 0.009, mean: 38.2}
        e2e_s: {n: 5, median: 9.8, min: 9.7, max: 9.9, iqr: 0.1, cv: 0.008, mean: 9.8}
        aggregate_tok_s: {n: 5, median: 26.1, min: 25.8, max: 26.4, iqr: 0.2, cv: 0.009, mean: 26.1}
        spec:
          tokens_per_step: {n: 5, median: 2.57, min: 2.5, max: 2.6, iqr: 0.05, cv: 0.01, mean: 2.56}
          step_ms: {n: 5, median: 98.1, min: 97.6, max: 98.9, iqr: 0.5, cv: 0.004, mean: 98.2}
      samples: {decode_tok_s: [26.2, 25.9, 26.5, 26.1, 26.3], aggregate_tok_s: [26.1, 25.8, 26.4, 26.0, 26.2]}
requests:
  description: Every request, warm-up ones included (C(warmup=true), C(rep) negative), with raw timings.
  returned: success, not in check mode
  type: list
  elements: dict
  sample:
    - {type: prose, concurrency: 1, rep: 0, warmup: false, slot: 0, prompt_index: 0, ok: true, error: null,
       status: 200, id: chatcmpl-4c1d0e49, completion_tokens: 256, prompt_tokens: 52, finish_reason: length,
       text_chunks: 100, text_sha256: 38549aa159254c64, ttft_ms: 31.0, decode_tok_s: 26.2, tpot_ms: 38.2,
       e2e_s: 9.8}
server:
  description: The server's C(/server_info) before and after the run (null where it has none).
  returned: always
  type: dict
  sample: {before: {num_running_reqs: 0, counters: {num_requests_total: 12}}, after: {num_running_reqs: 0}}
started:
  description: UTC start of the run (ISO 8601).
  returned: success, not in check mode
  type: str
  sample: "2026-11-29T19:36:37+00:00"
finished:
  description: UTC end of the run (ISO 8601).
  returned: success, not in check mode
  type: str
  sample: "2026-11-29T19:41:02+00:00"
invalid_count:
  description: How many conditions are invalid.
  returned: success, not in check mode
  type: int
  sample: 0
model:
  description: The model name requested.
  returned: always
  type: str
  sample: DeepSeek-V4.1-Flash
config:
  description: The run's settings (the API key only as C(api_key_set)).
  returned: success, not in check mode
  type: dict
  sample: {url: "http://10.213.0.11:8888", api_key_set: true, concurrency: [1, 2, 4], reps: 5}
prompts:
  description: The prompts used per type.
  returned: success, not in check mode
  type: dict
  sample: {prose: ["Tell the story of a lighthouse keeper ..."]}
skipped:
  description: True in check mode (no load sent).
  returned: check mode
  type: bool
  sample: true
skip_reason:
  description: Why nothing was measured.
  returned: check mode
  type: str
  sample: "check mode: decode_bench sends no load; preflight passed"
monitor:
  description: Where the server reports its load (server_info, metrics or null).
  returned: check mode
  type: str
  sample: server_info
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.decode_client import BenchConfig, BenchError, preflight, run_benchmark

ARGUMENT_SPEC = dict(
    url=dict(type="str", required=True),
    api_key=dict(type="str", no_log=True),
    model=dict(type="str"),
    types=dict(type="list", elements="str", default=["prose", "code", "structured", "json"]),
    prompts=dict(type="dict"),
    concurrency=dict(type="list", elements="int", default=[1, 2, 4]),
    max_tokens=dict(type="int", default=256, no_log=False),
    warmup=dict(type="int", default=2),
    reps=dict(type="int", default=5),
    temperature=dict(type="float", default=0.0),
    ignore_eos=dict(type="bool", default=False),
    request_timeout=dict(type="float", default=300.0),
    poll_interval=dict(type="float", default=0.2),
    idle_wait=dict(type="float", default=30.0),
    fail_on_invalid=dict(type="bool", default=False),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = {k: v for k, v in module.params.items() if k != "fail_on_invalid"}
    cfg = BenchConfig(**params)
    try:
        cfg.validate()
        if module.check_mode:
            pre = preflight(cfg)
            module.exit_json(changed=False, skipped=True, model=pre["model"], monitor=pre["monitor"],
                             server={"before": pre["server_info"], "after": None},
                             skip_reason="check mode: decode_bench sends no load; preflight passed")
        result = run_benchmark(cfg)
    except BenchError as exc:
        module.fail_json(msg=f"decode_bench on {cfg.url}: {exc}", url=cfg.url)
    if module.params["fail_on_invalid"] and result["invalid_count"]:
        first = next(c for c in result["conditions"] if not c["valid"])
        module.fail_json(msg=f"{result['invalid_count']} benchmark condition(s) invalid; first: {first['type']} "
                             f"c{first['concurrency']}: {'; '.join(first['reasons'])}", **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
