"""library/autotune_cache + module_utils/autotune_store, run in-process on temporary cache trees.

A "host" here is a directory holding one rank's cache root, as each DGX Spark holds its own ~/.cache."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path

import pytest

from ansible.module_utils import autotune_store
from ansible.module_utils.autotune_store import AutotuneError, validate_key
from tests.conftest import ROOT, load_module
from tests.unit.module_harness import run_module

MODULE = load_module("autotune_cache")
_spec = importlib.util.spec_from_file_location("sparkfleet_filter_autotune_e2e", ROOT / "plugins" / "filter" / "autotune.py")
_filter = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_filter)

TARGET = "0.6.1/sm121/0123456789abcdef"
DRAFT = "0.6.1/sm121/fedcba9876543210"
FP = hashlib.sha256(b"argv+env of the launch").hexdigest()
PROV = {"image_digest": "sha256:" + "a" * 64, "flashinfer_version": "0.6.1", "engine_version": "0.5.6",
        "env_fingerprint": FP, "kernel": "6.11.0-1016-nvidia"}


@pytest.fixture(autouse=True)
def _serialization_profile(monkeypatch):
    """ansible-core 2.19 also needs a serialization profile next to the module arguments; the shared
    harness sets only the arguments, so supply the profile Ansible itself sends to legacy modules."""
    from ansible.module_utils import basic
    monkeypatch.setattr(basic, "_ANSIBLE_PROFILE", "legacy")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def put_cache(root: Path, key: str, rank: int, tactics: str = "t1", fingerprint: str | None = FP) -> dict:
    d = root.joinpath(*key.split("/"))
    d.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"kind": key[-4:], "tactics": tactics}).encode()
    (d / f"rank_tp{rank}_pp0_dp0.json").write_bytes(body)
    out = {"json": sha(body)}
    if fingerprint is not None:
        side = (fingerprint + "\n").encode()
        (d / f"rank_tp{rank}_pp0_dp0.launch").write_bytes(side)
        out["launch"] = sha(side)
    return out


def tree(path: Path) -> list:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


# ---------------------------------------------------------------- inventory

def test_missing_root_is_an_empty_inventory(tmp_path):
    out = run_module(MODULE, {"root": str(tmp_path / "nope")})
    assert not out.failed
    assert out.result["keys"] == [] and out.result["root_exists"] is False and out.result["changed"] is False


def test_default_root_expands_for_the_user(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    put_cache(tmp_path / ".cache/sglang/flashinfer/autotune", TARGET, 0)
    out = run_module(MODULE, {})
    assert out.result["root"] == str(tmp_path / ".cache/sglang/flashinfer/autotune")
    assert [k["key"] for k in out.result["keys"]] == [TARGET]


def test_inventory_lists_files_sidecars_and_ranks(tmp_path):
    digests = put_cache(tmp_path, TARGET, 0)
    (tmp_path / "0.6.1/sm121/fedcba9876543210").mkdir(parents=True)
    (tmp_path / "0.6.1/sm121/not-a-key").mkdir()
    out = run_module(MODULE, {"root": str(tmp_path), "rank": 0})
    keys = out.result["keys"]
    assert keys[0] == {
        "key": TARGET, "path": str(tmp_path / TARGET), "flashinfer_version": "0.6.1", "sm": "sm121",
        "key16": "0123456789abcdef",
        "files": [{"name": "rank_tp0_pp0_dp0.json", "rank": 0, "bytes": (tmp_path / TARGET / "rank_tp0_pp0_dp0.json").stat().st_size,
                   "sha256": digests["json"]}],
        "sidecars": [{"name": "rank_tp0_pp0_dp0.launch", "rank": 0, "sha256": digests["launch"], "content_sha256": FP}],
        "other_files": [], "ranks_present": [0], "provenance": None, "compatible": None, "reasons": []}
    assert keys[1]["key"] == DRAFT and keys[1]["reasons"] == ["no cache for rank 0 (rank_tp0_pp0_dp0.json missing)"]
    assert out.result["unexpected"] == ["0.6.1/sm121/not-a-key"]
    assert out.result["msg"] == f"rank 0: 2 key directories under {tmp_path}"


def test_without_provenance_a_cache_is_not_compatible(tmp_path):
    put_cache(tmp_path, TARGET, 0)
    out = run_module(MODULE, {"root": str(tmp_path), "rank": 0, "expected": PROV})
    entry = out.result["keys"][0]
    assert entry["compatible"] is False
    assert entry["reasons"] == ["no provenance recorded (sparkfleet-provenance.json missing): origin unknown"]


# ---------------------------------------------------------------- provenance

def test_provenance_write_check_mode_idempotence_and_compatibility(tmp_path):
    digests = put_cache(tmp_path, TARGET, 0)
    put_cache(tmp_path, DRAFT, 0)
    put_cache(tmp_path, DRAFT, 1)  # a shared directory: rank 1's files are not this rank's to vouch for
    args = {"root": str(tmp_path), "rank": 0, "state": "provenance", "provenance": PROV, "expected": PROV}
    prov_path = tmp_path / TARGET / "sparkfleet-provenance.json"

    checked = run_module(MODULE, args, check_mode=True, diff=True).result
    assert checked["changed"] is True and not prov_path.exists()
    assert [w["changed"] for w in checked["provenance_written"]] == [True, True]
    assert [k["compatible"] for k in checked["keys"]] == [True, True]  # what they will be once stamped
    after = json.loads(checked["diff"][0]["after"])
    assert checked["diff"][0]["before"] == "" and checked["diff"][0]["before_header"] == str(prov_path)
    assert after == {"schema": "sparkfleet-autotune-provenance/1", "key": TARGET, "rank": 0, "provenance": PROV,
                     "files": {"rank_tp0_pp0_dp0.json": digests["json"], "rank_tp0_pp0_dp0.launch": digests["launch"]}}

    done = run_module(MODULE, args, diff=True).result
    assert done["changed"] is True
    assert json.loads(prov_path.read_text()) == after
    assert done["msg"] == "rank 0: wrote provenance for 2 of 2 key directories holding this rank's cache"
    assert [k["compatible"] for k in done["keys"]] == [True, True]

    again = run_module(MODULE, args, diff=True).result
    assert again["changed"] is False and "diff" not in again

    newer = dict(PROV, image_digest="sha256:" + "b" * 64)
    changed = run_module(MODULE, dict(args, provenance=newer), diff=True).result
    assert changed["changed"] is True
    assert json.loads(changed["diff"][0]["before"])["provenance"] == PROV
    assert json.loads(changed["diff"][0]["after"])["provenance"] == newer


def test_incompatible_and_stale_provenance_reasons(tmp_path):
    put_cache(tmp_path, TARGET, 0)
    run_module(MODULE, {"root": str(tmp_path), "rank": 0, "state": "provenance", "provenance": PROV})
    expected = dict(PROV, image_digest="sha256:" + "c" * 64, flashinfer_version="0.6.2", sm="sm121", cuda="13.0")
    entry = run_module(MODULE, {"root": str(tmp_path), "rank": 0, "expected": expected}).result["keys"][0]
    assert entry["compatible"] is False
    assert entry["reasons"] == [
        "cache directory is for FlashInfer 0.6.1, about to run 0.6.2",
        "provenance lacks cuda",
        "flashinfer_version differs: cache '0.6.1', about to run '0.6.2'",
        f"image_digest differs: cache '{PROV['image_digest']}', about to run '{expected['image_digest']}'",
    ]
    (tmp_path / TARGET / "rank_tp0_pp0_dp0.json").write_text('{"retuned": true}')
    entry = run_module(MODULE, {"root": str(tmp_path), "rank": 0, "expected": PROV}).result["keys"][0]
    assert entry["reasons"] == ["rank_tp0_pp0_dp0.json changed since its provenance was recorded (retuned or edited)"]
    assert entry["compatible"] is False


@pytest.mark.parametrize("args, message", [
    ({"state": "provenance", "rank": 0}, "state is provenance but all of the following are missing: provenance"),
    ({"state": "provenance", "rank": 0, "provenance": {"image_digest": "x", "flashinfer_version": "0.6.1"}},
     "rank 0: provenance lacks engine_version, env_fingerprint (required: image_digest, flashinfer_version, "
     "engine_version, env_fingerprint)."),
    ({"state": "invalidated", "keys": [TARGET]}, "state is invalidated but all of the following are missing: rank"),
    ({"state": "invalidated", "rank": 0, "keys": ["../../etc"]},
     "Bad keys option: key '../../etc' is not a path relative to root of the form <flashinfer_version>/<smXY>/<key16>"),
    ({"state": "invalidated", "rank": 0, "keys": ["0.6.1/sm121/XYZ"]},
     "Bad keys option: key '0.6.1/sm121/XYZ': expected an smXY directory and 16 lowercase hex digits"),
    ({"state": "present", "rank": -1}, "rank must be 0 or more, got -1."),
])
def test_failures_say_what(tmp_path, args, message):
    out = run_module(MODULE, dict(args, root=str(tmp_path)))
    assert out.failed
    assert message in out.result["msg"]


def test_aside_dir_inside_root_is_refused(tmp_path):
    put_cache(tmp_path, TARGET, 0)
    out = run_module(MODULE, {"root": str(tmp_path), "rank": 0, "state": "invalidated", "keys": [TARGET],
                              "aside_dir": str(tmp_path / "aside")})
    assert out.failed
    assert out.result["msg"] == (f"rank 0: aside_dir {tmp_path / 'aside'} is inside root {tmp_path}: the engine would "
                                 f"find the caches again; choose a directory outside root.")
    assert (tmp_path / TARGET / "rank_tp0_pp0_dp0.json").exists()


# ---------------------------------------------------------------- invalidation

def test_invalidate_check_mode_then_move_then_idempotent(tmp_path):
    root = tmp_path / "autotune"
    put_cache(root, TARGET, 0)
    put_cache(root, DRAFT, 0)
    aside = tmp_path / "autotune-aside" / "run-42"
    args = {"root": str(root), "rank": 0, "state": "invalidated", "keys": [TARGET, "0.6.1/sm121/1111111111111111"],
            "aside_dir": str(aside), "reason": "image changed"}
    before = tree(root)

    plan = run_module(MODULE, args, check_mode=True, diff=True).result
    assert plan["changed"] is True
    assert tree(root) == before and not aside.exists()
    assert plan["moves"] == [
        {"key": TARGET, "src": str(root / TARGET), "dest": str(aside / TARGET),
         "files": ["rank_tp0_pp0_dp0.json", "rank_tp0_pp0_dp0.launch"], "state": "planned"},
        {"key": "0.6.1/sm121/1111111111111111", "src": str(root / "0.6.1/sm121/1111111111111111"),
         "dest": str(aside / "0.6.1/sm121/1111111111111111"), "files": [], "state": "absent"}]
    assert plan["diff"] == {
        "before_header": f"{root} (key directories)", "after_header": f"{root} (key directories)",
        "before": f"{TARGET}: rank_tp0_pp0_dp0.json, rank_tp0_pp0_dp0.launch\n"
                  f"{DRAFT}: rank_tp0_pp0_dp0.json, rank_tp0_pp0_dp0.launch\n",
        "after": f"{DRAFT}: rank_tp0_pp0_dp0.json, rank_tp0_pp0_dp0.launch\n"
                 f"moved aside: {TARGET} -> {aside / TARGET}\n"}
    assert [k["key"] for k in plan["keys"]] == [DRAFT]
    assert plan["msg"] == f"rank 0: would move 1 key directory aside to {aside}"

    done = run_module(MODULE, args).result
    assert done["changed"] is True and done["moves"][0]["state"] == "moved"
    assert not (root / TARGET).exists() and (root / DRAFT).exists()
    assert tree(aside) == [f"{TARGET}/rank_tp0_pp0_dp0.json", f"{TARGET}/rank_tp0_pp0_dp0.launch",
                           "sparkfleet-aside.json"]
    manifest = json.loads((aside / "sparkfleet-aside.json").read_text())
    assert [(m["key"], m["to"], m["rank"], m["reason"]) for m in manifest["moves"]] == [
        (TARGET, str(aside / TARGET), 0, "image changed")]
    assert [k["key"] for k in done["keys"]] == [DRAFT]

    again = run_module(MODULE, args, check_mode=True).result
    assert again["changed"] is False and [m["state"] for m in again["moves"]] == ["absent", "absent"]
    assert run_module(MODULE, args).result["changed"] is False


def test_an_existing_destination_is_never_overwritten(tmp_path):
    root, aside = tmp_path / "autotune", tmp_path / "aside"
    put_cache(root, TARGET, 0, tactics="first")
    run_module(MODULE, {"root": str(root), "rank": 0, "state": "invalidated", "keys": [TARGET], "aside_dir": str(aside)})
    put_cache(root, TARGET, 0, tactics="second")  # the engine retuned; invalidate again into the same aside_dir
    out = run_module(MODULE, {"root": str(root), "rank": 0, "state": "invalidated", "keys": [TARGET],
                              "aside_dir": str(aside)}).result
    assert out["moves"][0]["dest"] == str(aside / TARGET) + ".2"
    assert b"first" in (aside / TARGET / "rank_tp0_pp0_dp0.json").read_bytes()
    assert b"second" in (aside / (TARGET + ".2") / "rank_tp0_pp0_dp0.json").read_bytes()
    assert len(json.loads((aside / "sparkfleet-aside.json").read_text())["moves"]) == 2


def test_default_aside_dir_is_a_utc_timestamp_next_to_root(tmp_path):
    root = tmp_path / "flashinfer" / "autotune"
    assert autotune_store.default_aside_dir(str(root), now=0) == str(tmp_path / "flashinfer/autotune-aside/19700101T000000Z")
    put_cache(root, TARGET, 0)
    out = run_module(MODULE, {"root": str(root), "rank": 0, "state": "invalidated", "keys": [TARGET]}).result
    assert out["aside_dir"].startswith(str(tmp_path / "flashinfer/autotune-aside") + os.sep)
    assert Path(out["aside_dir"], TARGET, "rank_tp0_pp0_dp0.json").exists()


@pytest.mark.parametrize("key, normal", [
    ("0.6.1/sm121/0123456789abcdef", "0.6.1/sm121/0123456789abcdef"),
    ("0.6.1/sm121/0123456789abcdef/", "0.6.1/sm121/0123456789abcdef"),
    ("./0.6.1//sm121/0123456789abcdef", "0.6.1/sm121/0123456789abcdef"),
])
def test_validate_key(key, normal):
    assert validate_key(key) == normal


@pytest.mark.parametrize("key", ["", "/abs/sm121/0123456789abcdef", "0.6.1/sm121", "0.6.1/../0123456789abcdef/x",
                                 "0.6.1/gpu/0123456789abcdef", "0.6.1/sm121/0123456789ABCDEF"])
def test_validate_key_rejects(key):
    with pytest.raises(AutotuneError):
        validate_key(key)


# ---------------------------------------------------------------- the fleet rule, end to end

def test_disagreeing_caches_plan_in_check_mode_then_move_aside_on_all_ranks_together(tmp_path):
    """Three hosts. spark1 (rank 0) and spark2 (rank 1) were stamped with this image; spark2's draft cache was
    retuned since (stale); spark3 (rank 2) has a target cache from another launch env and no draft cache.
    Every key must be invalidated on every rank, and check mode must move nothing."""
    hosts = {"spark1": 0, "spark2": 1, "spark3": 2}
    roots = {h: tmp_path / h / ".cache/sglang/flashinfer/autotune" for h in hosts}
    put_cache(roots["spark1"], TARGET, 0)
    put_cache(roots["spark1"], DRAFT, 0)
    put_cache(roots["spark2"], TARGET, 1)
    put_cache(roots["spark2"], DRAFT, 1)
    put_cache(roots["spark3"], TARGET, 2, fingerprint=sha(b"another launch env"))
    for host in ("spark1", "spark2"):
        assert run_module(MODULE, {"root": str(roots[host]), "rank": hosts[host], "state": "provenance",
                                   "provenance": PROV}).result["changed"]
    run_module(MODULE, {"root": str(roots["spark3"]), "rank": 2, "state": "provenance",
                        "provenance": dict(PROV, env_fingerprint=sha(b"another launch env"))})
    put_cache(roots["spark2"], DRAFT, 1, tactics="retuned after stamping")

    inventories = {h: run_module(MODULE, {"root": str(roots[h]), "rank": r, "expected": PROV}).result
                   for h, r in hosts.items()}
    plan = _filter.autotune_plan(inventories, hosts, 3)
    assert plan["usable"] == []
    assert plan["invalidate"] == [TARGET, DRAFT]
    assert plan["reasons"][TARGET] == [
        "rank 2 (spark3): env_fingerprint differs: cache '%s', about to run '%s'" % (sha(b"another launch env"), FP),
        "launch sidecars differ across ranks (rank 0: %s, rank 1: %s, rank 2: %s)" % (FP[:12], FP[:12],
                                                                                        sha(b"another launch env")[:12]),
    ]
    assert plan["reasons"][DRAFT] == [
        "rank 1 (spark2): rank_tp1_pp0_dp0.json changed since its provenance was recorded (retuned or edited)",
        "rank 2 (spark3) has no cache for this key",
    ]

    before = {h: tree(roots[h]) for h in hosts}
    aside = {h: roots[h].parent / "autotune-aside" / "run-20261129T100102Z" for h in hosts}
    for h, r in hosts.items():
        checked = run_module(MODULE, {"root": str(roots[h]), "rank": r, "state": "invalidated",
                                      "keys": plan["invalidate"], "aside_dir": str(aside[h])},
                             check_mode=True, diff=True).result
        assert checked["changed"] is True
        assert [(m["key"], m["state"]) for m in checked["moves"]] == \
            [(TARGET, "planned"), (DRAFT, "planned" if h != "spark3" else "absent")]
        assert checked["keys"] == []
        assert "moved aside: %s -> %s\n" % (TARGET, aside[h] / TARGET) in checked["diff"]["after"]
    assert {h: tree(roots[h]) for h in hosts} == before  # check mode moved nothing anywhere
    assert not any(a.exists() for a in aside.values())

    for h, r in hosts.items():
        done = run_module(MODULE, {"root": str(roots[h]), "rank": r, "state": "invalidated",
                                   "keys": plan["invalidate"], "aside_dir": str(aside[h]),
                                   "reason": "autotune_plan: caches disagree"}).result
        assert done["changed"] is True and done["keys"] == []
    for h, r in hosts.items():
        assert tree(roots[h]) == []  # no rank keeps a cache its peers lack
        assert sorted(before[h]) == sorted(p for p in tree(aside[h]) if p != "sparkfleet-aside.json")
    after = {h: run_module(MODULE, {"root": str(roots[h]), "rank": r, "expected": PROV}).result
             for h, r in hosts.items()}
    assert _filter.autotune_plan(after, hosts, 3) == {
        "usable": [], "invalidate": [], "reasons": {}, "tp": 3, "problems": [],
        "per_rank": {r: {"host": h, "present": [], "missing": [], "incompatible": [], "usable": [], "invalidate": []}
                     for h, r in hosts.items()}}
