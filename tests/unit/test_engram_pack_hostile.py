"""engram_pack under hostile input (issue 19, items 5-9): shifted header lengths and gapped offsets, a
checkpoint rewritten under a partial, links and hard links in dest, FIFOs as inputs, and failure results
that tell the truth. Each test here failed on the packer before the fix it covers."""
from __future__ import annotations

import json
import os
import stat
import struct
import subprocess
import sys

import pytest

from ansible.module_utils import engram_packer as ep
from ansible.module_utils import engram_packer_io as epio
from ansible.module_utils import engram_packer_write as epw
from ansible.module_utils.engram_packer import PackError, pack
from tests.unit.test_engram_pack import (MU, _rewrite, listing, opts, reference_shard, sha,  # noqa: F401
                                         tbc)

INDEX = "model.safetensors.index.json"


@pytest.fixture
def small_ckpt(tmp_path):
    path = str(tmp_path / "ckpt")
    tbc.make_checkpoint(path, rows={1: 3001, 14: 2003}, shards=6, seed=7)
    return path


@pytest.fixture
def dest(tmp_path):
    path = tmp_path / "engram"
    path.mkdir()
    return str(path)


def weight_shard(ckpt_dir, layer=1):
    with open(os.path.join(ckpt_dir, INDEX)) as handle:
        return os.path.join(ckpt_dir, json.load(handle)["weight_map"]["layers.%d.engram.embed.weight" % layer])


def pack_fails(options, needle):
    with pytest.raises(PackError) as info:
        pack(options)
    assert needle in info.value.msg, info.value.msg
    return info.value


# ------------------------------------------------------------------ item 5: strict safetensors headers

@pytest.mark.parametrize("lower", range(1, 8))
def test_header_length_lowered_by_a_few_bytes_is_refused(small_ckpt, dest, lower):
    """The length prefix lowered into the header's space padding: the JSON still parses, but the data
    section now starts ``lower`` bytes early, so every row would be shifted."""
    path = weight_shard(small_ckpt)
    with open(path, "r+b") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        handle.seek(0)
        handle.write(struct.pack("<Q", length - lower))
    err = pack_fails(opts(small_ckpt, dest, 0, 1, verify="full"), "the data section")
    assert os.path.basename(path) in err.msg
    assert os.listdir(dest) == []


def _gap_before_engram(header):
    """Both Engram tensors of layer 1 lose their first row and start one row later: a gap of one row each."""
    for name, width in (("layers.1.engram.embed.weight", 256), ("layers.1.engram.embed.scale", 8)):
        entry = header[name]
        begin, end = entry["data_offsets"]
        entry.update(shape=[entry["shape"][0] - 1, width], data_offsets=[begin + width, end])
    return header


def test_gapped_data_offsets_are_refused(small_ckpt, dest):
    _rewrite(small_ckpt, 1, _gap_before_engram)
    pack_fails(opts(small_ckpt, dest, 0, 1, layers=[1], verify="full"), "a gap of 256 bytes before tensor")
    assert os.listdir(dest) == []


# ---------------------------------------------------------- item 8: inputs that are not regular files

def _fifo_in_place(path):
    os.unlink(path)
    os.mkfifo(path)


@pytest.mark.parametrize("check", [False, True])
@pytest.mark.parametrize("which", ["index", "shard"])
def test_a_fifo_as_input_is_a_clear_error_not_a_hang(small_ckpt, dest, tmp_path, which, check):
    target = os.path.join(small_ckpt, INDEX) if which == "index" else weight_shard(small_ckpt)
    _fifo_in_place(target)
    argv = [sys.executable, str(MU / "engram_packer.py"), "--checkpoint", small_ckpt, "--dest", dest, "--rank", "0",
            "--tp", "1", "--margin-bytes", "0", "--json"] + (["--check"] if check else [])
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the packer blocked on the FIFO %s" % target)
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 1 and doc["failed"]
    assert "%s: not a regular file (a FIFO)" % target in doc["msg"], doc["msg"]
    assert "Traceback" not in proc.stderr
    assert os.listdir(dest) == []


def test_header_claims_beyond_the_cap_are_refused_before_reading(small_ckpt, dest):
    path = weight_shard(small_ckpt)
    with open(path, "r+b") as handle:
        handle.write(struct.pack("<Q", 100 * 1024 * 1024))
    os.truncate(path, 8 + 100 * 1024 * 1024 + 4096)  # the claim fits the file: only the cap refuses it
    pack_fails(opts(small_ckpt, dest, 0, 1), "exceeds the %d byte limit" % ep_max_header())


def ep_max_header():
    from ansible.module_utils.safetensors_header import MAX_HEADER_BYTES
    assert MAX_HEADER_BYTES <= 16 * 1024 * 1024
    return MAX_HEADER_BYTES


# ---------------------------------------------------------------- item 6: resume bound to the source

class Killed(BaseException):
    """Stands for a SIGKILL at a chosen point (the subprocess trials in test_engram_pack_kill.py do it for real)."""


def _killed_while_verifying(monkeypatch, options):
    def killed(*_):
        raise Killed()
    with monkeypatch.context() as patch:
        patch.setattr(epw, "verify_shard", killed)
        with pytest.raises(Killed):
            pack(options)


def test_a_checkpoint_rewritten_in_place_restarts_the_shard(small_ckpt, dest, monkeypatch):
    """Same shape, same size, new bytes in rows the sampled verification does not look at: the complete
    partial must not be finished from the old bytes."""
    _killed_while_verifying(monkeypatch, opts(small_ckpt, dest, 0, 1, layers=[1], chunk_rows=500))
    partial = os.path.join(dest, "engram-l1-r0of1.partial")
    assert os.path.getsize(partial) == 4096 + 3001 * 264
    sampled = set(ep.sample_indices(3001))
    changed = [row for row in range(1, 3000) if row not in sampled][:50]
    assert len(changed) == 50
    source = ep.load_sources(small_ckpt, [1])[1]
    with open(source.weight_path, "r+b") as handle:  # the operator re-downloads the shard in place
        for row in changed:
            handle.seek(source.weight_offset + row * 256)
            handle.write(os.urandom(256))
    result = pack(opts(small_ckpt, dest, 0, 1, layers=[1], chunk_rows=500))
    shard = result["shards"][0]
    assert shard["action"] == "write" and shard["resume_rows"] == 0, shard
    assert "the checkpoint changed since it was written" in shard["reason_before"]
    assert open(shard["path"], "rb").read() == reference_shard(small_ckpt, 1, 0, 1)


def test_a_partial_without_its_source_record_restarts(small_ckpt, dest, monkeypatch):
    _killed_while_verifying(monkeypatch, opts(small_ckpt, dest, 0, 1, layers=[1]))
    os.unlink(ep.source_record_path(os.path.join(dest, "engram-l1-r0of1.partial")))
    shard = pack(opts(small_ckpt, dest, 0, 1, layers=[1]))["shards"][0]
    assert (shard["action"], shard["resume_rows"]) == ("write", 0) and "no source record" in shard["reason_before"]
    assert open(shard["path"], "rb").read() == reference_shard(small_ckpt, 1, 0, 1)
    assert sorted(os.listdir(dest)) == ["engram-l1-r0of1.bin", "engram-l1-r0of1.progress.json"]


# ------------------------------------------- item 7: no write follows a link or reaches another name

@pytest.mark.parametrize("name", ["engram-l1-r0of1.partial", "engram-l1-r0of1.progress.json.tmp",
                                  "engram-l1-r0of1.partial.source.json.tmp"])
def test_a_hard_link_in_dest_never_changes_the_file_outside(small_ckpt, dest, tmp_path, name):
    victim = tmp_path / "victim"
    victim.write_bytes(b"operator data outside dest\n" * 100)
    before = victim.read_bytes()
    os.link(str(victim), os.path.join(dest, name))
    try:
        pack(opts(small_ckpt, dest, 0, 1, layers=[1]))
    except PackError as exc:
        assert name.endswith(".partial") and "has 2 names" in exc.msg, exc.msg
    assert victim.read_bytes() == before
    assert os.stat(str(victim)).st_nlink in (1, 2)


def test_a_symlinked_temporary_is_not_followed(small_ckpt, dest, tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    os.symlink(str(victim), os.path.join(dest, "engram-l1-r0of1.progress.json.tmp"))
    pack(opts(small_ckpt, dest, 0, 1, layers=[1]))
    assert victim.read_bytes() == b"keep"
    assert json.load(open(os.path.join(dest, "engram-l1-r0of1.progress.json")))["state"] == "done"


# -------------------------------------------------------------- item 9: failure results tell the truth

def test_a_failed_pack_reports_shards_as_they_are(small_ckpt, dest, monkeypatch):
    real_stream = epw._stream

    def stream_then_enospc(plan, source, options, pfd, progress):
        if plan.layer == 14:
            raise AssertionError("layer 14 is never reached")
        chunks = real_stream(plan, source, options, pfd, progress)
        raise OSError(28, "No space left on device", plan.partial_path)
    monkeypatch.setattr(epw, "_stream", stream_then_enospc)
    with pytest.raises(PackError) as info:
        pack(opts(small_ckpt, dest, 0, 1, layers=[1, 14], chunk_rows=1000))
    shards = {s["layer"]: s for s in info.value.result["shards"]}
    assert shards[14]["state_after"] == "absent", shards[14]  # never reached: not "valid"
    assert (shards[1]["state_after"], shards[1]["partial_rows"]) == ("partial", 3001), shards[1]
    assert "engram-l14-r0of1.bin: absent -> absent" in info.value.result["summary"]
    assert "engram-l1-r0of1.bin: absent -> partial (3001 of 3001 rows)" in info.value.result["summary"]
    progress = json.load(open(os.path.join(dest, "engram-l1-r0of1.progress.json")))
    assert progress["state"] == "failed" and "No space left on device" in progress["error"]


def test_a_progress_write_that_fails_leaves_no_empty_temporary(small_ckpt, dest, monkeypatch):
    class NoSpaceJson:
        loads, dumps = staticmethod(json.loads), staticmethod(json.dumps)

        @staticmethod
        def dump(doc, handle):
            raise OSError(28, "No space left on device")
    monkeypatch.setattr(epio, "json", NoSpaceJson)
    with pytest.raises(PackError):  # the source record cannot be written either: the pack fails clearly
        pack(opts(small_ckpt, dest, 0, 1, layers=[1]))
    assert not [n for n in os.listdir(dest) if n.endswith(".tmp")], os.listdir(dest)
    assert not [n for n in os.listdir(dest) if os.path.getsize(os.path.join(dest, n)) == 0], os.listdir(dest)
