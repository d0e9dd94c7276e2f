"""The safetensors header reader: valid files, and malformed, truncated and hostile headers."""
from __future__ import annotations

import json
import os
import struct

import pytest

from ansible.module_utils import safetensors_header as sh
from ansible.module_utils.safetensors_header import SafetensorsError, parse_header, read_header, read_index
from tests.conftest import ROOT


def _testbed_checkpoint():
    import importlib.util
    spec = importlib.util.spec_from_file_location("sparkfleet_testbed_checkpoint", ROOT / "testbed" / "checkpoint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_checkpoint = _testbed_checkpoint().make_checkpoint
corrupt_header = _testbed_checkpoint().corrupt_header


def write_file(path, header, data_len=0, raw=None):
    """A safetensors file with ``header`` (dict, or ``raw`` bytes as given) and ``data_len`` data bytes."""
    body = raw if raw is not None else json.dumps(header).encode()
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(body)) + body + bytes(data_len))
    return str(path)


def entry(dtype="F8_E4M3", shape=(4, 256), begin=0, end=None):
    size = {"F8_E4M3": 1, "F8_E8M0": 1, "BF16": 2, "F32": 4}[dtype]
    numel = 1
    for d in shape:
        numel *= d
    return {"dtype": dtype, "shape": list(shape), "data_offsets": [begin, begin + numel * size if end is None else end]}


def test_reads_generated_checkpoint_offsets(tmp_path):
    info = make_checkpoint(str(tmp_path), rows={1: 1001, 14: 777}, shards=6)
    for name, tensor in info["tensors"].items():
        header = read_header(os.path.join(str(tmp_path), tensor["file"]))
        got = header.tensor(name)
        assert got.dtype == tensor["dtype"]
        assert list(got.shape) == tensor["shape"]
        assert got.offset == tensor["offset"]
        assert got.nbytes == tensor["nbytes"]
    assert header.metadata == {"format": "pt"}


def test_valid_file_with_metadata_padding_and_empty_tensor(tmp_path):
    header = {"__metadata__": {"format": "pt"}, "a": entry(shape=(2, 256)), "b": entry("F8_E8M0", (2, 8), 512),
              "empty": entry("F32", (0, 4), 528)}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path = write_file(tmp_path / "ok.safetensors", None, 528, raw=raw)
    parsed = read_header(path)
    assert parsed.header_len == len(raw)
    assert parsed.data_start == 8 + len(raw)
    assert parsed.tensors["b"].offset == 8 + len(raw) + 512
    assert parsed.tensors["empty"].nbytes == 0


def test_reads_only_length_and_header_never_tensor_data(tmp_path, monkeypatch):
    header = {"w": entry(shape=(1 << 20, 256))}  # 256 MiB of tensor data, sparse on disk
    path = write_file(tmp_path / "big.safetensors", header)
    with open(path, "r+b") as handle:
        handle.truncate(os.path.getsize(path) + (1 << 28))
    reads = []
    real_pread = os.pread

    def spy(fd, size, offset):
        reads.append((size, offset))
        return real_pread(fd, size, offset)

    monkeypatch.setattr(sh.os, "pread", spy)
    parsed = read_header(path)
    assert sum(size for size, _ in reads) == 8 + parsed.header_len
    assert max(offset + size for size, offset in reads) == parsed.data_start


@pytest.mark.parametrize("raw_file, needle", [
    (b"", "too short"),
    (b"\x01\x00\x00", "too short"),
    (struct.pack("<Q", 0), "header length is 0"),
    (struct.pack("<Q", 1 << 40) + b"{}", "exceeds"),
    (struct.pack("<Q", 1 << 63) + b"{}", "exceeds"),
    (struct.pack("<Q", 4096) + b'{"a": 1}', "runs past the end"),
])
def test_bad_length_prefix(tmp_path, raw_file, needle):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(raw_file)
    with pytest.raises(SafetensorsError, match=needle) as info:
        read_header(str(path))
    assert str(path) in str(info.value)


def test_oversized_header_is_refused_before_reading(tmp_path, monkeypatch):
    path = write_file(tmp_path / "x.safetensors", {"a": entry()}, 1024)
    with pytest.raises(SafetensorsError, match="exceeds the 16 byte limit"):
        read_header(path, max_header_bytes=16)


@pytest.mark.parametrize("raw, needle", [
    (b"\xff\xfe{}", "not UTF-8"),
    (b"[1, 2, 3]", "does not start with"),
    (b"   {}", "does not start with"),
    (b"{not json}", "not valid JSON"),
    (b'{"a": ' + b"[" * 100000 + b"]" * 100000 + b"}", "nested too deeply"),
    (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {}}', "duplicate key"),
    (b'{"a": {"dtype": "F32", "shape": [NaN], "data_offsets": [0, 4]}}', "non-finite"),
    (b'{"a": {"dtype": "F32", "shape": [Infinity], "data_offsets": [0, 4]}}', "non-finite"),
])
def test_hostile_or_malformed_json(tmp_path, raw, needle):
    path = write_file(tmp_path / "h.safetensors", None, 64, raw=raw)
    with pytest.raises(SafetensorsError, match=needle):
        read_header(path)


@pytest.mark.parametrize("tensor, needle", [
    ("not an object", "not an object"),
    ({"dtype": "F32", "shape": [1]}, "missing data_offsets"),
    ({"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "extra": 1}, "unexpected keys extra"),
    ({"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}, "unknown dtype"),
    ({"dtype": 5, "shape": [1], "data_offsets": [0, 4]}, "unknown dtype"),
    ({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}, "non-negative integers"),
    ({"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}, "non-negative integers"),
    ({"dtype": "F32", "shape": [1.0], "data_offsets": [0, 4]}, "non-negative integers"),
    ({"dtype": "F32", "shape": "1", "data_offsets": [0, 4]}, "non-negative integers"),
    ({"dtype": "F32", "shape": [1] * 17, "data_offsets": [0, 4]}, "at most 16"),
    ({"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}, "begin <= end"),
    ({"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}, "begin <= end"),
    ({"dtype": "F32", "shape": [1], "data_offsets": [0]}, "begin <= end"),
    ({"dtype": "F32", "shape": [1], "data_offsets": [0, 4.0]}, "begin <= end"),
    ({"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}, "needs 8"),
    ({"dtype": "F32", "shape": [1 << 40, 1 << 40], "data_offsets": [0, 4]}, "needs"),
    ({"dtype": "F32", "shape": [32], "data_offsets": [0, 128]}, "past the data section"),
])
def test_bad_tensor_entries(tmp_path, tensor, needle):
    path = write_file(tmp_path / "t.safetensors", {"a": tensor}, 64)
    with pytest.raises(SafetensorsError, match=needle) as info:
        read_header(path)
    assert "'a'" in str(info.value)


def test_overlapping_tensors_and_bad_metadata(tmp_path):
    path = write_file(tmp_path / "o.safetensors", {"a": entry("F32", (4,), 0), "b": entry("F32", (4,), 8)}, 64)
    with pytest.raises(SafetensorsError, match="overlap"):
        read_header(path)
    path = write_file(tmp_path / "m.safetensors", {"__metadata__": {"k": 1}, "a": entry("F32", (1,))}, 4)
    with pytest.raises(SafetensorsError, match="__metadata__"):
        read_header(path)


def test_not_a_regular_file_and_missing(tmp_path):
    with pytest.raises(SafetensorsError, match="not a regular file"):
        read_header(str(tmp_path))
    with pytest.raises(SafetensorsError, match="cannot open"):
        read_header(str(tmp_path / "missing.safetensors"))


@pytest.mark.parametrize("how, needle", [
    ("json", "not valid JSON"), ("utf8", "not UTF-8"), ("length", "exceeds"), ("truncate", "runs past the end"),
    ("offsets", "past the data section"),
])
def test_corrupted_checkpoint_shards(tmp_path, how, needle):
    info = make_checkpoint(str(tmp_path), rows={1: 301, 14: 203}, shards=4)
    path = os.path.join(str(tmp_path), info["files"][1])
    corrupt_header(path, how)
    with pytest.raises(SafetensorsError, match=needle):
        read_header(path)


def test_parse_header_directly():
    raw = json.dumps({"a": entry("BF16", (3,))}).encode()
    parsed = parse_header(raw, 8 + len(raw) + 6, "mem")
    assert parsed.tensors["a"].itemsize == 2
    with pytest.raises(SafetensorsError, match="does not fit"):
        parse_header(raw, len(raw), "mem")
    with pytest.raises(SafetensorsError, match="not in this file"):
        parsed.tensor("b")


def test_read_index(tmp_path):
    info = make_checkpoint(str(tmp_path / "ck"), rows={1: 11, 14: 13}, shards=3)
    weight_map = read_index(str(tmp_path / "ck"))
    assert weight_map["layers.1.engram.embed.weight"] == info["files"][1]
    with pytest.raises(SafetensorsError, match="does not exist"):
        read_index(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SafetensorsError, match="index missing"):
        read_index(str(tmp_path / "empty"))


@pytest.mark.parametrize("doc, needle", [
    ("{", "not valid JSON"),
    ("[]", "no weight_map"),
    ('{"weight_map": []}', "no weight_map"),
    ('{"weight_map": {"a": "../../etc/passwd"}}', "not a file name inside"),
    ('{"weight_map": {"a": "/etc/passwd"}}', "not a file name inside"),
    ('{"weight_map": {"a": ".."}}', "not a file name inside"),
    ('{"weight_map": {"a": 3}}', "not a file name inside"),
    ('{"weight_map": {"a": "x", "a": "y"}}', "duplicate key"),
])
def test_bad_index(tmp_path, doc, needle):
    (tmp_path / "model.safetensors.index.json").write_text(doc)
    with pytest.raises(SafetensorsError, match=needle):
        read_index(str(tmp_path))
