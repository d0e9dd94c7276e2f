#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: boot_log_info
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
    A log can hold several launches (C(docker restart) appends to the same container log). A launch starts
    at the image launcher's first lines (C(DSV41 MXFP8 dense linears routed ...), C(DSV41 TP pad installed),
    C(SKIP_PREPARE=1 ...)) or at C(server_args=) (C({...}) or C(ServerArgs(...))), and everything up to the
    next launch belongs to it (docs/reference.md section 7a). Without those lines, the first
    C(DSV4 memory calculation) after a launch that ended (Ready, worker health server, or an error) starts
    the next one. Only the B(last) launch is reported; RV(boots) counts them and RV(launches) lists each.
  - Streams the file in 1 MiB blocks; a 100 MB serving log parses in about 0.1 s (see docs/engine.md).
  - Read-only, so it behaves the same in check mode, and it returns no C(ansible_facts), hence C(_info), the
    Ansible convention for read-only modules. C(boot_log_facts) is its deprecated alias (same code and
    results), kept for one release.
version_added: "1.1.0"
author: sparkfleet contributors (!UNKNOWN)
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
  - A worker rank never prints a Ready line; its healthy end state is RV(status)=C(up) (its
    C(Dummy health check server started ...) line).
  - Every quantity the engine prints in C(GB) is also returned as an integer C(<name>_bytes) with the
    printed text in C(<name>_text). SGLang's C(GB) is 2**30 bytes (it divides free memory by 1 << 30).
seealso:
  - module: autotune_cache
"""

EXAMPLES = r"""
- name: Read this rank's boot log
  boot_log_info:
    path: "/var/log/sparkfleet/{{ fleet_engine_container }}.log"
    markers:
      - Engram prefetch ARMED
      - "re:\\[wo_a_w8\\] fp8 twins for \\d+ wo_a weights"
  register: boot

- name: Stop when the boot failed, saying why
  ansible.builtin.fail:
    msg: "{{ inventory_hostname }}: boot failed at line {{ boot.errors[0].line }}: {{ boot.errors[0].text }}"
  when: boot.status == 'failed'

- name: Parse docker logs output directly
  boot_log_info:
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
  sample: "DSV41 MXFP8 dense linears routed to FlashInfer backend 'b12x' (zero block scales of padded shards encoded as 1.0)"
boot:
  description:
    - Rank, TP, EP size and node count of the last launch, from C(server_args) (C(node_rank), C(tp_size),
      C(ep_size), C(nnodes)), else from the C([... TP<r> EP<e>]) prefixes; C(rank_source) says which
      (C(server_args), C(prefix), or null for the old simulator's start lines). Rank is null when several
      ranks share the log.
  returned: always
  type: dict
  sample: {"rank": 1, "tp": 3, "ep": 3, "nnodes": 3, "ranks_started": [1], "rank_source": "server_args"}
launches:
  description: One summary per launch, oldest first (the same list as RV(boot_history)); the last is the one reported.
  returned: always
  type: list
  elements: dict
  sample: [{"index": 1, "start_line": 1, "end_line": 14, "status": "failed", "ready": false, "worker_up": false,
            "rank": 0, "tp": 3, "errors_total": 2, "first_error": {"line": 12, "kind": "traceback"}}]
server_args:
  description: The last launch's C(server_args=) line, parsed (C(form) is C(dict) or C(dataclass)); null without one.
  returned: always
  type: dict
  sample: {"line": 6, "form": "dict", "fields": {"node_rank": 0, "tp_size": 3, "nnodes": 3, "ep_size": 3,
           "api_key": "[REDACTED]", "enable_metrics": false}, "text": "..."}
launcher:
  description: The image launcher's lines (no prefix) of the last launch.
  returned: always
  type: dict
  sample: {"skip_prepare": true, "tp_pad": 3, "dense_backend": "b12x",
           "sanity_check": {"line": 28, "passed": true, "text": "Batch output sanity check passed: ..."},
           "warmup": {"line": 29, "seconds": 15.0, "text": "Warm-up done in 15s (...)"}, "lines": []}
weights:
  description:
    - C(Load weight begin) / C(Load weight end) of the target model and of the DSpark draft (the preferred
      rank's), with C(elapsed_s), C(type), C(quant) and the memory before, after and used (C(*_gb),
      C(*_bytes), C(*_text)); null for a model not loaded.
  returned: always
  type: dict
  sample: {"target": {"rank": 0, "line": 8, "end_line": 11, "type": "DeepseekV4ForCausalLM", "quant": "fp8",
           "elapsed_s": 541.76, "mem_usage_gb": 94.0, "mem_usage_bytes": 100931731456, "avail_mem_bytes": 18758269665},
           "draft": {"type": "DeepseekV4ForCausalLMDSpark", "elapsed_s": 74.58, "mem_usage_bytes": 3006477107}}
weights_by_rank:
  description: Every load of every rank, keyed by rank.
  returned: always
  type: dict
  sample: {"0": [{"type": "DeepseekV4ForCausalLM"}, {"type": "DeepseekV4ForCausalLMDSpark"}]}
startup_timings:
  description: Every field of C(Engine startup timings (s)) in seconds (C(cuda_graph) as a dict); null without the line (workers).
  returned: always
  type: dict
  sample: {"line": 25, "load_weight": 616.34, "kv_cache_allocation": 6.68, "scheduler_e2e": 761.3,
           "tokenizer_e2e": 766.76, "cuda_graph": {"target_verify": 13.48, "draft_decode": 4.26}}
worker_up:
  description: The worker's C(Dummy health check server started ... at ADDR) line (a worker is up).
  returned: always
  type: dict
  sample: {"up": true, "line": 23, "address": "0.0.0.0:8888", "text": "..."}
warning_counts:
  description: Warnings of the last launch counted per kind (Python C(*Warning) class, C(invalid_scales)); they are not errors.
  returned: always
  type: dict
  sample: {"UserWarning": 1, "invalid_scales": 86}
warnings_total:
  description: Sum of RV(warning_counts).
  returned: always
  type: int
  sample: 87
boot_history:
  description: One summary per boot, oldest first; the last entry is the boot every other key describes.
  returned: always
  type: list
  elements: dict
  sample: [{"index": 1, "start_line": 1, "end_line": 8, "status": "failed", "ready": false, "errors_total": 3,
            "first_error": {"line": 4, "kind": "traceback"}}]
status:
  description:
    - The launch's progress in the real order, C(booting), C(loaded) (target weights loaded), C(pool) (KV pool
      allocated), C(captured) (CUDA graphs captured, or serving lines), then C(ready) (the head's Ready line, no
      error after it) or C(up) (a worker's health server), or C(failed) (an error and no Ready, or an error
      after Ready); C(empty) for a log with nothing recognised.
  returned: always
  type: str
  sample: ready
kv:
  returned: always
  type: dict
  description:
    - KV pool facts of the last launch (rank 0's when several ranks share the log). C(pool_tokens) is the
      pool, C(max_total_num_tokens) on the head, else the last (capped) C(DSV4 pool sizes) line's C(full)
      (workers print no C(max_total_num_tokens)); C(pool_sizes) lists those lines;
      C(memory_pool_end_avail_mem_*) is the C(Memory pool end) line.
  sample: {"bytes_per_full_token": 1670.75, "available_bytes": 8.84, "available_bytes_text": "8.84 GB",
           "available_bytes_bytes": 9491877724, "c128_state_fixed": 0.0, "swa_fixed": 0.3,
           "full_token": 5491200, "max_total_num_tokens": 2999808, "pool_tokens": 2999808, "pool_full_tokens": 2999808,
           "pool_sizes": [{"line": 16, "full": 5491200}, {"line": 17, "full": 2999808}],
           "memory_pool_end_avail_mem_bytes": 10630044058, "chunked_prefill_size": 1024,
           "max_prefill_tokens": 16384, "max_running_requests": 4, "context_len": 1048576,
           "available_gpu_mem_gb": 7.68, "units": {"available_bytes": "GB"}}
kv_by_rank:
  description: The same KV facts per rank (key C(unknown) for lines without a rank).
  returned: always
  type: dict
  sample: {"0": {"max_total_num_tokens": 2999808}}
graphs:
  description: Target verify CUDA graph shape, plus every C(Capture ... graph begin) line with its C(... graph end)
    (C(end_line), C(elapsed_s), C(mem_usage_*), C(end_avail_mem_*)).
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

from ansible.module_utils.sglang_log_module import run_module


def main() -> None:
    run_module("boot_log_info")


if __name__ == "__main__":
    main()
