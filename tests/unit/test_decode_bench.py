"""library/decode_bench: the module over decode_client, in-process against the simulator on 127.0.0.1."""
from __future__ import annotations

import json
import subprocess
from unittest import mock

import pytest

from ansible.module_utils import basic
from tests.conftest import ROOT, load_module
from tests.unit.module_harness import run_module
from testbed.engine.api import serving
from testbed.engine.model import SimConfig

decode_bench = load_module("decode_bench")
KEY = "k-9f3a1c7e5b"
FAST_ARGS = dict(types=["prose", "json"], concurrency=[1, 2], max_tokens=16, warmup=1, reps=3,
                 poll_interval=0.01, idle_wait=0.2)


@pytest.fixture(autouse=True)
def serialization_profile():
    """ansible-core 2.19 modules need a serialization profile, which module_harness does not set."""
    with mock.patch.object(basic, "_ANSIBLE_PROFILE", "legacy"):
        yield


@pytest.fixture()
def sim():
    with serving(SimConfig(time_scale=0.02, api_key=KEY)) as (server, url):
        yield server, url


def test_run_returns_conditions_requests_and_server_state(sim):
    server, url = sim
    res = run_module(decode_bench, dict(url=url, api_key=KEY, **FAST_ARGS))
    assert not res.failed, res.result.get("msg")
    result = res.result
    assert result["changed"] is False and result["invalid_count"] == 0
    assert {"conditions", "requests", "server", "started", "finished", "invalid_count"} <= set(result)
    assert [(c["type"], c["concurrency"]) for c in result["conditions"]] == [
        ("prose", 1), ("prose", 2), ("json", 1), ("json", 2)]
    cond = result["conditions"][0]
    assert set(cond) >= {"type", "concurrency", "valid", "reasons", "stats", "hashes"}
    assert set(cond["stats"]) == {"ttft_ms", "decode_tok_s", "tpot_ms", "e2e_s", "aggregate_tok_s", "spec"}
    assert len(result["requests"]) == (1 + 3) * (1 + 2) * 2
    assert result["server"]["after"]["counters"]["num_requests_total"] == len(result["requests"])
    assert KEY not in json.dumps(result)


def test_check_mode_sends_no_load(sim):
    server, url = sim
    res = run_module(decode_bench, dict(url=url, api_key=KEY, **FAST_ARGS), check_mode=True)
    assert not res.failed
    assert res.result["changed"] is False and res.result["skipped"] is True
    assert "sends no load" in res.result["skip_reason"]
    assert res.result["monitor"] == "server_info" and res.result["model"] == "DeepSeek-V4.1-Flash"
    assert server.engine.snapshot()["counters"].get("num_requests_total", 0) == 0


def test_check_mode_still_reports_an_unusable_server(sim):
    _, url = sim
    res = run_module(decode_bench, dict(url=url, api_key="wrong", **FAST_ARGS), check_mode=True)
    assert res.failed and "rejected the API key (HTTP 401)" in res.result["msg"]


@pytest.mark.parametrize("args, message", [
    (dict(concurrency=[0]), "concurrency 0 is not a positive whole number"),
    (dict(reps=2), "reps=2 is too few"),
    (dict(api_key="wrong"), "rejected the API key"),
    (dict(url="http://127.0.0.1:9"), "cannot reach the server at http://127.0.0.1:9"),
])
def test_bad_input_fails_with_a_clear_message(sim, args, message):
    _, url = sim
    res = run_module(decode_bench, {**dict(url=url, api_key=KEY, **FAST_ARGS), **args})
    assert res.failed and message in res.result["msg"]
    assert "conditions" not in res.result


def test_prompts_override_and_fail_on_invalid(sim):
    _, url = sim
    args = dict(url=url, api_key=KEY, **FAST_ARGS)
    args.update(types=["prose"], concurrency=[1], prompts={"prose": ["What is 19 + 23? Reply only with the number."]})
    res = run_module(decode_bench, args)
    assert not res.failed and res.result["invalid_count"] == 1
    assert res.result["conditions"][0]["reasons"][0].startswith("token_count:")
    res = run_module(decode_bench, dict(args, fail_on_invalid=True))
    assert res.failed and "1 benchmark condition(s) invalid; first: prose c1: token_count" in res.result["msg"]
    assert res.result["conditions"][0]["valid"] is False


def test_api_key_is_no_log():
    assert decode_bench.ARGUMENT_SPEC["api_key"]["no_log"] is True


@pytest.mark.parametrize("name", ["decode_bench", "bench_report"])
def test_ansible_doc_renders(name):
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-doc"), "-M", str(ROOT / "library"), name],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "OPTIONS" in proc.stdout and "RETURN VALUES" in proc.stdout
