"""Regressions of the boot-log parser on the real launch shapes of docs/reference.md section 7a.

Each test is one defect the old parser had on real TP3 fleet logs (it only knew the simulator's invented
start lines); all of them failed on the old parser. Every fact of item 1 of issue 21 is also asserted,
fixture by fixture, in fixtures/boot_logs/cases.yaml."""
from __future__ import annotations

from pathlib import Path

from ansible.module_utils.sglang_log import parse_bytes, split_prefix

FIXTURES = Path(__file__).parent / "fixtures" / "boot_logs"


def parse(name: str) -> dict:
    return parse_bytes((FIXTURES / name).read_bytes())


def test_rank_and_tp_come_from_prefixes_and_server_args():
    for name, rank in (("real_tp3_head.log", 0), ("real_tp3_worker1.log", 1), ("real_tp3_worker2.log", 2)):
        boot = parse(name)["boot"]
        assert (boot["rank"], boot["tp"]) == (rank, 3), name


def test_worker_kv_pool_is_the_capped_pool_sizes_line():
    kv = parse("real_tp3_worker1.log")["kv"]
    assert kv.get("max_total_num_tokens") is None  # workers print no such line
    assert kv.get("pool_tokens") == 2999808        # the second (capped) DSV4 pool sizes line


def test_restarted_launch_keeps_its_own_engram_and_draft_lines():
    r = parse("real_failed_then_good.log")
    assert r["status"] == "ready"
    assert [(e["layer"], e["packed"], e["line"]) for e in r["engram"]] == [(1, True, 23), (14, True, 24)]
    assert r["draft"]["gamma"] == 5
    assert r["errors"] == []


def test_restarted_worker_is_two_launches():
    r = parse("real_restarted_worker.log")
    assert r["boots"] == 2
    assert [e["packed"] for e in r["engram"]] == [True, True]   # the first launch ran unpacked
    assert [b["start_line"] for b in r["boot_history"]] == [1, 24]


def test_progress_bar_fragment_before_the_prefix():
    line = ("Loading safetensors checkpoint shards: 100% Completed | 48/48 [09:01<00:00, 11.3s/it]"
            "[2026-09-11 23:43:15 TP2 EP2] Load weight end. elapsed=541.76 s")
    assert split_prefix(line) == (2, "Load weight end. elapsed=541.76 s")


def test_dataclass_server_args():
    log = ("[2026-09-11 23:34:03] server_args=ServerArgs(model_path='/models/DeepSeek-V4.1-Flash', nnodes=3, "
           "node_rank=2, tp_size=3, ep_size=3, api_key='[REDACTED]', enable_metrics=False)\n"
           "[2026-09-11 23:34:11 TP2 EP2] Init torch distributed begin.\n")
    r = parse_bytes(log.encode())
    assert (r["boot"]["rank"], r["boot"]["tp"]) == (2, 3)
    assert r["server_args"]["form"] == "dataclass"
    assert r["server_args"]["fields"]["enable_metrics"] is False
    assert r["status"] == "booting"


def test_warnings_are_counted_not_errors():
    r = parse("real_tp3_worker2.log")
    assert r["errors_total"] == 0 and r["status"] != "failed"
    assert r["warning_counts"]["invalid_scales"] == 3
