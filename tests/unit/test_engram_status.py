"""engram_status_info (and its deprecated alias engram_status): per-layer shard state on disk and the engine's packed= flags of the last boot."""
from __future__ import annotations

import importlib.util
import os
import socket

import pytest

from ansible.module_utils.engram_packer import PackOptions, pack
from tests.conftest import ROOT, load_module
from tests.unit.module_harness import run_module

engram_status = load_module("engram_status_info")
ALIAS = load_module("engram_status")
HOST = socket.gethostname()


@pytest.fixture(autouse=True)
def _serialization_profile(monkeypatch):
    """ansible-core 2.19 modules also need a serialization profile; the shared harness sets only the
    arguments, so supply the one Ansible sends to legacy modules."""
    from ansible.module_utils import basic
    monkeypatch.setattr(basic, "_ANSIBLE_PROFILE", "legacy")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("sparkfleet_testbed_checkpoint", ROOT / "testbed" / "checkpoint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = str(tmp_path_factory.mktemp("ckpt"))
    module.make_checkpoint(path, rows={1: 3001, 14: 2003}, shards=4)
    return path


@pytest.fixture
def packed(ckpt, tmp_path):
    dest = tmp_path / "engram"
    dest.mkdir()
    pack(PackOptions(checkpoint=ckpt, dest=str(dest), rank=1, tp=3, margin_bytes=0, nice=False))
    return dest


def line(layer, rank, lo, hi, packed):
    return ("Exact nvme Engram layer=%d rank=%d rows=[%d,%d) cache=0.0GiB (0 slots, 4-way, 0.0%% of owned rows) "
            "scales=0.0GiB io_threads=96 packed=%s\n" % (layer, rank, lo, hi, packed))


def boot(packed1, packed14, rank=1):
    return ("dsv41 boot: rank=%d tp=3\n" % rank + line(1, rank, 1000, 2000, packed1)
            + line(14, rank, 667, 1335, packed14) + "Ready: API on port 8888 (rank 0). Key is in /state/api-key.\n")


def test_valid_shards_without_log(packed):
    res = run_module(engram_status, {"dest": str(packed), "rank": 1, "tp": 3})
    r = res.result
    assert not res.failed and r["changed"] is False
    assert r["all_valid"] is True and r["all_packed"] is True and r["log_given"] is False and r["log_boots"] == 0
    first = r["layers"][0]
    assert (first["layer"], first["state"], first["lo"], first["hi"], first["n"]) == (1, "valid", 1000, 2000, 3001)
    assert first["size"] == first["expected_size"] == 4096 + 1000 * 264
    assert first["packed"] is None and first["summary"] == "engram-l1-r1of3.bin: valid (1000 rows)"


@pytest.mark.parametrize("log, packed_flags, all_packed, boots", [
    (boot("True", "True"), [True, True], True, 1),
    (boot("False", "False") + boot("True", "True"), [True, True], True, 2),
    (boot("True", "True") + boot("True", "False"), [True, False], False, 2),
    (boot("True", "True") + "Starting DSV41 rank 1\nNV_ERR_NO_MEMORY\n", [None, None], False, 2),
    (boot("True", "True", rank=0), [None, None], False, 1),
    ("no engine output\n", [None, None], False, 0),
])
def test_packed_flags_from_the_last_boot(packed, log, packed_flags, all_packed, boots):
    for source in ("log_content", "log_path"):
        params = {"dest": str(packed), "rank": 1, "tp": 3}
        if source == "log_path":
            path = packed.parent / "boot.log"
            path.write_text(log)
            params["log_path"] = str(path)
        else:
            params["log_content"] = log
        r = run_module(engram_status, params).result
        assert [e["packed"] for e in r["layers"]] == packed_flags
        assert r["all_valid"] is True and r["all_packed"] is all_packed and r["log_boots"] == boots
        if packed_flags[0] is not None:
            assert r["layers"][0]["log_rows_match"] is True
            assert r["layers"][0]["log_line"].startswith("Exact nvme Engram layer=1 rank=1")
            assert r["layers"][0]["summary"].endswith("engine packed=%s" % packed_flags[0])


def test_states_absent_partial_invalid(packed):
    os.unlink(str(packed / "engram-l1-r1of3.bin"))
    (packed / "engram-l1-r1of3.partial").write_bytes(b"\0" * (4096 + 264 * 3))
    with open(str(packed / "engram-l14-r1of3.bin"), "r+b") as handle:
        handle.truncate(5000)
    r = run_module(engram_status, {"dest": str(packed), "rank": 1, "tp": 3, "layers": [1, 14, 7],
                                   "log_content": boot("True", "True")}).result
    states = {e["layer"]: e for e in r["layers"]}
    assert states[1]["state"] == "partial" and states[1]["partial_size"] == 4096 + 264 * 3
    assert states[14]["state"] == "invalid" and "is truncated: 5000 bytes" in states[14]["reason"]
    assert states[7]["state"] == "absent" and states[7]["packed"] is None
    assert r["all_valid"] is False and r["all_packed"] is False  # the engine's word does not fix the disk


def test_checkpoint_n_must_match(ckpt, packed, tmp_path):
    r = run_module(engram_status, {"dest": str(packed), "rank": 1, "tp": 3, "checkpoint": ckpt}).result
    assert r["all_valid"] is True
    other = tmp_path / "other"
    spec = importlib.util.spec_from_file_location("tbc", ROOT / "testbed" / "checkpoint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.make_checkpoint(str(other), rows={1: 3002, 14: 2003}, shards=4)
    r = run_module(engram_status, {"dest": str(packed), "rank": 1, "tp": 3, "checkpoint": str(other)}).result
    assert r["layers"][0]["state"] == "invalid" and "N=3001 (expected 3002)" in r["layers"][0]["reason"]
    assert r["layers"][1]["state"] == "valid" and r["all_valid"] is False


def test_wrong_tp_sees_other_shards_as_absent(packed):
    r = run_module(engram_status, {"dest": str(packed), "rank": 1, "tp": 2}).result
    assert [e["state"] for e in r["layers"]] == ["absent", "absent"]


def test_check_mode_is_the_same(packed):
    params = {"dest": str(packed), "rank": 1, "tp": 3, "log_content": boot("True", "True")}
    assert run_module(engram_status, params, check_mode=True).result == run_module(engram_status, params).result


@pytest.mark.parametrize("params, needle", [
    ({"rank": 3, "tp": 3}, "rank=3 is out of range for tp=3"),
    ({"rank": 0, "tp": 0}, "at least 1"),
    ({"rank": 0, "tp": 3, "log_path": "/nonexistent/boot.log"}, "Cannot read the boot log /nonexistent/boot.log"),
    ({"rank": 0, "tp": 3, "log_path": "/x", "log_content": "y"}, "mutually exclusive"),
    ({"rank": 0, "tp": 3, "checkpoint": "/nonexistent"}, "checkpoint directory /nonexistent"),
])
def test_bad_input(packed, params, needle):
    res = run_module(engram_status, dict(params, dest=str(packed)))
    assert res.failed and needle in res.result["msg"]


def test_missing_dest(tmp_path):
    res = run_module(engram_status, {"dest": str(tmp_path / "nope"), "rank": 0, "tp": 3})
    assert res.failed and "does not exist on %s" % HOST in res.result["msg"]


def test_the_deprecated_alias_returns_the_same_and_warns(packed, monkeypatch):
    from ansible.module_utils import basic
    deprecations = []
    monkeypatch.setattr(basic.AnsibleModule, "deprecate",
                        lambda self, msg, version=None, **kw: deprecations.append((msg, version)))
    params = {"dest": str(packed), "rank": 1, "tp": 3, "log_content": boot(True, False)}
    new = run_module(engram_status, params).result
    assert deprecations == []
    assert run_module(ALIAS, params).result == new
    assert deprecations == [("engram_status is now called engram_status_info (a read-only module returns no "
                             "ansible_facts); replace the module name, the options and results are the same.", "2.0.0")]
    assert "ansible_facts" not in new
