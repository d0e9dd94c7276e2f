"""library/boot_log_info (and its deprecated alias boot_log_facts): the module around module_utils/sglang_log."""
from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import yaml

from tests.conftest import load_module
from tests.unit.module_harness import run_module

FIXTURES = Path(__file__).parent / "fixtures" / "boot_logs"
CASES = [c for c in yaml.safe_load((FIXTURES / "cases.yaml").read_text()) if "fixture" in c]
MODULE = load_module("boot_log_info")
ALIAS = load_module("boot_log_facts")


@pytest.fixture(autouse=True)
def _serialization_profile(monkeypatch):
    """ansible-core 2.19 also needs a serialization profile next to the module arguments; the shared
    harness sets only the arguments, so supply the profile Ansible itself sends to legacy modules."""
    from ansible.module_utils import basic
    monkeypatch.setattr(basic, "_ANSIBLE_PROFILE", "legacy")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_fixture_through_the_module(case):
    from tests.unit.test_sglang_log import check
    path = FIXTURES / case["fixture"]
    out = run_module(MODULE, {"path": str(path), "markers": case.get("markers", [])})
    assert not out.failed, out.result
    assert out.result["changed"] is False
    assert out.result["path"] == str(path)
    check(out.result, case["expect"])


def test_check_mode_returns_the_same_facts():
    args = {"path": str(FIXTURES / "two_boots.log"), "markers": ["[autotune_keep] armed"]}
    normal = run_module(MODULE, args).result
    checked = run_module(MODULE, args, check_mode=True).result
    assert checked == normal
    assert checked["changed"] is False and checked["boots"] == 2


def test_content_gives_the_same_facts_as_path():
    path = FIXTURES / "clean_tp3_rank0.log"
    by_path = run_module(MODULE, {"path": str(path)}).result
    by_content = run_module(MODULE, {"content": path.read_text()}).result
    by_path.pop("path")
    assert by_content == by_path


def test_content_with_invalid_utf8_survives():
    text = (FIXTURES / "adversarial_interleaved.log").read_bytes().decode("utf-8", "replace")
    out = run_module(MODULE, {"content": text})
    assert not out.failed
    assert out.result["status"] == "ready" and out.result["lines"] == 80


@pytest.mark.parametrize("args, message", [
    ({"path": "/nonexistent/dsv41-head.log"}, "Boot log /nonexistent/dsv41-head.log does not exist on this host"),
    ({"path": str(FIXTURES)}, "is a directory"),
    ({"path": str(FIXTURES / "two_boots.log"), "content": "x"}, "mutually exclusive"),
    ({}, "one of the following is required: path, content"),
    ({"content": "x", "markers": ["re:(["]}, "Bad markers option: marker 're:([' is not a valid regular expression"),
    ({"content": "x", "max_errors": -1}, "max_errors must be 0 or more, got -1"),
])
def test_failures_say_what_and_where(args, message):
    out = run_module(MODULE, args)
    assert out.failed
    assert message in out.result["msg"]


def test_a_compressed_log_is_refused_with_the_fix(tmp_path):
    log = tmp_path / "dsv41-head.log.gz"
    log.write_bytes(gzip.compress((FIXTURES / "clean_tp3_rank0.log").read_bytes()))
    out = run_module(MODULE, {"path": str(log)})
    assert out.failed
    assert out.result["msg"] == (f"{log} is not a text log: it is gzip-compressed (zcat it first). "
                                 f"Give boot_log_info the plain-text log.")
    assert out.result["path"] == str(log)


def test_unreadable_log(tmp_path, monkeypatch):
    log = tmp_path / "head.log"
    log.write_text("x\n")

    def deny(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("builtins.open", deny)
    out = run_module(MODULE, {"path": str(log)})
    assert out.failed
    assert out.result["msg"] == f"Cannot read boot log {log}: Permission denied; run with become or fix its permissions."


@pytest.mark.parametrize("fixture", ["real_tp3_head.log", "real_restarted_worker.log", "two_boots.log"])
def test_the_deprecated_alias_returns_the_same_results_and_a_deprecation(fixture, monkeypatch):
    from ansible.module_utils import basic
    deprecations = []
    monkeypatch.setattr(basic.AnsibleModule, "deprecate",
                        lambda self, msg, version=None, **kw: deprecations.append((msg, version)))
    args = {"path": str(FIXTURES / fixture), "markers": ["Engram prefetch ARMED"]}
    new = run_module(MODULE, args).result
    assert deprecations == []
    old = run_module(ALIAS, args).result
    assert old == new
    assert [msg for msg, version in deprecations if version == "2.0.0"] == [
        "boot_log_facts is now called boot_log_info (a read-only module returns no ansible_facts); "
        "replace the module name, the options and results are the same."]
    assert "ansible_facts" not in new


def test_the_alias_names_itself_in_its_errors(tmp_path):
    log = tmp_path / "x.log.gz"
    log.write_bytes(gzip.compress(b"x\n"))
    assert run_module(ALIAS, {"path": str(log)}).result["msg"].endswith("Give boot_log_facts the plain-text log.")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_no_result_key_that_ansible_reserves(case):
    """Ansible reads a module's top-level `warnings` and `deprecations` as messages: a dict there failed every
    rollout on the testbed with "Event.msg must be <class 'str'> instead of <class 'dict'>"."""
    out = run_module(MODULE, {"path": str(FIXTURES / case["fixture"]), "markers": []})
    for key in ("warnings", "deprecations"):
        value = out.result.get(key, [])
        assert isinstance(value, list) and all(isinstance(v, str) or isinstance(v, dict) and "msg" in v
                                               for v in value), (key, value)
