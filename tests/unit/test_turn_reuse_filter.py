"""plugins/filter/turn_reuse.py boot_log_parsed: the rollout parses a log the controller holds with boot_log_info's
own parser, with the module's result (less `changed`) and clear errors, instead of a module turn on every rank."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from tests.conftest import load_module
from tests.unit.module_harness import run_module

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures" / "boot_logs"
MODULE = load_module("boot_log_info")
_spec = importlib.util.spec_from_file_location("turn_reuse_filter", ROOT / "plugins" / "filter" / "turn_reuse.py")
F = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(F)
CASES = [c for c in yaml.safe_load((FIXTURES / "cases.yaml").read_text()) if "fixture" in c]


@pytest.fixture(autouse=True)
def _serialization_profile(monkeypatch):
    from ansible.module_utils import basic
    monkeypatch.setattr(basic, "_ANSIBLE_PROFILE", "legacy")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_filter_returns_what_the_module_returns_for_the_same_content(case):
    text = (FIXTURES / case["fixture"]).read_bytes().decode("utf-8", "replace")   # as Ansible passes text
    markers = case.get("markers", [])
    module = run_module(MODULE, {"content": text, "markers": markers})
    if module.failed:
        with pytest.raises(Exception):
            F.boot_log_parsed(text, markers)
        return
    expected = dict(module.result)
    expected.pop("changed")
    expected.pop("invocation", None)
    got = F.boot_log_parsed(text, markers)
    assert got == expected
    got["kv"] = "changed by a caller"                      # the cached result is not shared with a caller
    assert F.boot_log_parsed(text, markers) == expected


def test_a_bad_marker_or_a_log_that_is_not_text_is_a_clear_error():
    with pytest.raises(F.AnsibleFilterError, match="bad markers"):
        F.boot_log_parsed("a line\n", [""])
    with pytest.raises(F.AnsibleFilterError, match="must be text"):
        F.boot_log_parsed(None, [])


def test_the_rollout_parses_its_logs_on_the_controller_not_with_a_module_turn():
    boot = yaml.safe_load((ROOT / "roles/rollout/tasks/boot.yml").read_text())[0]["block"]
    assert not [t for t in boot if "boot_log_info" in t]
    record = next(t for t in boot if t["name"] == "Record this rank's checks")
    assert "boot_log_parsed(_markers)" in record["ansible.builtin.set_fact"]["_rollout_checks"]
    point = yaml.safe_load((ROOT / "roles/rollout/tasks/restore_point.yml").read_text())
    assert not [t for t in point if "boot_log_info" in t]
    record = next(t for t in point if t["name"] == "Record this rank's restore point")
    assert "boot_log_parsed(" in record["vars"]["_rollout_before"]
