"""Fuzz the safetensors header and index readers with generated hostile files and compare each outcome
with the reference ``safetensors`` package (0.8.0, requirements.txt) on the same bytes.

Outcomes: ``clean error`` (SafetensorsError, a message naming the file), ``correct success`` (parsed, and
the reference parses the same tensors at the same offsets), ``stricter`` (we refuse what the reference
accepts, only for the documented reasons: duplicate keys, non-finite numbers, nesting, our lower size
caps, a header that does not start with "{" as the format says), and ``anything else`` (a traceback, a hang, or accepting what the reference refuses): must be 0."""
from __future__ import annotations

import collections
import json
import os
import random
import struct

import pytest

safetensors = pytest.importorskip("safetensors")

from ansible.module_utils import safetensors_header as sh  # noqa: E402
from ansible.module_utils.safetensors_header import SafetensorsError  # noqa: E402

CASES = 360
DTYPES = ["F8_E4M3", "F8_E8M0", "BF16", "F32", "U8", "I64", "F16", "BOOL"]
SIZES = {"F8_E4M3": 1, "F8_E8M0": 1, "BF16": 2, "F32": 4, "U8": 1, "I64": 8, "F16": 2, "BOOL": 1}
STRICTER_OK = ("duplicate key", "non-finite", "nested too deeply", "exceeds the", "entries (limit", "does not start with")


def valid_tensors(rng):
    header, offset = {}, 0
    for i in range(rng.randint(1, 5)):
        dtype = rng.choice(DTYPES)
        shape = [rng.randint(0, 5) for _ in range(rng.randint(0, 3))]
        numel = 1
        for d in shape:
            numel *= d
        header["t%d" % i] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + numel * SIZES[dtype]]}
        offset += numel * SIZES[dtype]
    return header, offset


def encode(header, data_len, pad=0, length_delta=0, raw=None):
    body = raw if raw is not None else json.dumps(header).encode()
    body += b" " * pad
    return struct.pack("<Q", max(0, len(body) + length_delta)) + body + bytes(data_len)


def mutate(rng, kind):
    header, size = valid_tensors(rng)
    name = rng.choice(sorted(header))
    if kind == "valid":
        return encode(header, size, pad=rng.randint(0, 7))
    if kind == "truncate":
        blob = encode(header, size, pad=rng.randint(0, 7))
        return blob[:rng.randint(0, max(0, len(blob) - 1))]
    if kind == "extend":
        return encode(header, size + rng.randint(1, 64))
    if kind == "shift_length":
        return encode(header, size, pad=8, length_delta=rng.choice([-7, -3, -1, 1, 2, 7]))
    if kind == "gap":
        for entry in header.values():
            if entry["data_offsets"][0] >= header[name]["data_offsets"][0]:
                entry["data_offsets"] = [o + rng.randint(1, 9) for o in entry["data_offsets"]]
        return encode(header, size + 9)
    if kind == "overlap":
        entry = header[name]
        k = rng.randint(1, 4)
        entry["data_offsets"] = [max(0, entry["data_offsets"][0] - k), entry["data_offsets"][1] - k]
        return encode(header, size)
    if kind == "dtype":
        header[name]["dtype"] = rng.choice(["F8", "bf16", "Q4", "", 7, None, "F64x"])
        return encode(header, size)
    if kind == "shape":
        header[name]["shape"] = rng.choice([[-1, 4], [1.5], "4", [True], None, [2 ** 70], [1] * 40])
        return encode(header, size)
    if kind == "offsets":
        header[name]["data_offsets"] = rng.choice([[5, 1], [0], "0,1", [-1, 0], [0, 2 ** 64 + 5], [0.0, 1.0]])
        return encode(header, size)
    if kind == "non_utf8":
        raw = bytearray(json.dumps(header).encode())
        raw[rng.randrange(1, len(raw))] = rng.choice([0xFF, 0xC3, 0x80, 0xFE])
        return encode(None, size, raw=bytes(raw))
    if kind == "nested":
        depth = rng.choice([50, 5000, 200000])
        return encode(None, 0, raw=b'{"a":' + b"[" * depth + b"]" * depth + b"}")
    if kind == "huge_claim":
        return struct.pack("<Q", rng.choice([2 ** 63, 2 ** 40, 101 * 2 ** 20, sh.MAX_HEADER_BYTES + 1])) + b"{}"
    if kind == "garbage":
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
    if kind == "duplicate":
        raw = json.dumps(header).encode()[:-1] + b', "%s": %s}' % (name.encode(), json.dumps(header[name]).encode())
        return encode(None, size, raw=raw)
    if kind == "nonfinite":
        return encode(None, 0, raw=b'{"__metadata__": {"x": "y"}, "a": {"dtype": "F32", "shape": [NaN], '
                                   b'"data_offsets": [0, 0]}}')
    if kind == "not_object":
        return encode(None, 0, raw=rng.choice([b"[]", b'"x"', b"{", b"1", b"{}}", b" {}"]))
    raise AssertionError(kind)


KINDS = ["valid", "truncate", "extend", "shift_length", "gap", "overlap", "dtype", "shape", "offsets", "non_utf8",
         "nested", "huge_claim", "garbage", "duplicate", "nonfinite", "not_object"]


def reference(blob):
    try:
        _, meta = safetensors.deserialize(blob), None
    except Exception as exc:  # the reference's SafetensorError, or a Python error from its wrapper
        return "error", str(exc)
    return "ok", meta


def ours(path):
    try:
        header = sh.read_header(path)
    except SafetensorsError as exc:
        assert path in str(exc)
        return "error", str(exc)
    return "ok", header


def classify(path, blob):
    try:
        mine, detail = ours(path)
    except Exception as exc:  # anything but SafetensorsError is a failure of the parser
        return "anything else", "%s: %s" % (type(exc).__name__, exc)
    ref, _ = reference(blob)
    if mine == "error":
        if ref == "error":
            return "clean error", detail
        if any(reason in detail for reason in STRICTER_OK):
            return "stricter", detail
        return "anything else", "we refuse what the reference accepts: %s" % detail
    if ref == "error":
        return "anything else", "we accept what the reference refuses"
    tensors = {name: (t.dtype, list(t.shape)) for name, t in detail.tensors.items()}
    expected = {name: (spec["dtype"], list(spec["shape"])) for name, spec in safetensors.deserialize(blob)}
    return ("correct success", "") if tensors == expected else ("anything else", "tensors differ")


def test_fuzz_headers_against_the_reference(tmp_path):
    rng = random.Random(20261201)
    counts = collections.Counter()
    bad = []
    for i in range(CASES):
        kind = KINDS[i % len(KINDS)]
        blob = mutate(rng, kind)
        path = str(tmp_path / ("case%03d.safetensors" % i))
        with open(path, "wb") as handle:
            handle.write(blob)
        outcome, detail = classify(path, blob)
        counts[outcome] += 1
        if outcome == "anything else":
            bad.append((i, kind, detail[:200]))
        os.unlink(path)
    for i, special in enumerate(["fifo", "symlink_to_fifo", "dir", "dangling"]):
        path = str(tmp_path / ("special%d.safetensors" % i))
        if special == "fifo":
            os.mkfifo(path)
        elif special == "symlink_to_fifo":
            os.mkfifo(path + ".fifo")
            os.symlink(path + ".fifo", path)
        elif special == "dir":
            os.mkdir(path)
        else:
            os.symlink(path + ".gone", path)
        outcome, detail = ours(path)  # raises (and fails the test) on anything but SafetensorsError
        counts["clean error" if outcome == "error" and "not a regular file" in detail or "cannot open" in detail
               else "anything else"] += 1
    print("safetensors fuzz: %d cases, %s" % (sum(counts.values()), dict(counts)))
    assert sum(counts.values()) >= 300
    assert not bad, bad
    assert counts["anything else"] == 0
    assert counts["correct success"] >= CASES // len(KINDS) // 2


def test_fuzz_index(tmp_path):
    """Hostile model.safetensors.index.json files (the reference package has no index reader): each gives a
    clean error naming the index, or a weight_map of plain file names."""
    rng = random.Random(7)
    good = {"metadata": {"total_size": 1}, "weight_map": {"a": "model-00001-of-00002.safetensors"}}
    variants = [json.dumps(good).encode(), b"", b"\xff\xfe{}", b"[]", b'{"weight_map": []}', b"{" * 100000,
                b'{"weight_map": {"a": "../../etc/passwd"}}', b'{"weight_map": {"a": "/etc/passwd"}}',
                b'{"weight_map": {"a": "x\\u0000y"}}', b'{"weight_map": {"a": 1}}', b'{"weight_map": {"a": ".."}}',
                b'{"weight_map": {"a": "b", "a": "c"}}', b'{"weight_map": {"a": NaN}}']
    counts = collections.Counter()
    for i in range(80):
        blob = variants[i % len(variants)]
        if i >= len(variants):  # truncations and byte flips of the valid index
            blob = bytearray(variants[0])
            if i % 2:
                blob = blob[:rng.randrange(len(blob))]
            else:
                blob[rng.randrange(len(blob))] = rng.randrange(256)
            blob = bytes(blob)
        directory = tmp_path / ("c%d" % i)
        directory.mkdir()
        (directory / sh.INDEX_NAME).write_bytes(blob)
        try:
            weight_map = sh.read_index(str(directory))
        except SafetensorsError as exc:
            assert sh.INDEX_NAME in str(exc)
            counts["clean error"] += 1
            continue
        assert all(isinstance(v, str) and "/" not in v and v not in (".", "..") for v in weight_map.values())
        counts["correct success"] += 1
    fifo_dir = tmp_path / "fifo"
    fifo_dir.mkdir()
    os.mkfifo(str(fifo_dir / sh.INDEX_NAME))
    with pytest.raises(SafetensorsError, match="not a regular file"):
        sh.read_index(str(fifo_dir))
    counts["clean error"] += 1
    print("index fuzz: %d cases, %s" % (sum(counts.values()), dict(counts)))
    assert counts["correct success"] >= 1 and counts["clean error"] >= len(variants) - 1
