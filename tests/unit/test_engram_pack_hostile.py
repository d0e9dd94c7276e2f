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
