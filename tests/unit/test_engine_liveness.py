"""engine_liveness_info (and its deprecated alias engine_liveness) against the simulated head (testbed/engine/api.py on 127.0.0.1): liveness is judged by generated
tokens advancing during a real request, not by /health; smoke prompts must answer exactly."""
from __future__ import annotations

import http.client
import json
import time
from urllib.parse import urlsplit

from ansible.module_utils import engine_liveness as el
from tests.conftest import load_module
from tests.unit.module_harness import run_module
from testbed.engine.api import serving
from testbed.engine.model import SimConfig

MODULE = load_module("engine_liveness_info")
ALIAS = load_module("engine_liveness")
FAST = 0.02
SMOKE = [{"prompt": "What is 19 + 23? Reply only with the number.", "answer": "42"},
         {"prompt": "What is 7 * 8? Reply only with the number.", "answer": "56"}]


def health(url: str) -> int:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    finally:
        conn.close()


def finish_one(url: str) -> None:
    assert el.ask(el.Endpoint(url, None), None, SMOKE[0]["prompt"], 10)["answer"] == "42"


def test_a_serving_engine_is_live_with_tokens_advancing_and_exact_answers():
    with serving(SimConfig(time_scale=FAST)) as (_, url):
        out = el.check(url, min_tokens=16, max_tokens=64, timeout_s=20, stall_s=5, smoke=SMOKE)
    assert out["ok"] and out["live"] and out["problems"] == [], out
    lv = out["liveness"]
    assert lv["tokens"] >= 16 and lv["usage_per_chunk"] and lv["first_token_s"] is not None
    counts = [n for _, n in lv["progress"]]
    assert counts == sorted(counts) and counts[-1] > counts[0], "the token count must advance during the request"
    assert [a["answer"] for a in out["smoke"]] == ["42", "56"] and all(a["ok"] for a in out["smoke"])


def test_a_hung_engine_is_not_live_although_health_is_green():
    # After one finished request (the engine's own fresh-inference test) the ranks hang in a collective.
    with serving(SimConfig(time_scale=FAST, faults={"nccl_hang_after_requests": 1})) as (_, url):
        finish_one(url)
        assert health(url) == 200
        started = time.monotonic()
        out = el.check(url, min_tokens=16, max_tokens=64, timeout_s=20, stall_s=1.0, smoke=SMOKE)
        took = time.monotonic() - started
        assert health(url) == 200, "/health stays green: it says nothing about liveness"
    assert not out["ok"] and not out["live"] and out["liveness"]["tokens"] == 0
    assert out["problems"][0].startswith("not live: no token within 1.")
    assert "generation does not advance" in out["problems"][0]
    assert out["smoke"] == [], "a hung engine is not asked the smoke prompts (each would only time out)"
    assert took < 10


def test_tokens_that_stop_mid_request_are_not_live():
    # The stream is cut after 6 tokens (drop_stream_after_tokens): fewer than the 16 required.
    with serving(SimConfig(time_scale=FAST, faults={"drop_stream_after_tokens": 6})) as (_, url):
        out = el.check(url, min_tokens=16, max_tokens=64, timeout_s=20, stall_s=2.0)
    assert not out["live"] and 0 < out["liveness"]["tokens"] < 16
    assert "fewer than the 16 required" in out["problems"][0] or "stopped advancing" in out["problems"][0]


def test_chunks_without_per_chunk_usage_still_count_as_progress():
    # A server without continuous usage (omit_usage: no usage at all): one token per text chunk is a lower bound.
    with serving(SimConfig(time_scale=FAST, faults={"omit_usage": True})) as (_, url):
        out = el.check(url, min_tokens=8, max_tokens=64, timeout_s=20, stall_s=5)
    assert out["live"] and not out["liveness"]["usage_per_chunk"] and out["liveness"]["tokens"] >= 8


def test_a_wrong_smoke_answer_fails_even_when_tokens_advance():
    wrong = [{"prompt": SMOKE[0]["prompt"], "answer": "42."}, {"prompt": SMOKE[1]["prompt"], "answer": "56"}]
    with serving(SimConfig(time_scale=FAST)) as (_, url):
        out = el.check(url, min_tokens=4, max_tokens=16, timeout_s=20, stall_s=5, smoke=wrong)
    assert out["live"] and not out["ok"]
    assert out["problems"] == ['smoke prompt \'What is 19 + 23? Reply only with the number.\' answered "42", '
                               'expected exactly "42."']
    assert [a["ok"] for a in out["smoke"]] == [False, True]


def test_the_module_fails_naming_the_url_and_keeps_the_evidence(tmp_path):
    key = tmp_path / "api-key"
    key.write_text("s3cret\n")
    # The hang starts once the two smoke prompts of the first check have finished.
    with serving(SimConfig(time_scale=FAST, api_key="s3cret", faults={"nccl_hang_after_requests": 2})) as (_, url):
        ok = run_module(MODULE, {"url": url, "api_key_file": str(key), "smoke": SMOKE, "timeout_s": 20,
                                 "stall_s": 5, "smoke_timeout_s": 5})
        assert not ok.failed, ok.result["msg"]
        assert ok.result["live"] and ok.result["changed"] is False and len(ok.result["smoke"]) == 2
        hung = run_module(MODULE, {"url": url, "api_key_file": str(key), "smoke": SMOKE, "timeout_s": 20,
                                   "stall_s": 1})
    assert hung.failed and hung.result["msg"].startswith(f"{url}: not live: no token within")
    assert hung.result["live"] is False and hung.result["liveness"]["progress"] == []



def test_the_deprecated_alias_judges_the_same_and_warns(monkeypatch):
    from ansible.module_utils import basic
    deprecations = []
    monkeypatch.setattr(basic.AnsibleModule, "deprecate",
                        lambda self, msg, version=None, **kw: deprecations.append((msg, version)))
    with serving(SimConfig(time_scale=FAST)) as (_, url):
        params = {"url": url, "smoke": SMOKE, "timeout_s": 20, "stall_s": 5, "smoke_timeout_s": 5}
        new = run_module(MODULE, params)
        assert deprecations == []
        old = run_module(ALIAS, params)
    assert not new.failed and not old.failed
    assert [(r["live"], r["smoke"], r["problems"]) for r in (old.result, new.result)] == \
        [(True, new.result["smoke"], [])] * 2
    assert deprecations == [("engine_liveness is now called engine_liveness_info (a read-only module returns no "
                             "ansible_facts); replace the module name, the options and results are the same.", "2.0.0")]

def test_a_wrong_api_key_is_reported_not_taken_for_a_hang(tmp_path):
    with serving(SimConfig(time_scale=FAST, api_key="s3cret")) as (_, url):
        out = el.check(url, api_key="wrong", timeout_s=5, stall_s=2)
    assert not out["live"] and out["problems"][0].startswith("not live: HTTP 401")


def test_bad_input_is_refused():
    for kwargs, text in (({"min_tokens": 0}, "need 1 <= min_tokens"), ({"stall_s": 0}, "must be more than 0"),
                         ({"smoke": [{"prompt": "x"}]}, "needs a prompt and its exact answer")):
        try:
            el.check("http://127.0.0.1:1", **kwargs)
        except el.LivenessError as exc:
            assert text in str(exc)
        else:
            raise AssertionError(f"{kwargs} was accepted")
    assert "url must be http(s)" in str(_raises(lambda: el.Endpoint("127.0.0.1:8888", None)))


def _raises(fn):
    try:
        fn()
    except el.LivenessError as exc:
        return exc
    raise AssertionError("no error")


def test_continuous_usage_reports_tokens_so_far_in_every_chunk():
    with serving(SimConfig(time_scale=FAST)) as (_, url):
        parts = urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        body = {"messages": [{"role": "user", "content": el.DEFAULT_PROMPT}], "max_tokens": 40, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body))
        events = []
        for line in conn.getresponse().read().splitlines():
            if line.startswith(b"data: ") and line[6:] != b"[DONE]":
                events.append(json.loads(line[6:]))
        conn.close()
    counts = [e["usage"]["completion_tokens"] for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert counts == sorted(counts) and counts[-1] == 40 and len(set(counts)) == len(counts)
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 40
