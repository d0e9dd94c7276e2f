"""module_utils/sglang_log: the boot-log parser, without Ansible.

The fixture logs and their expected facts are a table: fixtures/boot_logs/cases.yaml."""
from __future__ import annotations

import gzip
import random
from pathlib import Path

import pytest
import yaml

from ansible.module_utils import sglang_log
from ansible.module_utils.sglang_log import (
    BootLogParser,
    LogNotText,
    parse_bytes,
    parse_decode_fields,
    parse_file,
    split_prefix,
)

FIXTURES = Path(__file__).parent / "fixtures" / "boot_logs"
CASES = yaml.safe_load((FIXTURES / "cases.yaml").read_text())


def dig(result, dotted: str):
    """Follow a dotted path; a dict key may itself contain dots (marker texts), so try the longest key first."""
    node = result
    parts = dotted.split(".")
    i = 0
    while i < len(parts):
        if isinstance(node, list):
            node = node[int(parts[i])]
            i += 1
            continue
        for j in range(len(parts), i, -1):
            key = ".".join(parts[i:j])
            if key in node:
                node = node[key]
                i = j
                break
        else:
            raise KeyError(f"{dotted}: no key at {'.'.join(parts[i:])!r}")
    return node


def case_bytes(case: dict) -> bytes:
    if "fixture" in case:
        return (FIXTURES / case["fixture"]).read_bytes()
    return case["content"].encode("utf-8")


def check(result: dict, expect: dict) -> None:
    problems = []
    for path, want in expect.items():
        got = dig(result, path)
        if got != want:
            problems.append(f"{path}: got {got!r}, want {want!r}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_case_table(case):
    result = parse_bytes(case_bytes(case), markers=case.get("markers", []))
    check(result, case["expect"])


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_line_parser_alone_gives_the_same_facts(case, monkeypatch):
    """The block fast path is an optimisation only: forcing every line through the line parser changes nothing."""
    data = case_bytes(case)
    markers = case.get("markers", [])
    fast = parse_bytes(data, markers=markers)
    monkeypatch.setattr(BootLogParser, "feed_block", _slow_block)
    assert parse_bytes(data, markers=markers) == fast


@pytest.mark.parametrize("case", [c for c in CASES if "fixture" in c], ids=lambda c: c["name"])
def test_crlf_everywhere_gives_the_same_facts(case):
    data = case_bytes(case)
    crlf = data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    a = parse_bytes(data, markers=case.get("markers", []))
    b = parse_bytes(crlf, markers=case.get("markers", []))
    a.pop("bytes"), b.pop("bytes")
    assert a == b


def test_parse_file_adds_the_path(tmp_path):
    log = tmp_path / "head.log"
    log.write_bytes((FIXTURES / "clean_tp3_rank0.log").read_bytes())
    result = parse_file(str(log))
    assert result["path"] == str(log)
    assert result["status"] == "ready"


def _slow_block(self, data, start, end):
    self.slow_blocks += 1
    for raw in data[start:end - 1].split(b"\n"):
        self.feed_line(raw)


def _serving_log(rng: random.Random, lines: int, rare: dict) -> bytes:
    """A serving log: Decode batch and periodic Engram lines, with ``rare`` {line number: bytes} put in place."""
    out = []
    for n in range(1, lines + 1):
        if n in rare:
            out.append(rare[n])
        elif n % 3 == 0:
            layer = 1 if n % 2 else 14
            out.append(b"[2026-11-29 10:05:10 TP0] Engram layer=%d lookups=%d hit_rate=%.1f%% reads=%d "
                       b"cache=0.0GiB(4-way) scales=0.8GiB threads=96 packed=True" % (layer, n, rng.random() * 99, n // 2))
        else:
            out.append(b"[2026-11-29 10:05:06 TP0] Decode batch, #running-req: %d, #full token: %d, full token usage: 0.00, "
                       b"#swa token: 0, swa token usage: 0.00, accept len: %.2f, accept rate: 0.41, cuda graph: True, "
                       b"gen throughput (token/s): %.2f, #queue-req: 0" % (rng.randint(1, 4), n, rng.uniform(2, 6),
                                                                          rng.uniform(10, 90)))
    return b"\n".join(out) + b"\n"


@pytest.mark.parametrize("block_size", [4096, 65536, 1 << 20])
def test_big_log_fast_path_matches_line_parser(block_size, monkeypatch):
    rng = random.Random(7)
    head = (FIXTURES / "clean_tp3_rank0.log").read_bytes()
    rare = {
        20011: b"[2026-11-29 11:00:00 TP0] Engram prefetch ARMED",
        30001: b"[2026-11-29 11:10:00 TP0] Engram retrieval failed: EIO on /engram/engram-l1-r0of3.bin",
        30002: b"[2026-11-29 11:10:01] dsv41 boot: rank=0 tp=3",
        30003: b"[2026-11-29 11:10:01 TP0] Exact nvme Engram layer=1 rank=0 rows=[0,128000000) cache=0.0GiB "
               b"(0 slots, 4-way, 0.0% of owned rows) scales=0.8GiB io_threads=96 packed=True",
        41234: b"[2026-11-29 11:20:00 TP0] \x1b[1mDecode\x1b[0m batch, #running-req: 4, #full token: 7, accept len: 5.5",
        52000: b"[2026-11-29 11:30:00 TP0] Engram prefetch ARMED",
    }
    body = _serving_log(rng, 60000, rare)
    data = head + body
    markers = ["Engram prefetch ARMED", "re:#running-req: 4, #full token: 7,"]
    monkeypatch.setattr(sglang_log, "BLOCK_SIZE", block_size)
    fast = parse_bytes(data, markers=markers)
    offset = head.count(b"\n")
    assert fast["lines"] == offset + 60000
    assert fast["boots"] == 2
    assert fast["boot_start_line"] == offset + 30002
    assert fast["markers"]["Engram prefetch ARMED"] == {
        "found": True, "regex": False, "line": offset + 52000, "count": 1,
        "text": "[2026-11-29 11:30:00 TP0] Engram prefetch ARMED"}
    assert fast["markers"]["re:#running-req: 4, #full token: 7,"]["line"] == offset + 41234
    decode_lines = sum(1 for n in range(30004, 60001) if n % 3 and n not in rare) + 1
    assert fast["decode"]["count"] == decode_lines
    assert fast["decode"]["line"] == offset + 59999
    assert fast["boot_history"][0]["first_error"]["line"] == offset + 30001
    assert [(p["layer"], p["line"]) for p in fast["engram_periodic"]] == [(1, offset + 59997), (14, offset + 60000)]
    monkeypatch.setattr(BootLogParser, "feed_block", _slow_block)
    assert parse_bytes(data, markers=markers) == fast


def test_fast_path_is_taken_on_a_serving_log(monkeypatch):
    counts = {}
    original = BootLogParser.result

    def spy(self):
        counts.update(fast=self.fast_blocks, slow=self.slow_blocks)
        return original(self)

    monkeypatch.setattr(BootLogParser, "result", spy)
    data = (FIXTURES / "clean_tp3_rank0.log").read_bytes() + _serving_log(random.Random(1), 40000, {})
    parse_bytes(data)
    assert counts["fast"] >= 5 and counts["slow"] == 1  # only the block holding the boot


@pytest.mark.parametrize("data, what", [
    (gzip.compress(b"Decode batch\n" * 100), "gzip-compressed"),
    (b"\x7fELF\x02\x01\x01" + bytes(200), "an ELF executable"),
    (b"\x28\xb5\x2f\xfd" + bytes(64), "zstd-compressed"),
    (b"text line\n" * 50 + b"\x00" * 100, "NUL bytes"),
])
def test_not_text_is_a_clear_error(data, what):
    with pytest.raises(LogNotText, match=what):
        parse_bytes(data, where="/var/log/x.log")


def test_a_few_nul_bytes_are_tolerated():
    data = b"[2026-11-29 10:00:01] dsv41 boot: rank=0 tp=3\n" + b"x" * 2000 + b"\x00" * 5 + b"\n"
    assert parse_bytes(data)["boots"] == 1


def test_bad_regex_marker():
    with pytest.raises(ValueError, match="not a valid regular expression"):
        parse_bytes(b"x\n", markers=["re:([unclosed"])


@pytest.mark.parametrize("line, rank, message", [
    ("[2026-11-29 10:01:02 TP0] Decode batch, x", 0, "Decode batch, x"),
    ("[2026-11-29 10:01:02] Ready: API", None, "Ready: API"),
    ("2026-11-29T10:01:02.123456789Z [2026-11-29 10:01:02 TP2] hello", 2, "hello"),
    ("(rank=1) Engram prefetch ARMED", 1, "Engram prefetch ARMED"),
    ("2026-11-29T10:01:02.1Z (rank=2) [autotune_keep] armed", 2, "[autotune_keep] armed"),
    ("dsv41-head  | [2026-11-29 10:01:02 TP0] x", 0, "x"),
    ("[autotune_keep] reused /a/b", None, "[autotune_keep] reused /a/b"),
    ("  File \"/x.py\", line 1", None, "  File \"/x.py\", line 1"),
    ("2026-11-29T10:01:02Z   File \"/x.py\"", None, "  File \"/x.py\""),
])
def test_split_prefix(line, rank, message):
    assert split_prefix(line) == (rank, message)


def test_decode_fields_of_the_fleet_line():
    line = ("Decode batch, #running-req: 1, #full token: 0, full token usage: 0.00, accept len: 3.08, "
            "accept rate: 0.41, cuda graph: True, gen throughput (token/s): 3.12, #queue-req: 0")
    assert parse_decode_fields(line) == {
        "running_req": 1, "full_token": 0, "full_token_usage": 0.0, "accept_len": 3.08, "accept_rate": 0.41,
        "cuda_graph": True, "gen_throughput": 3.12, "queue_req": 0}


def test_max_errors_caps_the_list_not_the_count():
    data = b"".join(b"[2026-11-29 10:00:0%d TP0] Engram retrieval failed: EIO\n" % (i % 10) for i in range(30))
    result = parse_bytes(data, max_errors=5)
    assert len(result["errors"]) == 5 and result["errors_total"] == 30


def test_mid_serving_log_of_three_ranks_with_sparse_warnings(monkeypatch):
    """No boot in the log (docker logs --since), three ranks' periodic lines interleaved, a warning every
    ~300 lines and request lines (Prefill, HTTP access) that are ignored: the block fast path and sub-blocks
    must give exactly what the line parser gives."""
    rng = random.Random(11)
    lines = []
    for n in range(1, 30001):
        r = n % 3
        if n % 307 == 0:
            lines.append(b"[2026-11-29 12:00:00 TP%d] WARNING: scheduler step took %d ms" % (r, rng.randint(90, 400)))
        elif n % 41 == 0:
            lines.append(b"[2026-11-29 12:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 911, #cached-token: 0, "
                         b"full token usage: 0.00, #running-req: 1, #queue-req: 0")
        elif n % 43 == 0:
            lines.append(b'[2026-11-29 12:00:00] INFO:     10.213.0.254:51234 - "POST /v1/chat/completions HTTP/1.1" 200 OK')
        elif n % 2:
            lines.append(b"[2026-11-29 12:00:00 TP%d] Engram layer=%d lookups=%d hit_rate=1.0%% reads=%d cache=0.0GiB(4-way) "
                         b"scales=0.8GiB threads=96 packed=True" % (r, 1 if n % 4 == 1 else 14, n, n))
        else:
            lines.append(b"[2026-11-29 12:00:00 TP0] Decode batch, #running-req: 2, #full token: %d, accept len: 3.10, "
                         b"accept rate: 0.40, cuda graph: True, gen throughput (token/s): 40.00, #queue-req: 0" % n)
    data = b"\n".join(lines) + b"\n"
    fast = parse_bytes(data)
    assert fast["boots"] == 1 and fast["boot_start_line"] == 1 and fast["status"] == "captured"
    assert [(p["rank"], p["layer"]) for p in fast["engram_periodic"]] == [(0, 1), (0, 14), (1, 1), (1, 14), (2, 1), (2, 14)]
    assert fast["decode"]["count"] == sum(1 for line in lines if b"Decode batch" in line)
    monkeypatch.setattr(BootLogParser, "feed_block", lambda self, d, s, e: _slow_block(self, d, s, e))
    assert parse_bytes(data) == fast
