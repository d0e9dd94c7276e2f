# Over 600 lines on purpose: the module's behaviour tests in one place (format, check mode, resume, bad input,
# CLI); IO and hostile-input tests have their own files.
"""engram_pack: exact packing (checked against an independent numpy implementation of docs/reference.md section 3),
check mode, free space, resume, invalid shards, verification, bad input, container mode and the CLI."""
from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import socket
import struct
import subprocess
import stat
import sys

import numpy as np
import pytest

from ansible.module_utils import engram_packer as ep
from ansible.module_utils import engram_packer_write as epw
from ansible.module_utils.engram_packer import PackOptions, pack
from tests.conftest import ROOT, load_module
from tests.unit.module_harness import run_module

engram_pack = load_module("engram_pack")


@pytest.fixture(autouse=True)
def _serialization_profile(monkeypatch):
    """ansible-core 2.19 modules also need a serialization profile; the shared harness sets only the
    arguments, so supply the one Ansible sends to legacy modules."""
    from ansible.module_utils import basic
    monkeypatch.setattr(basic, "_ANSIBLE_PROFILE", "legacy")

HOST = socket.gethostname()
MU = ROOT / "module_utils"


def _testbed_checkpoint():
    spec = importlib.util.spec_from_file_location("sparkfleet_testbed_checkpoint", ROOT / "testbed" / "checkpoint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tbc = _testbed_checkpoint()


# ------------------------------------------------------------------ independent reference implementation

def _tensor(ckpt_dir, name):
    """Read one tensor with plain json/struct/numpy (no project code)."""
    with open(os.path.join(ckpt_dir, "model.safetensors.index.json")) as handle:
        shard = json.load(handle)["weight_map"][name]
    with open(os.path.join(ckpt_dir, shard), "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
        begin, end = header[name]["data_offsets"]
        handle.seek(8 + length + begin)
        data = handle.read(end - begin)
    return np.frombuffer(data, dtype=np.uint8).reshape(header[name]["shape"])


@functools.lru_cache(maxsize=64)
def reference_shard(ckpt_dir: str, layer: int, rank: int, tp: int) -> bytes:
    weight = _tensor(ckpt_dir, "layers.%d.engram.embed.weight" % layer)
    scale = _tensor(ckpt_dir, "layers.%d.engram.embed.scale" % layer)
    n = weight.shape[0]
    lo, hi = n * rank // tp, n * (rank + 1) // tp
    header = np.zeros(512, dtype="<u8")
    header[:6] = [0x31344E4531565344, layer, lo, hi, n, 264]
    rows = np.concatenate([weight[lo:hi], scale[lo:hi]], axis=1)
    return header.tobytes() + np.ascontiguousarray(rows).tobytes()


def sha(path) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def listing(path) -> dict:
    """name -> (size, sha256) of every file under ``path``."""
    out = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            out[os.path.relpath(full, path)] = (os.path.getsize(full), sha(full))
    return out


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory):
    """The default synthetic checkpoint (48 shards, N = 120003 and 96001). Read-only for every test."""
    path = str(tmp_path_factory.mktemp("ckpt"))
    tbc.make_checkpoint(path)
    return path


@pytest.fixture
def small_ckpt(tmp_path):
    """A small private checkpoint a test may damage."""
    path = str(tmp_path / "ckpt")
    tbc.make_checkpoint(path, rows={1: 3001, 14: 2003}, shards=6, seed=7)
    return path


def args(ckpt_dir, dest, rank, tp, **extra):
    base = {"checkpoint": ckpt_dir, "dest": str(dest), "rank": rank, "tp": tp, "margin_bytes": 0, "nice": False}
    base.update(extra)
    return base


def opts(ckpt_dir, dest, rank, tp, **extra):
    base = dict(checkpoint=ckpt_dir, dest=str(dest), rank=rank, tp=tp, margin_bytes=0, nice=False)
    base.update(extra)
    return PackOptions(**base)


# ---------------------------------------------------------------------------------------- packing

def test_module_packs_every_rank_of_tp3_byte_identical(ckpt, tmp_path):
    for rank in range(3):
        dest = tmp_path / ("r%d" % rank)
        dest.mkdir()
        res = run_module(engram_pack, args(ckpt, dest, rank, 3, chunk_rows=5000))
        assert not res.failed, res.result["msg"]
        r = res.result
        assert r["changed"] is True
        assert [s["layer"] for s in r["shards"]] == [1, 14]
        for shard in r["shards"]:
            ref = reference_shard(ckpt, shard["layer"], rank, 3)
            with open(shard["path"], "rb") as handle:
                assert handle.read() == ref
            n = {1: 120003, 14: 96001}[shard["layer"]]
            assert (shard["lo"], shard["hi"], shard["n"]) == (n * rank // 3, n * (rank + 1) // 3, n)
            assert shard["bytes"] == len(ref) == 4096 + shard["rows"] * 264
            assert (shard["state_before"], shard["state_after"], shard["action"]) == ("absent", "valid", "write")
            assert shard["written_bytes"] == shard["bytes"] and shard["verified_rows"] == 1024
            assert shard["seconds"] > 0 and shard["mb_per_s"] > 0
            assert shard["path"] == str(dest / ("engram-l%d-r%dof3.bin" % (shard["layer"], rank)))
        assert r["required_bytes"] == sum(s["bytes"] for s in r["shards"])
        assert isinstance(r["available_bytes"], int) and r["available_bytes"] > 0
        assert sorted(os.listdir(dest)) == sorted(
            ["engram-l1-r%dof3.bin" % rank, "engram-l14-r%dof3.bin" % rank,
             "engram-l1-r%dof3.progress.json" % rank, "engram-l14-r%dof3.progress.json" % rank])


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_every_rank_of_tp_byte_identical_and_covering(ckpt, tmp_path, tp):
    for layer in (1, 14):
        full = reference_shard(ckpt, layer, 0, 1)[4096:]
        rows = []
        for rank in range(tp):
            dest = tmp_path / ("l%d-r%d" % (layer, rank))
            dest.mkdir()
            result = pack(opts(ckpt, dest, rank, tp, layers=[layer], chunk_rows=777))
            data = open(result["shards"][0]["path"], "rb").read()
            assert data == reference_shard(ckpt, layer, rank, tp)
            rows.append(data[4096:])
        assert b"".join(rows) == full  # the ranks cover [0, N) exactly, in order


def test_second_run_changes_nothing(ckpt, tmp_path):
    run_module(engram_pack, args(ckpt, tmp_path, 1, 3))
    before = {name: os.stat(tmp_path / name).st_mtime_ns for name in os.listdir(tmp_path)}
    res = run_module(engram_pack, args(ckpt, tmp_path, 1, 3), diff=True)
    assert not res.failed and res.result["changed"] is False
    assert [s["action"] for s in res.result["shards"]] == ["skip", "skip"]
    assert [s["state_before"] for s in res.result["shards"]] == ["valid", "valid"]
    assert res.result["required_bytes"] == 0
    assert {name: os.stat(tmp_path / name).st_mtime_ns for name in os.listdir(tmp_path)} == before
    assert "are valid" in res.result["msg"]


def test_progress_file_is_marked_done(ckpt, tmp_path):
    result = pack(opts(ckpt, tmp_path, 2, 3, layers=[14]))
    with open(result["shards"][0]["progress_path"]) as handle:
        progress = json.load(handle)
    assert progress["state"] == "done"
    assert progress["rows_done"] == progress["rows_total"] == 96001 - 64000
    assert progress["bytes_done"] == progress["bytes_total"] == result["shards"][0]["bytes"]
    assert progress["host"] == HOST and progress["layer"] == 14 and progress["percent"] == 100.0
    assert {"bytes_per_s", "eta_s", "elapsed_s", "updated"} <= set(progress)


# ------------------------------------------------------------------------------------- check mode

def test_check_mode_writes_nothing_and_predicts(ckpt, tmp_path):
    res = run_module(engram_pack, args(ckpt, tmp_path, 0, 3), check_mode=True, diff=True)
    assert not res.failed
    r = res.result
    assert r["changed"] is True and os.listdir(tmp_path) == []
    assert r["required_bytes"] == (4096 + 40001 * 264) + (4096 + 32000 * 264)
    assert [s["state_after"] for s in r["shards"]] == ["valid", "valid"]
    assert [s["written_bytes"] for s in r["shards"]] == [0, 0]
    assert r["summary"] == ["engram-l1-r0of3.bin: absent -> valid (40001 rows, 10564360 bytes)",
                            "engram-l14-r0of3.bin: absent -> valid (32000 rows, 8452096 bytes)"]
    assert r["diff"] == {"before": "engram-l1-r0of3.bin: absent\nengram-l14-r0of3.bin: absent\n",
                         "after": "engram-l1-r0of3.bin: valid (40001 rows, 10564360 bytes)\n"
                                  "engram-l14-r0of3.bin: valid (32000 rows, 8452096 bytes)\n"}
    assert r["msg"].startswith("Would pack")
    # without --diff no diff key; after a real run check mode reports no change
    assert "diff" not in run_module(engram_pack, args(ckpt, tmp_path, 0, 3), check_mode=True).result
    run_module(engram_pack, args(ckpt, tmp_path, 0, 3))
    res = run_module(engram_pack, args(ckpt, tmp_path, 0, 3), check_mode=True)
    assert res.result["changed"] is False and res.result["required_bytes"] == 0


@pytest.mark.parametrize("check_mode", [False, True])
def test_refuses_when_space_is_short(ckpt, tmp_path, monkeypatch, check_mode):
    required = (4096 + 40001 * 264) + (4096 + 32000 * 264)
    margin = 1 << 30
    monkeypatch.setattr(ep, "available_bytes", lambda path: required + margin - 1)
    res = run_module(engram_pack, args(ckpt, tmp_path, 1, 3, margin_bytes=margin), check_mode=check_mode)
    assert res.failed
    r = res.result
    assert r["required_bytes"] == required and r["available_bytes"] == required + margin - 1
    msg = r["msg"]
    for needle in (HOST, str(tmp_path), str(required), str(required + margin - 1), "free at least 1 bytes",
                   "Not enough free space"):
        assert needle in msg
    assert os.listdir(tmp_path) == []
    # exactly enough is enough
    monkeypatch.setattr(ep, "available_bytes", lambda path: required + margin)
    assert not run_module(engram_pack, args(ckpt, tmp_path, 1, 3, margin_bytes=margin), check_mode=True).failed


# --------------------------------------------------------------------------------------- resume

def _make_partial(ckpt, dest, layer, rank, tp, rows, tail=b"", chunk=1000, record=True):
    """A partial as a killed pack leaves it: ``rows`` rows, and (``record``) its source record listing
    the crc32 of each chunk of ``chunk`` rows."""
    import zlib
    ref = reference_shard(ckpt, layer, rank, tp)
    path = os.path.join(str(dest), "engram-l%d-r%dof%d.partial" % (layer, rank, tp))
    with open(path, "wb") as handle:
        handle.write(ref[:4096 + rows * 264] + tail)
    if record:
        source = ep.load_sources(ckpt, [layer])[layer]
        lo, hi = source.n * rank // tp, source.n * (rank + 1) // tp
        chunks = [[start, min(chunk, rows - start), zlib.crc32(ref[4096 + start * 264:4096 + min(start + chunk, rows) * 264])]
                  for start in range(0, rows, chunk)]
        ep.write_source_record(path, source, lo, hi, chunks)
    return path, ref


def test_resume_counts_held_bytes_and_finishes_identical(ckpt, tmp_path):
    path, ref = _make_partial(ckpt, tmp_path, 1, 1, 3, 12345, tail=b"\x01" * 100, chunk=4000)  # torn last row
    res = run_module(engram_pack, args(ckpt, tmp_path, 1, 3, layers=[1], chunk_rows=4000), check_mode=True)
    shard = res.result["shards"][0]
    assert (shard["state_before"], shard["action"], shard["resume_rows"]) == ("partial", "resume", 12345)
    assert shard["required_bytes"] == res.result["required_bytes"] == len(ref) - (4096 + 12345 * 264)
    assert "resumable at row 12345 of 40001" in shard["reason_before"]
    assert os.path.getsize(path) == 4096 + 12345 * 264 + 100  # check mode left it alone
    res = run_module(engram_pack, args(ckpt, tmp_path, 1, 3, layers=[1], chunk_rows=4000))
    assert not res.failed
    shard = res.result["shards"][0]
    assert shard["resume_rows"] == 12345 and shard["written_bytes"] == len(ref) - (4096 + 12345 * 264)
    assert open(shard["path"], "rb").read() == ref and not os.path.exists(path)


def test_resume_backs_off_past_a_corrupt_tail(ckpt, tmp_path):
    path, ref = _make_partial(ckpt, tmp_path, 14, 0, 3, 10000)
    with open(path, "r+b") as handle:  # damage row 9990: the last chunk of 1000 rows no longer matches
        handle.seek(4096 + 9990 * 264 + 3)
        handle.write(b"\xAA\xBB")
    result = pack(opts(ckpt, tmp_path, 0, 3, layers=[14], chunk_rows=1000))
    assert result["shards"][0]["resume_rows"] == 9000
    assert open(result["shards"][0]["path"], "rb").read() == ref


def test_partial_that_matches_nowhere_restarts(ckpt, tmp_path):
    path, ref = _make_partial(ckpt, tmp_path, 14, 0, 3, 10000)
    with open(path, "r+b") as handle:
        handle.seek(4096)
        handle.write(b"\x55" * (10000 * 264))
    result = pack(opts(ckpt, tmp_path, 0, 3, layers=[14], chunk_rows=1000))
    assert result["shards"][0]["resume_rows"] == 0
    assert "no chunk that matches its record" in result["shards"][0]["reason_before"]
    assert open(result["shards"][0]["path"], "rb").read() == ref


def test_partial_of_another_range_restarts(ckpt, tmp_path):
    other = reference_shard(ckpt, 1, 0, 2)  # a TP2 partial renamed into the TP3 name
    (tmp_path / "engram-l1-r0of3.partial").write_bytes(other[:4096 + 5000 * 264])
    result = pack(opts(ckpt, tmp_path, 0, 3, layers=[1]))
    shard = result["shards"][0]
    assert shard["resume_rows"] == 0 and shard["required_bytes"] == shard["bytes"]
    assert "another range" in shard["reason_before"]
    assert open(shard["path"], "rb").read() == reference_shard(ckpt, 1, 0, 3)


def test_no_resume_restarts_and_complete_partial_is_finished(ckpt, tmp_path):
    _make_partial(ckpt, tmp_path, 1, 2, 3, 20000)
    result = pack(opts(ckpt, tmp_path, 2, 3, layers=[1], resume=False))
    shard = result["shards"][0]
    assert shard["resume_rows"] == 0 and shard["written_bytes"] == shard["bytes"]
    os.unlink(shard["path"])

    class Killed(BaseException):
        pass

    def killed(*_):
        raise Killed()
    original, epw.verify_shard = epw.verify_shard, killed  # killed while verifying: whole partial, before the rename
    try:
        with pytest.raises(Killed):
            pack(opts(ckpt, tmp_path, 2, 3, layers=[1]))
    finally:
        epw.verify_shard = original
    result = pack(opts(ckpt, tmp_path, 2, 3, layers=[1]))
    shard = result["shards"][0]
    assert (shard["action"], shard["required_bytes"], shard["written_bytes"]) == ("finish", 0, 0)
    assert result["changed"] is True
    assert open(shard["path"], "rb").read() == reference_shard(ckpt, 1, 2, 3)


# ------------------------------------------------------------------------------- invalid shards

@pytest.mark.parametrize("check_mode", [False, True])
def test_invalid_bin_is_never_overwritten_silently(ckpt, tmp_path, check_mode):
    ref = reference_shard(ckpt, 1, 0, 3)
    target = tmp_path / "engram-l1-r0of3.bin"
    target.write_bytes(ref[:-264])  # truncated by one row
    res = run_module(engram_pack, args(ckpt, tmp_path, 0, 3, layers=[1]), check_mode=check_mode)
    assert res.failed
    assert "exists but is invalid" in res.result["msg"] and "is truncated" in res.result["msg"]
    assert "replace_invalid" in res.result["msg"] and str(target) in res.result["msg"] and HOST in res.result["msg"]
    assert res.result["shards"][0]["state_before"] == "invalid"
    assert target.read_bytes() == ref[:-264] and sorted(os.listdir(tmp_path)) == ["engram-l1-r0of3.bin"]
    res = run_module(engram_pack, args(ckpt, tmp_path, 0, 3, layers=[1], replace_invalid=True), diff=True)
    assert not res.failed and res.result["shards"][0]["action"] == "replace"
    assert target.read_bytes() == ref
    assert "engram-l1-r0of3.bin: invalid (is truncated" in res.result["diff"]["before"]


def test_valid_bin_with_stale_partial_is_skipped(ckpt, tmp_path):
    pack(opts(ckpt, tmp_path, 1, 3, layers=[14]))
    stale = tmp_path / "engram-l14-r1of3.partial"
    stale.write_bytes(b"old")
    result = pack(opts(ckpt, tmp_path, 1, 3, layers=[14]))
    assert result["changed"] is False and "stale" in result["shards"][0]["reason_before"]
    assert stale.read_bytes() == b"old"


# ---------------------------------------------------------------------------------- verification

def test_sample_indices_spread_first_and_last():
    idx = ep.sample_indices(40001)
    assert len(idx) >= 1000 and idx[0] == 0 and idx[-1] == 40000 and idx == sorted(set(idx))
    assert max(b - a for a, b in zip(idx, idx[1:])) <= 40001 // 1000
    assert ep.sample_indices(17) == list(range(17))


@pytest.mark.parametrize("mode, rows", [("none", 0), ("sample", 1024), ("full", 32000)])
def test_verify_modes(ckpt, tmp_path, mode, rows):
    result = pack(opts(ckpt, tmp_path, 1, 3, layers=[14], verify=mode, chunk_rows=3000))
    assert result["shards"][0]["verified_rows"] == rows and result["shards"][0]["verify"] == mode


@pytest.mark.parametrize("mode", ["sample", "full"])
def test_verification_failure_keeps_no_bin(ckpt, tmp_path, monkeypatch, mode):
    real_stream = epw._stream

    def stream_then_flip(plan, source, options, pfd, progress):
        real_stream(plan, source, options, pfd, progress)
        os.pwrite(pfd, b"\xEE", 4096 + (plan.rows - 1) * 264 + 260)  # last row's scale byte (always sampled)

    monkeypatch.setattr(epw, "_stream", stream_then_flip)
    res = run_module(engram_pack, args(ckpt, tmp_path, 1, 3, layers=[1], verify=mode))
    assert res.failed and "Verification failed" in res.result["msg"]
    assert "row 40000 (absolute 80001) differs" in res.result["msg"]
    assert sorted(os.listdir(tmp_path)) == ["engram-l1-r1of3.partial.rejected", "engram-l1-r1of3.progress.json"]


# ------------------------------------------------------------------------------------- bad input

def _index_without(ckpt_dir, name):
    path = os.path.join(ckpt_dir, "model.safetensors.index.json")
    doc = json.load(open(path))
    del doc["weight_map"][name]
    json.dump(doc, open(path, "w"))


def _rewrite(ckpt_dir, layer, mutate):
    with open(os.path.join(ckpt_dir, "model.safetensors.index.json")) as handle:
        shard = json.load(handle)["weight_map"]["layers.%d.engram.embed.weight" % layer]
    tbc.rewrite_header(os.path.join(ckpt_dir, shard), mutate)


def _set(name, **fields):
    def mutate(header):
        header[name].update(fields)
        return header
    return mutate


def _scale_one_row_short(header):
    """Scale of layer 14 one row (8 bytes) shorter, the tensor after it 8 bytes longer: still a well formed
    file (the tensors cover the data section), but the weight and scale row counts differ."""
    scale = header["layers.14.engram.embed.scale"]
    begin, end = scale["data_offsets"]
    scale.update(shape=[scale["shape"][0] - 1, 8], data_offsets=[begin, end - 8])
    after = next(e for k, e in header.items() if k != "__metadata__" and e["data_offsets"][0] == end)
    itemsize = {"BF16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1}[after["dtype"]]
    assert len(after["shape"]) == 1
    after.update(shape=[after["shape"][0] + 8 // itemsize], data_offsets=[end - 8, after["data_offsets"][1]])
    return header


BAD_INPUT = {
    "missing checkpoint": (lambda c, d: shutil.rmtree(c), {}, "checkpoint directory"),
    "missing index": (lambda c, d: os.unlink(os.path.join(c, "model.safetensors.index.json")), {},
                      "checkpoint index missing"),
    "missing tensor": (lambda c, d: _index_without(c, "layers.14.engram.embed.scale"), {},
                       "layers.14.engram.embed.scale is missing from the checkpoint index"),
    "missing shard file": (lambda c, d: os.unlink(os.path.join(c, "model-00001-of-00006.safetensors")), {},
                           "model-00001-of-00006.safetensors, which the index names"),
    "wrong dtype": (lambda c, d: _rewrite(c, 1, _set("layers.1.engram.embed.weight", dtype="F8_E5M2")), {},
                    "has dtype F8_E5M2, expected F8_E4M3"),
    "wrong scale dtype": (lambda c, d: _rewrite(c, 1, _set("layers.1.engram.embed.scale", dtype="U8")), {},
                          "has dtype U8, expected F8_E8M0"),
    "wrong shape": (lambda c, d: _rewrite(c, 1, _set("layers.1.engram.embed.weight", shape=[6002, 128])), {},
                    "has shape [6002, 128], expected [N, 256]"),
    "rows differ": (lambda c, d: _rewrite(c, 14, _scale_one_row_short), {}, "weight has 2003 rows but scale has 2002"),
    "corrupt header json": (lambda c, d: tbc.corrupt_header(os.path.join(c, "model-00001-of-00006.safetensors")),
                            {}, "not valid JSON"),
    "corrupt header utf8": (lambda c, d: tbc.corrupt_header(os.path.join(c, "model-00001-of-00006.safetensors"),
                                                            "utf8"), {}, "not UTF-8"),
    "hostile header length": (lambda c, d: tbc.corrupt_header(os.path.join(c, "model-00001-of-00006.safetensors"),
                                                              "length"), {}, "exceeds"),
    "truncated shard": (lambda c, d: tbc.corrupt_header(os.path.join(c, "model-00006-of-00006.safetensors"),
                                                        "truncate"), {}, "runs past the end"),
    "offsets past the file": (lambda c, d: tbc.corrupt_header(os.path.join(c, "model-00001-of-00006.safetensors"),
                                                              "offsets"), {}, "past the data section"),
    "tp zero": (None, {"tp": 0}, "tp=0: tensor parallel size must be at least 1"),
    "rank equals tp": (None, {"rank": 3}, "rank=3 is out of range for tp=3"),
    "negative rank": (None, {"rank": -1}, "rank=-1 is out of range"),
    "no layers": (None, {"layers": []}, "No layers given"),
    "duplicate layers": (None, {"layers": [1, 1]}, "duplicates"),
    "chunk rows zero": (None, {"chunk_rows": 0}, "chunk_rows=0 must be between"),
    "negative margin": (None, {"margin_bytes": -1}, "margin_bytes=-1"),
    "dest missing": (lambda c, d: shutil.rmtree(d), {}, "does not exist on"),
    "dest is a file": (lambda c, d: (shutil.rmtree(d), open(d, "w").close()), {}, "is not a directory"),
    "dest dangling symlink": (lambda c, d: (shutil.rmtree(d), os.symlink(d + "-gone", d)), {}, "dangling symlink"),
    "dest full": ("full", {}, "Not enough free space"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
@pytest.mark.parametrize("check_mode", [False, True])
def test_bad_input_fails_clearly_writes_and_deletes_nothing(small_ckpt, tmp_path, monkeypatch, case, check_mode):
    damage, extra, needle = BAD_INPUT[case]
    dest = str(tmp_path / "engram")
    os.mkdir(dest)
    (tmp_path / "engram" / "keep.txt").write_text("operator file")
    if damage == "full":
        monkeypatch.setattr(ep, "available_bytes", lambda path: 4096)
    elif damage is not None:
        damage(small_ckpt, dest)
    ckpt_before = listing(small_ckpt) if os.path.isdir(small_ckpt) else None
    dest_before = listing(dest) if os.path.isdir(dest) else None
    module_args = args(small_ckpt, dest, 1, 3)
    module_args.update(extra)
    res = run_module(engram_pack, module_args, check_mode=check_mode)
    assert res.failed, res.result
    assert needle in res.result["msg"], res.result["msg"]
    for key in ("required_bytes", "available_bytes", "shards"):
        assert key in res.result
    if ckpt_before is not None:
        assert listing(small_ckpt) == ckpt_before
    if dest_before is not None:
        assert listing(dest) == dest_before


def test_dest_symlink_into_another_volume(small_ckpt, tmp_path):
    other = "/dev/shm"
    if not os.path.isdir(other) or os.stat(other).st_dev == os.stat(str(tmp_path)).st_dev:
        pytest.skip("needs a second filesystem at /dev/shm")
    target = os.path.join(other, "sparkfleet-test-%d" % os.getpid())
    os.mkdir(target)
    try:
        link = tmp_path / "engram"
        os.symlink(target, str(link))
        res = run_module(engram_pack, args(small_ckpt, link, 0, 3))
        assert res.failed and "is a symlink into another volume" in res.result["msg"]
        assert os.listdir(target) == []
    finally:
        shutil.rmtree(target)


def test_dest_symlink_on_the_same_volume_is_fine(small_ckpt, tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(str(tmp_path / "real"), str(tmp_path / "engram"))
    res = run_module(engram_pack, args(small_ckpt, tmp_path / "engram", 0, 3))
    assert not res.failed and len(os.listdir(tmp_path / "real")) == 4


def test_read_only_destination(small_ckpt, tmp_path, monkeypatch):
    monkeypatch.setattr(ep, "dest_writable_problem", lambda dest: "it is on a read-only filesystem")
    res = run_module(engram_pack, args(small_ckpt, tmp_path, 0, 3), check_mode=True)
    assert res.failed and "read-only filesystem" in res.result["msg"]


def test_a_second_packer_in_the_same_directory_is_refused(small_ckpt, tmp_path):
    dest = tmp_path / "engram"
    dest.mkdir()
    fd = os.open(str(dest), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        res = run_module(engram_pack, args(small_ckpt, dest, 0, 3))
        assert res.failed and "Another Engram pack is running" in res.result["msg"]
        assert os.listdir(dest) == []
    finally:
        os.close(fd)


def test_module_argument_rules(small_ckpt, tmp_path):
    res = run_module(engram_pack, {"dest": str(tmp_path), "rank": 0, "tp": 3})
    assert res.failed and "one of the following is required" in res.result["msg"]
    res = run_module(engram_pack, args(small_ckpt, tmp_path, 0, 3, checkpoint_volume="dsv41-weights",
                                       container_image="img"))
    assert res.failed and "mutually exclusive" in res.result["msg"]
    res = run_module(engram_pack, {"dest": str(tmp_path), "rank": 0, "tp": 3, "checkpoint_volume": "v"})
    assert res.failed and "container_image" in res.result["msg"]


# ------------------------------------------------------------------------------------ container mode

@pytest.fixture
def packer_dir(tmp_path):
    path = tmp_path / "packer"
    path.mkdir()
    for name in ep.PACKER_FILES:
        shutil.copy(str(MU / name), str(path / name))
    return path


def container_args(dest, packer_dir, **extra):
    base = {"checkpoint_volume": "dsv41-weights", "container_image": "dsv41-3x-spark:local", "dest": str(dest),
            "rank": 1, "tp": 3, "packer_dir": str(packer_dir), "margin_bytes": 0}
    base.update(extra)
    return base


def expected_argv(dest, packer_dir, extra=()):
    return (["/usr/bin/docker", "run", "--rm", "--name", "sparkfleet-pack-l1-14-r1", "--network", "none",
             "-v", "dsv41-weights:/models/DeepSeek-V4.1-Flash:ro", "-v", "%s:/engram" % dest,
             "-v", "%s:/opt/sparkfleet-packer:ro" % packer_dir, "--entrypoint", "python3", "dsv41-3x-spark:local",
             "/opt/sparkfleet-packer/engram_packer.py", "--checkpoint", "/models/DeepSeek-V4.1-Flash",
             "--dest", "/engram", "--rank", "1", "--tp", "3", "--layers", "1,14", "--margin-bytes", "0",
             "--chunk-rows", "16384", "--verify", "sample", "--nice"] + list(extra)
            + ["--host-label", HOST, "--json"])


def container_result(failed=False):
    shards = [{"layer": layer, "path": "/engram/engram-l%d-r1of3.bin" % layer,
               "partial_path": "/engram/engram-l%d-r1of3.partial" % layer,
               "progress_path": "/engram/engram-l%d-r1of3.progress.json" % layer, "lo": 40001, "hi": 80002,
               "rows": 40001, "bytes": 10564360, "state_before": "absent", "state_after": "valid"}
              for layer in (1, 14)]
    doc = {"changed": not failed, "failed": failed, "shards": shards, "required_bytes": 21128720,
           "available_bytes": 5, "dest": "/engram", "host": HOST,
           "msg": ("Not enough free space on %s for rank 1 of tp 3's Engram shards in /engram: ... "
                   "see /engram/engram-l1-r1of3.partial." % HOST) if failed else "Packed"}
    return "progress noise\n" + json.dumps(doc) + "\n"


@pytest.mark.parametrize("check_mode", [False, True])
def test_container_mode_argv_and_translation(tmp_path, packer_dir, monkeypatch, check_mode):
    dest = tmp_path / "engram"
    dest.mkdir()
    calls = []
    monkeypatch.setattr(engram_pack.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: "/usr/bin/" + name)
    monkeypatch.setattr(engram_pack.AnsibleModule, "run_command",
                        lambda self, argv, **kw: calls.append(argv) or (0, container_result(), ""))
    monkeypatch.setattr(engram_pack, "available_bytes", lambda path: 123456789)
    res = run_module(engram_pack, container_args(dest, packer_dir, nice=True), check_mode=check_mode)
    assert not res.failed, res.result
    assert calls == [expected_argv(dest, packer_dir, ["--check"] if check_mode else [])]
    r = res.result
    assert [s["path"] for s in r["shards"]] == [str(dest / "engram-l1-r1of3.bin"), str(dest / "engram-l14-r1of3.bin")]
    assert r["shards"][0]["partial_path"] == str(dest / "engram-l1-r1of3.partial")
    assert r["shards"][1]["progress_path"] == str(dest / "engram-l14-r1of3.progress.json")
    assert r["available_bytes"] == 123456789 and r["required_bytes"] == 21128720
    assert r["dest"] == str(dest) and r["checkpoint"] == "dsv41-weights:/models/DeepSeek-V4.1-Flash"
    assert r["container"]["name"] == "sparkfleet-pack-l1-14-r1" and r["container"]["rc"] == 0


def test_container_mode_options_in_argv(tmp_path, packer_dir, monkeypatch):
    dest = tmp_path / "engram"
    dest.mkdir()
    calls = []
    monkeypatch.setattr(engram_pack.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: "/usr/bin/" + name)
    monkeypatch.setattr(engram_pack.AnsibleModule, "run_command",
                        lambda self, argv, **kw: calls.append(argv) or (0, container_result(), ""))
    run_module(engram_pack, container_args(dest, packer_dir, layers=[14], rank=2, tp=4, nice=False, resume=False,
                                           replace_invalid=True, verify="full", chunk_rows=65536,
                                           container_checkpoint_path="/models/x", margin_bytes=7))
    argv = calls[0]
    assert argv[argv.index("--name") + 1] == "sparkfleet-pack-l14-r2"
    assert "dsv41-weights:/models/x:ro" in argv
    tail = argv[argv.index("/opt/sparkfleet-packer/engram_packer.py"):]
    assert tail == ["/opt/sparkfleet-packer/engram_packer.py", "--checkpoint", "/models/x", "--dest", "/engram",
                    "--rank", "2", "--tp", "4", "--layers", "14", "--margin-bytes", "7", "--chunk-rows", "65536",
                    "--verify", "full", "--no-resume", "--replace-invalid", "--host-label", HOST, "--json"]


def test_container_mode_failures(tmp_path, packer_dir, monkeypatch):
    dest = tmp_path / "engram"
    dest.mkdir()
    monkeypatch.setattr(engram_pack.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: "/usr/bin/" + name)
    monkeypatch.setattr(engram_pack, "available_bytes", lambda path: 42)
    monkeypatch.setattr(engram_pack.AnsibleModule, "run_command",
                        lambda self, argv, **kw: (1, container_result(failed=True), ""))
    res = run_module(engram_pack, container_args(dest, packer_dir))
    assert res.failed
    assert "in %s:" % dest in res.result["msg"] and "see %s/engram-l1-r1of3.partial" % dest in res.result["msg"]
    assert res.result["available_bytes"] == 42 and res.result["required_bytes"] == 21128720
    assert res.result["shards"][0]["path"] == str(dest / "engram-l1-r1of3.bin")
    monkeypatch.setattr(engram_pack.AnsibleModule, "run_command",
                        lambda self, argv, **kw: (125, "", "docker: Error: No such volume: dsv41-weights.\n"))
    res = run_module(engram_pack, container_args(dest, packer_dir))
    assert res.failed and "rc=125" in res.result["msg"] and "No such volume" in res.result["msg"]
    assert res.result["available_bytes"] == 42
    os.unlink(str(packer_dir / "engram_format.py"))
    res = run_module(engram_pack, container_args(dest, packer_dir))
    assert res.failed and "missing engram_format.py" in res.result["msg"]


def test_container_mode_without_docker(tmp_path, packer_dir, monkeypatch):
    monkeypatch.setattr(engram_pack.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: None)
    res = run_module(engram_pack, container_args(tmp_path, packer_dir))
    assert res.failed and "docker is not installed" in res.result["msg"]


def test_container_mode_end_to_end_with_a_fake_docker(ckpt, tmp_path, packer_dir, monkeypatch):
    """run_command plays docker: it maps the volumes onto host paths and runs the real packer CLI."""
    dest = tmp_path / "engram"
    dest.mkdir()
    monkeypatch.setattr(engram_pack.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: "/usr/bin/" + name)

    def fake_docker(self, argv, **kwargs):
        cmd = argv[argv.index("--entrypoint") + 3:]  # after python3 and the image: the script and its args
        mapping = {"/models/DeepSeek-V4.1-Flash": ckpt, "/engram": str(dest), "/opt/sparkfleet-packer": str(packer_dir)}
        cmd = [mapping.get(a, a) for a in cmd]
        cmd[0] = str(packer_dir / "engram_packer.py")
        proc = subprocess.run([sys.executable, "-I"] + cmd, capture_output=True, text=True)
        out = proc.stdout.replace(str(dest), "/engram")  # what the packer would have printed inside
        return proc.returncode, out, proc.stderr

    monkeypatch.setattr(engram_pack.AnsibleModule, "run_command", fake_docker)
    res = run_module(engram_pack, container_args(dest, packer_dir, nice=False))
    assert not res.failed, res.result["msg"]
    for shard in res.result["shards"]:
        assert shard["path"].startswith(str(dest) + "/")
        assert open(shard["path"], "rb").read() == reference_shard(ckpt, shard["layer"], 1, 3)
    res = run_module(engram_pack, container_args(dest, packer_dir, nice=False), check_mode=True)
    assert not res.failed and res.result["changed"] is False


def test_container_mode_ships_its_own_packer_byte_identical(ckpt, tmp_path, monkeypatch):
    """Without packer_dir the module writes the packer it was shipped with to a private folder, mounts it,
    and removes it: what runs in the container is module_utils byte for byte (issue 25 item 2)."""
    dest = tmp_path / "engram"
    dest.mkdir()
    monkeypatch.setattr(engram_pack.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: "/usr/bin/" + name)
    seen = {}

    def fake_docker(self, argv, **kwargs):
        mounts = {}  # container path -> host path, from each "-v HOST:CONTAINER[:ro]"
        for i, arg in enumerate(argv):
            if arg == "-v":
                host_path, container_path = argv[i + 1].split(":")[:2]
                mounts[container_path] = host_path
        packer = mounts["/opt/sparkfleet-packer"]
        seen["dir"] = packer
        seen["files"] = {name: open(os.path.join(packer, name), "rb").read() for name in os.listdir(packer)}
        seen["mode"] = stat.S_IMODE(os.stat(packer).st_mode)
        cmd = argv[argv.index("--entrypoint") + 3:]
        mapping = {"/models/DeepSeek-V4.1-Flash": ckpt, "/engram": str(dest)}
        cmd = [mapping.get(a, a) for a in cmd]
        cmd[0] = os.path.join(packer, "engram_packer.py")
        proc = subprocess.run([sys.executable, "-I"] + cmd, capture_output=True, text=True)
        return proc.returncode, proc.stdout.replace(str(dest), "/engram"), proc.stderr

    monkeypatch.setattr(engram_pack.AnsibleModule, "run_command", fake_docker)
    args = container_args(dest, "unused", nice=False, layers=[14])
    del args["packer_dir"]
    res = run_module(engram_pack, args)
    assert not res.failed, res.result["msg"]
    assert sorted(seen["files"]) == sorted(ep.PACKER_FILES) and seen["mode"] == 0o755
    for name, data in seen["files"].items():
        assert data == (MU / name).read_bytes(), name
    assert not os.path.exists(seen["dir"])  # removed after the run
    assert open(res.result["shards"][0]["path"], "rb").read() == reference_shard(ckpt, 14, 1, 3)


def test_the_tree_holds_no_symlink_and_roles_ship_module_utils():
    """No symlink is tracked (issue 25 item 2); the bench client role copies its files from module_utils."""
    proc = subprocess.run(["git", "ls-files", "-s"], cwd=str(ROOT), capture_output=True, text=True)
    if proc.returncode == 0:
        links = [line.split("\t", 1)[1] for line in proc.stdout.splitlines() if line.startswith("120000 ")]
    else:  # not a git checkout: walk it (the venv link is not the project's)
        links = [os.path.relpath(os.path.join(d, n), str(ROOT)) for d, dirs, files in os.walk(str(ROOT))
                 for n in dirs + files if os.path.islink(os.path.join(d, n)) and n != ".venv" and ".git" not in d]
    assert links == []
    install = (ROOT / "roles" / "bench_client" / "tasks" / "install.yml").read_text()
    assert 'src: "{{ role_path }}/../../module_utils/{{ item }}"' in install
    for name in ("decode_client.py", "bench_stats.py", "prompt_catalog.py"):
        assert (MU / name).is_file() and name in install
    assert not (ROOT / "roles" / "engram" / "files").exists()


# ---------------------------------------------------------------------------------------------- CLI

def _standalone(tmp_path):
    """The three files side by side, as the role installs them; run by a Python without Ansible."""
    directory = tmp_path / "packer"
    if not directory.exists():
        directory.mkdir()
        for name in ep.PACKER_FILES:
            shutil.copy(str(MU / name), str(directory / name))
    return str(directory / "engram_packer.py")


def run_cli(tmp_path, *argv):
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    proc = subprocess.run([python, "-I", _standalone(tmp_path)] + list(argv), capture_output=True, text=True)
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1]), proc


def test_cli_standalone_success_check_and_failure(ckpt, tmp_path):
    dest = tmp_path / "engram"
    dest.mkdir()
    base = ["--checkpoint", ckpt, "--dest", str(dest), "--rank", "2", "--tp", "4", "--margin-bytes", "0"]
    rc, doc, _ = run_cli(tmp_path, *(base + ["--check", "--json"]))
    assert rc == 0 and doc["changed"] is True and doc["failed"] is False and os.listdir(dest) == []
    rc, doc, proc = run_cli(tmp_path, *(base + ["--layers", "14", "--nice"]))
    assert rc == 0 and doc["priority"] == {"nice": "19", "ioprio": "best-effort/7"}
    assert "engram-l14-r2of4.bin: absent -> valid" in proc.stdout  # human lines before the JSON
    assert open(doc["shards"][0]["path"], "rb").read() == reference_shard(ckpt, 14, 2, 4)
    rc, doc, _ = run_cli(tmp_path, *(base + ["--margin-bytes", str(1 << 62), "--json"]))
    assert rc == 1 and doc["failed"] is True and "Not enough free space" in doc["msg"]
    assert doc["required_bytes"] > 0 and doc["available_bytes"] > 0
    rc, doc, _ = run_cli(tmp_path, "--checkpoint", ckpt, "--dest", str(dest), "--rank", "x", "--tp", "3")
    assert rc == 1 and doc["failed"] is True and "Bad arguments" in doc["msg"]
    rc, doc, _ = run_cli(tmp_path, *(base[:4] + ["--rank", "4", "--tp", "4", "--json"]))
    assert rc == 1 and "rank=4 is out of range for tp=4" in doc["msg"]


def test_cli_host_label_names_the_host_in_messages(small_ckpt, tmp_path):
    rc, doc, _ = run_cli(tmp_path, "--checkpoint", small_ckpt, "--dest", str(tmp_path / "nope"), "--rank", "0",
                         "--tp", "3", "--host-label", "spark2", "--json")
    assert rc == 1 and "on spark2" in doc["msg"]


@pytest.mark.slow
def test_memory_does_not_grow_with_the_shard(tmp_path):
    """Peak RSS of the CLI for a 10x larger shard stays within a few MiB (bounded buffers)."""
    peaks = {}
    for rows in (20_000, 400_000):
        ck = str(tmp_path / ("ck%d" % rows))
        tbc.make_checkpoint(ck, rows={1: rows}, shards=2)
        dest = tmp_path / ("d%d" % rows)
        dest.mkdir()
        proc = subprocess.Popen([sys.executable, "-I", _standalone(tmp_path), "--checkpoint", ck, "--dest", str(dest),
                                 "--rank", "0", "--tp", "1", "--layers", "1", "--margin-bytes", "0",
                                 "--chunk-rows", "4096", "--json"], stdout=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        peaks[rows] = usage.ru_maxrss * 1024
    assert peaks[400_000] - peaks[20_000] < 8 << 20, peaks


def test_a_layer_smaller_than_tp_gives_empty_ranks(tmp_path):
    ck = str(tmp_path / "ck")
    tbc.make_checkpoint(ck, rows={1: 2, 14: 5}, shards=2)
    for rank in range(3):
        dest = tmp_path / ("r%d" % rank)
        dest.mkdir()
        result = pack(opts(ck, dest, rank, 3))
        for shard in result["shards"]:
            assert open(shard["path"], "rb").read() == reference_shard(ck, shard["layer"], rank, 3)
    assert os.path.getsize(str(tmp_path / "r0" / "engram-l1-r0of3.bin")) == 4096  # rows [0, 0)


def test_synthetic_checkpoint_is_deterministic_and_has_a_cli(tmp_path):
    a = tbc.make_checkpoint(str(tmp_path / "a"), rows={1: 1001, 14: 503}, shards=48, seed=5)
    tbc.make_checkpoint(str(tmp_path / "b"), rows={1: 1001, 14: 503}, shards=48, seed=5)
    tbc.make_checkpoint(str(tmp_path / "c"), rows={1: 1001, 14: 503}, shards=48, seed=6)
    assert listing(str(tmp_path / "a")) == listing(str(tmp_path / "b"))
    assert listing(str(tmp_path / "a")) != listing(str(tmp_path / "c"))
    assert len(os.listdir(str(tmp_path / "a"))) == 49 and a["files"][1] != a["files"][14]
    index = json.load(open(a["index"]))
    assert index["metadata"]["total_size"] == a["total_size"] == sum(t["nbytes"] for t in a["tensors"].values())
    weight = _tensor(str(tmp_path / "a"), "layers.1.engram.embed.weight")
    scale = _tensor(str(tmp_path / "a"), "layers.14.engram.embed.scale")
    assert weight.shape == (1001, 256) and not np.isin(weight, [0x7F, 0xFF]).any()  # no F8_E4M3 NaN codes
    assert scale.shape == (503, 8) and scale.min() >= 107 and scale.max() <= 131  # plausible E8M0 exponents
    proc = subprocess.run([sys.executable, str(ROOT / "testbed" / "checkpoint.py"), "--out", str(tmp_path / "d"),
                           "--rows", "1=1001,14=503", "--seed", "5"], capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout)["rows"] == {"1": 1001, "14": 503}
    assert listing(str(tmp_path / "d")) == listing(str(tmp_path / "a"))
