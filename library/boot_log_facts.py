#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: boot_log_facts
short_description: Parse an SGLang / DSV41 engine boot log into facts
description:
  - Reads the log of one engine container (C(docker logs [-t]) output, a saved boot log or a journal
    excerpt) and returns what the fleet's runbook looks for, namely the KV pool and memory calculation, CUDA
    graph shapes, the DSpark draft configuration, the Engram boot and periodic lines, FlashInfer autotune
    events, readiness, the last C(Decode batch) line, errors, and any markers the caller asks for.
  - Robust to the prefixes docker (C(2026-11-29T10:01:02.123456789Z)), SGLang (C([2026-11-29 10:01:02 TP0]),
    C([2026-11-29 10:01:02])) and C((rank=1)) add, to ANSI colour codes, interleaved lines of several ranks,
    CRLF line ends, a truncated last line and invalid UTF-8 (decoded with replacement characters).
  - >-
    A log can hold several boots. A boot starts at C(Starting DSV41 rank R) or at the testbed simulator's
    C(dsv41 boot: rank=R tp=T) (start lines of different ranks that follow each other belong to one boot),
    or at the first C(DSV4 memory calculation) after the previous boot printed its Ready line or failed.
    Only the B(last) boot is reported; RV(boots) counts them and RV(boot_history) summarises each.
  - Streams the file in 1 MiB blocks; a 100 MB serving log parses in about 0.1 s (see docs/engine.md).
  - Read-only, so it behaves the same in check mode.
version_added: "0.1.0"
author: sparkfleet
options:
  path:
    description:
      - Log file on the managed host. Mutually exclusive with O(content).
    type: path
  content:
    description:
      - Log text given inline (for example the C(stdout) of C(docker logs)). Mutually exclusive with O(path).
    type: str
  markers:
    description:
      - Lines to look for in the last boot. A marker written C(re:<regex>) is a Python regular expression
        (searched, not anchored, in the line without its prefixes); any other marker is a plain substring.
      - Each one is reported in RV(markers) under its own text.
    type: list
    elements: str
    default: []
  max_errors:
    description:
      - Keep at most this many entries in RV(errors); RV(errors_total) still counts all of them.
    type: int
    default: 100
attributes:
  check_mode:
    support: full
    description: The module only reads; check mode returns the same facts.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
notes:
  - C(available_bytes), C(swa_fixed), C(c128_state_fixed) and C(available_gpu_mem_gb) in RV(kv) are the
    numbers the engine prints with a C(GB) suffix (C(available_bytes=8.84 GB) gives C(8.84)); C(kv.units) says so.
  - A worker rank never prints a Ready line; its healthy end state is RV(status)=C(loaded).
seealso:
  - module: autotune_cache
"""

EXAMPLES = r"""
- name: Read this rank's boot log
  boot_log_facts:
    path: /var/log/sparkfleet/dsv41-head.log
    markers:
      - Engram prefetch ARMED
      - "re:\\[wo_a_w8\\] fp8 twins for \\d+ wo_a weights"
  register: boot

- name: Stop when the boot failed, saying why
  ansible.builtin.fail:
    msg: "{{ inventory_hostname }}: boot failed at line {{ boot.errors[0].line }}: {{ boot.errors[0].text }}"
  when: boot.status == 'failed'

- name: Parse docker logs output directly
  boot_log_facts:
    content: "{{ head_logs.stdout }}"
  register: head_boot

- name: Every Engram layer of this rank must be packed
  ansible.builtin.assert:
    that: boot.engram | map(attribute='packed') | list | select('equalto', true) | list | length == boot.engram | length
"""

RETURN = r"""
path:
  description: Absolute path of the parsed log (absent with O(content)).
  returned: when O(path) is given
  type: str
  sample: /var/log/sparkfleet/dsv41-head.log
lines:
  description: Lines in the whole log.
  returned: always
  type: int
  sample: 510893
bytes:
  description: Size of the log in bytes.
  returned: always
  type: int
  sample: 100000067
truncated_last_line:
  description: The log does not end with a newline (its last line was still being written or was cut).
  returned: always
  type: bool
  sample: false
boots:
  description: Number of boots found in the log (0 for a log with nothing recognised).
  returned: always
  type: int
  sample: 2
boot_start_line:
  description: Line number (1-based, in the whole log) where the last boot starts.
  returned: always
  type: int
  sample: 9
boot_start_text:
  description: The start line of the last boot (null for a boot with no start line).
  returned: always
  type: str
  sample: "[2026-11-29 09:20:00] dsv41 boot: rank=1 tp=3"
boot:
  description: Rank and TP size the last boot's start line(s) announced (rank null when several ranks share the log).
  returned: always
  type: dict
  sample: {"rank": 1, "tp": 3, "ranks_started": [1]}
boot_history:
  description: One summary per boot, oldest first; the last entry is the boot every other key describes.
  returned: always
  type: list
  elements: dict
  sample: [{"index": 1, "start_line": 1, "end_line": 8, "status": "failed", "ready": false, "errors_total": 3,
            "first_error": {"line": 4, "kind": "traceback"}}]
status:
  description:
    - C(ready) (Ready line, no error after it), C(failed) (an error and no Ready, or an error after Ready),
      C(loaded) (graphs, draft or decode lines but no Ready line, as on a worker rank), C(booting) (still loading), C(empty).
  returned: always
  type: str
  sample: ready
kv:
  description: KV pool facts of the last boot (rank 0's when several ranks share the log).
  returned: always
  type: dict
  sample: {"bytes_per_full_token": 1670.75, "available_bytes": 8.84, "c128_state_fixed": 0.0, "swa_fixed": 0.3,
           "full_token": 5491200, "max_total_num_tokens": 2999808, "chunked_prefill_size": 1024,
           "max_prefill_tokens": 16384, "max_running_requests": 4, "context_len": 1048576,
           "available_gpu_mem_gb": 7.68, "units": {"available_bytes": "GB"}}
kv_by_rank:
  description: The same KV facts per rank (key C(unknown) for lines without a rank).
  returned: always
  type: dict
  sample: {"0": {"max_total_num_tokens": 2999808}}
graphs:
  description: Target verify CUDA graph shape, plus every C(Capture ... graph begin) line.
  returned: always
  type: dict
  sample: {"verify_bs": [1, 2, 3, 4], "num_tokens_per_req": 6, "backend": "full", "avail_mem_gb": 6.95,
           "captures": [{"line": 16, "rank": 0, "what": "target verify", "bs": [1, 2, 3, 4]}]}
draft:
  description: Every C(key=value) of the C(Initialized DSpark draft runner) line, or null.
  returned: always
  type: dict
  sample: {"line": 18, "rank": 0, "gamma": 5, "verify_num_draft_tokens": 6, "block_size": 3}
engram:
  description: One entry per C(<mode> nvme Engram layer=...) boot line.
  returned: always
  type: list
  elements: dict
  sample: [{"line": 8, "mode": "Exact", "layer": 1, "rank": 0, "rows_lo": 0, "rows_hi": 128000000, "rows": 128000000,
            "cache_gib": 0.0, "slots": 0, "ways": 4, "percent": 0.0, "scales_gib": 0.8, "io_threads": 96,
            "packed": true, "text": "..."}]
engram_periodic:
  description: The last periodic C(Engram layer=N lookups=...) line per rank and layer, parsed.
  returned: always
  type: list
  elements: dict
  sample: [{"layer": 14, "rank": 0, "line": 32, "lookups": 12288, "hit_rate": 2.0, "reads": 12042, "cache_gib": 0.0,
            "ways": 4, "scales_gib": 0.8, "threads": 96, "packed": true, "text": "..."}]
engram_periodic_lines:
  description: Number of periodic Engram lines in the last boot.
  returned: always
  type: int
  sample: 4
autotune:
  description:
    - FlashInfer autotune events. C(outcome) is C(reused), C(tuned), C(mixed) (a hit on one rank and a retune
      on another, which desynchronises collectives) or C(none).
  returned: always
  type: dict
  sample: {"disagreements": 2, "disagreement_lines": [11, 15],
           "runs": [{"line": 12, "rank": 1, "path": "/root/.cache/sglang/flashinfer/autotune/0.6.1/sm121/0123456789abcdef/rank_tp1_pp0_dp0.json"}],
           "completed": 2, "reused": [], "tuned": [{"line": 14, "rank": 1, "path": "..."}], "keep_armed": true,
           "outcome": "tuned", "ranks_reused": [], "ranks_tuned": [1]}
markers:
  description: Per requested marker (keyed by the marker as given) whether the last boot printed it.
  returned: always
  type: dict
  sample: {"Engram prefetch ARMED": {"found": true, "regex": false, "line": 5, "count": 1,
           "text": "[2026-11-29 10:00:02] Engram prefetch ARMED"}}
errors:
  description:
    - Errors of the last boot, in log order. C(kind) is one of C(nv_err_no_memory), C(engram_retrieval_failed),
      C(traceback) (with C(exception), the line that ends it, and C(exception_line)), C(shard_range_mismatch),
      C(shard_truncated), C(shard_invalid) (bad header or size), C(container_exit) (with C(code)),
      C(nccl_timeout) (the NCCL watchdog saw a peer rank go).
  returned: always
  type: list
  elements: dict
  sample: [{"line": 11, "kind": "traceback", "rank": 0, "text": "... Traceback (most recent call last):",
            "exception": "RuntimeError: CUDA driver error: NV_ERR_NO_MEMORY", "exception_line": 16, "frames": 4}]
errors_total:
  description: Number of errors in the last boot (RV(errors) keeps at most O(max_errors)).
  returned: always
  type: int
  sample: 3
ready:
  description: Readiness of the last boot.
  returned: always
  type: dict
  sample: {"ready": true, "line": 24, "port": 8888, "rank": 0, "api_key": "/state/api-key", "text": "...",
           "server_fired_up": true, "server_fired_up_line": 21,
           "fresh_inference": {"line": 23, "passed": true, "expression": "19 + 23", "answer": "42"}}
decode:
  description: Number of C(Decode batch) lines in the last boot and the last one, parsed (keys normalised).
  returned: always
  type: dict
  sample: {"count": 4, "line": 33, "running_req": 2, "accept_len": 3.37, "accept_rate": 0.47,
           "gen_throughput": 70.02, "cuda_graph": true, "queue_req": 1, "truncated": false, "text": "..."}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_log import LogNotText, parse_bytes, parse_file


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path"),
            content=dict(type="str"),
            markers=dict(type="list", elements="str", default=[]),
            max_errors=dict(type="int", default=100),
        ),
        mutually_exclusive=[("path", "content")],
        required_one_of=[("path", "content")],
        supports_check_mode=True,
    )
    params = module.params
    markers = params["markers"] or []
    if params["max_errors"] < 0:
        module.fail_json(msg=f"max_errors must be 0 or more, got {params['max_errors']}.")
    try:
        if params["path"] is not None:
            result = parse_file(params["path"], markers=markers, max_errors=params["max_errors"])
        else:
            data = params["content"].encode("utf-8", "surrogateescape")
            result = parse_bytes(data, markers=markers, max_errors=params["max_errors"], where="content")
    except FileNotFoundError:
        module.fail_json(msg=f"Boot log {params['path']} does not exist on this host; check the path "
                             f"(docker logs are saved by the engine role under the run directory).",
                         path=params["path"])
    except IsADirectoryError:
        module.fail_json(msg=f"Boot log {params['path']} is a directory; give the log file itself.",
                         path=params["path"])
    except PermissionError as exc:
        module.fail_json(msg=f"Cannot read boot log {params['path']}: {exc.strerror}; run with become "
                             f"or fix its permissions.", path=params["path"])
    except LogNotText as exc:
        module.fail_json(msg=f"{exc} Give boot_log_facts the plain-text log.", path=params["path"])
    except ValueError as exc:  # a bad marker
        module.fail_json(msg=f"Bad markers option: {exc}.", markers=markers)
    except OSError as exc:
        module.fail_json(msg=f"Cannot read boot log {params['path']}: {exc}.", path=params["path"])
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
