"""testbed/engine/api.py: the simulated head's HTTP API on 127.0.0.1 (compressed time, bounded loops)."""
from __future__ import annotations

import http.client
import json
import re
import threading
import time
from urllib.parse import urlsplit

import pytest

from ansible.module_utils import prompt_catalog
from testbed.engine.api import SMOKE_ANSWERS, serving
from testbed.engine.model import SimConfig

FAST = 0.02  # 50x faster than the fleet: a 98 ms step takes ~2 ms
CODE_PROMPT = prompt_catalog.CATALOG["code"][0]
PROSE_PROMPT = prompt_catalog.CATALOG["prose"][0]


def call(url: str, method: str, path: str, body: dict | None = None, key: str | None = None,
         timeout: float = 10.0) -> tuple[int, bytes]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def chat(prompt: str, max_tokens: int = 64, temperature: float = 0.0, **extra) -> dict:
    return {"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": temperature, **extra}


def stream(url: str, body: dict, key: str | None = None) -> tuple[list[dict], bool]:
    """(events, saw [DONE]); tolerant of a connection closed mid-stream."""
    body = dict(body, stream=True)
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    events, done = [], False
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=headers)
        resp = conn.getresponse()
        assert resp.status == 200
        while True:
            line = resp.readline()
            if not line:
                break
            if line.startswith(b"data: "):
                data = line[6:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                events.append(json.loads(data))
    except (http.client.HTTPException, OSError):
        pass
    finally:
        conn.close()
    return events, done


def text_of(events: list[dict]) -> str:
    return "".join((c["delta"].get("content") or "") for e in events for c in e["choices"])


def info(url: str, query: str = "") -> dict:
    status, body = call(url, "GET", "/server_info" + query)
    assert status == 200
    return json.loads(body)


def test_health_is_503_until_ready():
    ready = threading.Event()
    with serving(SimConfig(time_scale=FAST), ready=ready) as (_, url):
        assert call(url, "GET", "/health")[0] == 503
        assert call(url, "POST", "/v1/chat/completions", chat("hi"))[0] == 503
        ready.set()
        assert call(url, "GET", "/health")[0] == 200
        assert call(url, "GET", "/health_generate")[0] == 200


def test_slow_start_fault():
    with serving(SimConfig(time_scale=0.01, faults={"slow_start_s": 20})) as (_, url):  # 0.2 s of wall time
        assert call(url, "GET", "/health")[0] == 503
        deadline = time.monotonic() + 5
        while call(url, "GET", "/health")[0] != 200:
            assert time.monotonic() < deadline, "never became ready"
            time.sleep(0.05)


def test_api_key():
    with serving(SimConfig(time_scale=FAST, api_key="s3cret")) as (_, url):
        assert call(url, "GET", "/health")[0] == 200  # health stays open, as in SGLang
        assert call(url, "GET", "/v1/models")[0] == 401
        assert call(url, "GET", "/v1/models", key="wrong")[0] == 401
        assert call(url, "POST", "/v1/chat/completions", chat("hi"))[0] == 401
        status, body = call(url, "GET", "/v1/models", key="s3cret")
        assert status == 200 and json.loads(body)["data"][0]["id"] == "DeepSeek-V4.1-Flash"


def test_smoke_prompts_answer_exactly():
    assert SMOKE_ANSWERS == prompt_catalog.SMOKE  # the catalog's smoke checks are what the engine answers
    with serving(SimConfig(time_scale=FAST)) as (_, url):
        for prompt, answer in SMOKE_ANSWERS.items():
            status, body = call(url, "POST", "/v1/chat/completions", chat(prompt, 16))
            reply = json.loads(body)
            assert status == 200
            assert reply["choices"][0]["message"]["content"] == answer
            assert reply["choices"][0]["finish_reason"] == "stop"
            assert reply["usage"]["completion_tokens"] == 1
        events, done = stream(url, chat(next(iter(SMOKE_ANSWERS)), 16, stream_options={"include_usage": True}))
        assert done and text_of(events) == "42"


def test_stream_carries_several_tokens_per_chunk_and_a_final_usage_chunk():
    with serving(SimConfig(time_scale=FAST)) as (_, url):
        events, done = stream(url, chat(CODE_PROMPT, 120, stream_options={"include_usage": True}))
    assert done
    text_chunks = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]
    usage_chunk = events[-1]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 120
    assert all(e["usage"] is None for e in events[:-1])
    assert 120 / len(text_chunks) > 2.0  # code at k=3 commits ~3.9 tokens a step
    assert text_chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_no_usage_without_include_usage_and_non_streaming_shape():
    with serving(SimConfig(time_scale=FAST)) as (_, url):
        events, done = stream(url, chat(PROSE_PROMPT, 20))
        assert done and all(not e.get("usage") for e in events)
        status, body = call(url, "POST", "/v1/chat/completions", chat(PROSE_PROMPT, 20))
        reply = json.loads(body)
        assert status == 200 and reply["object"] == "chat.completion"
        assert reply["usage"]["completion_tokens"] == 20 and reply["choices"][0]["finish_reason"] == "length"
        assert reply["choices"][0]["message"]["content"]
        assert call(url, "POST", "/v1/chat/completions", {"messages": []})[0] == 400


def test_greedy_text_is_deterministic_and_sampling_is_not():
    with serving(SimConfig(time_scale=FAST)) as (_, url):
        greedy = [json.loads(call(url, "POST", "/v1/chat/completions", chat(PROSE_PROMPT, 30))[1])
                  for _ in range(2)]
        sampled = [json.loads(call(url, "POST", "/v1/chat/completions", chat(PROSE_PROMPT, 30, 0.8))[1])
                   for _ in range(2)]
    content = [r["choices"][0]["message"]["content"] for r in greedy + sampled]
    assert content[0] == content[1]
    assert content[2] != content[3]


def test_server_info_counters_timings_and_metrics():
    with serving(SimConfig(time_scale=FAST, enable_metrics=True)) as (_, url):
        before = info(url)
        assert before["num_running_reqs"] == 0 and before["counters"]["num_requests_total"] == 0
        events, _ = stream(url, chat(CODE_PROMPT, 50, stream_options={"include_usage": True}))
        after = info(url, "?timings=1")
        counters = after["counters"]
        assert counters["num_requests_total"] == 1 and counters["generation_tokens_total"] == 50
        assert counters["spec_accepted_tokens_total"] == 49  # the prefill token is not a decode step's
        assert counters["decode_steps_total"] >= 49 / 4
        timing = after["debug"]["timings"][-1]
        assert timing["id"] == events[0]["id"] and sum(n for _, n in timing["chunks"]) == 50
        assert timing["server_decode_tok_s"] > 0
        status, body = call(url, "GET", "/metrics")
        assert status == 200
        assert re.search(r'^sglang:num_running_reqs\{model_name="DeepSeek-V4.1-Flash"\} 0$', body.decode(), re.M)
        assert re.search(r"^sglang:num_requests_total\{.*\} 1$", body.decode(), re.M)
    with serving(SimConfig(time_scale=FAST)) as (_, url):
        assert call(url, "GET", "/metrics")[0] == 404


def test_requests_beyond_the_slots_queue():
    with serving(SimConfig(time_scale=0.05, max_running_requests=2)) as (_, url):
        results = []
        threads = [threading.Thread(target=lambda: results.append(
            call(url, "POST", "/v1/chat/completions", chat(PROSE_PROMPT, 60))[0])) for _ in range(4)]
        for thread in threads:
            thread.start()
        seen = set()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (2, 2) not in seen:
            state = info(url)
            seen.add((state["num_running_reqs"], state["num_queue_reqs"]))
            time.sleep(0.005)
        for thread in threads:
            thread.join(10)
    assert (2, 2) in seen and max(r for r, _ in seen) == 2
    assert results == [200] * 4


def test_decode_log_lines_follow_sglang_format():
    lines = []
    with serving(SimConfig(time_scale=0.01, log_interval_steps=10), log=lines.append) as (_, url):
        call(url, "POST", "/v1/chat/completions", chat(PROSE_PROMPT, 120))
    pattern = re.compile(
        r"Decode batch, #running-req: 1, #full token: 0, #token: \d+, token usage: \d\.\d\d, "
        r"accept len: \d+\.\d\d, accept rate: \d\.\d\d, cuda graph: True, "
        r"gen throughput \(token/s\): \d+\.\d\d, #queue-req: 0$")
    decode = [line for line in lines if "Decode batch" in line]
    assert decode and all(pattern.search(line) for line in decode)
    assert any(line.startswith("[") and "Prefill batch, #new-seq: 1" in line for line in lines)


def test_default_log_interval_is_40_steps():
    lines = []
    with serving(SimConfig(time_scale=0.005), log=lines.append) as (_, url):
        call(url, "POST", "/v1/chat/completions", chat(PROSE_PROMPT, 40))  # 39 decode tokens: <= 39 steps
        assert not [line for line in lines if "Decode batch" in line]
        call(url, "POST", "/v1/chat/completions", chat(PROSE_PROMPT, 200))  # >= 199 / 4 steps
        assert [line for line in lines if "Decode batch" in line]


def test_fault_http_500_every():
    with serving(SimConfig(time_scale=FAST, faults={"http_500_every": 2})) as (_, url):
        statuses = [call(url, "POST", "/v1/chat/completions", chat(PROSE_PROMPT, 4))[0] for _ in range(4)]
        assert statuses == [200, 500, 200, 500]
        assert info(url)["counters"]["num_requests_failed"] == 2


def test_fault_dropped_stream_and_omitted_usage():
    with serving(SimConfig(time_scale=FAST, faults={"drop_stream_after_tokens": 20})) as (_, url):
        events, done = stream(url, chat(PROSE_PROMPT, 100, stream_options={"include_usage": True}))
        assert not done and not any(e.get("usage") for e in events)
    with serving(SimConfig(time_scale=FAST, faults={"omit_usage": True})) as (_, url):
        events, done = stream(url, chat(PROSE_PROMPT, 30, stream_options={"include_usage": True}))
        assert done and not any(e.get("usage") for e in events)


def test_shutdown_releases_the_port():
    with serving(SimConfig(time_scale=FAST)) as (server, url):
        port = server.server_address[1]
    with pytest.raises(OSError):
        call(f"http://127.0.0.1:{port}", "GET", "/health", timeout=2)
