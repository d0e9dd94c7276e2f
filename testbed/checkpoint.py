#!/usr/bin/env python3
"""Write a small, deterministic DeepSeek-V4.1-Flash-shaped safetensors checkpoint.

The layout follows docs/reference.md section 3: ``model-000KK-of-00048.safetensors`` shards plus
``model.safetensors.index.json``; layers 1 and 14 carry ``layers.{L}.engram.embed.weight`` (F8_E4M3,
[N, 256]) and ``layers.{L}.engram.embed.scale`` (F8_E8M0, [N, 8]) in one shard each (different shards
for the two layers); every shard also carries small BF16 filler tensors so the layout looks real.
Rows per layer are small by default and deliberately not divisible by 2, 3, 4 or 8.

Data is written in blocks, so a multi-GiB shard (for the packing benchmark) needs little memory.
Same arguments and seed, same bytes. Standard library only.

    python3 testbed/checkpoint.py --out DIR [--rows 1=120003,14=96001] [--shards 48] [--seed 0]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import struct
import sys
from typing import Callable, Dict, List, Optional, Tuple

DEFAULT_ROWS = {1: 120_003, 14: 96_001}
INDEX_NAME = "model.safetensors.index.json"
BLOCK_ROWS = 16384  # rows generated per block: 4 MiB of weights
HEADER_SLACK = 128

# F8_E4M3: 0x7F and 0xFF are the NaN codes; map them to the neighbouring finite values.
_WEIGHT_TABLE = bytes(0x7E if b == 0x7F else 0xFE if b == 0xFF else b for b in range(256))
# F8_E8M0: exponent byte e means 2**(e-127); 0xFF is NaN. Plausible per-32 scales: 2**-20 .. 2**4.
_SCALE_TABLE = bytes(107 + b % 25 for b in range(256))
_DTYPE_SIZES = {"F8_E4M3": 1, "F8_E8M0": 1, "BF16": 2, "F32": 4}


def shard_file(k: int, shards: int) -> str:
    return "model-%05d-of-%05d.safetensors" % (k, shards)


def engram_shard(layer: int, shards: int) -> int:
    """1-based shard number holding a layer's Engram tensors (layers 1 and 14 differ when shards > 1)."""
    return max(1, min(shards, 1 + layer * shards // 16))


def _weight_blocks(layer: int, n: int, seed: int):
    rng = random.Random("engram-weight/%d/%d" % (seed, layer))
    for start in range(0, n, BLOCK_ROWS):
        rows = min(BLOCK_ROWS, n - start)
        yield rng.randbytes(rows * 256).translate(_WEIGHT_TABLE)


def _scale_blocks(layer: int, n: int, seed: int):
    rng = random.Random("engram-scale/%d/%d" % (seed, layer))
    for start in range(0, n, BLOCK_ROWS * 32):
        rows = min(BLOCK_ROWS * 32, n - start)
        yield rng.randbytes(rows * 8).translate(_SCALE_TABLE)


def _filler_blocks(name: str, nbytes: int, seed: int):
    rng = random.Random("filler/%d/%s" % (seed, name))
    yield rng.randbytes(nbytes)


def _write_safetensors(path: str, tensors: List[Tuple[str, str, List[int], Callable]]) -> Dict[str, dict]:
    """Write ``(name, dtype, shape, blocks)`` tensors in order; returns name -> info with absolute offsets."""
    header: Dict[str, dict] = {"__metadata__": {"format": "pt"}}
    offset = 0
    sizes = []
    for name, dtype, shape, _ in tensors:
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * _DTYPE_SIZES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        sizes.append(nbytes)
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    # trailing spaces are legal padding; the slack lets tests rewrite a header in place (rewrite_header)
    raw += b" " * (HEADER_SLACK + -(len(raw) + HEADER_SLACK) % 8)
    data_start = 8 + len(raw)
    info = {}
    tmp = path + ".tmp"
    with open(tmp, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)))
        handle.write(raw)
        for (name, dtype, shape, blocks), nbytes in zip(tensors, sizes):
            written = 0
            for block in blocks():
                handle.write(block)
                written += len(block)
            if written != nbytes:
                raise RuntimeError("%s: wrote %d bytes for %s, expected %d" % (path, written, name, nbytes))
            begin = header[name]["data_offsets"][0]
            info[name] = {"file": os.path.basename(path), "dtype": dtype, "shape": list(shape),
                          "offset": data_start + begin, "nbytes": nbytes}
    os.replace(tmp, path)
    return info


def make_checkpoint(out_dir: str, rows: Optional[Dict[int, int]] = None, shards: int = 48, seed: int = 0,
                    filler: bool = True) -> dict:
    """Write the checkpoint into ``out_dir`` (created if needed) and describe it.

    Returns ``{"dir", "index", "rows": {layer: N}, "files": {layer: shard file}, "total_size",
    "tensors": {name: {"file", "dtype", "shape", "offset", "nbytes"}}}`` (``offset`` is absolute).
    """
    rows = dict(DEFAULT_ROWS if rows is None else rows)
    if shards < 1:
        raise ValueError("shards must be at least 1")
    os.makedirs(out_dir, exist_ok=True)
    per_shard: Dict[int, list] = {k: [] for k in range(1, shards + 1)}
    if filler:
        for k in range(1, shards + 1):
            name = "layers.%d.attn.wq.weight" % (k - 1)
            per_shard[k].append((name, "BF16", [64, 32],
                                 lambda name=name: _filler_blocks(name, 64 * 32 * 2, seed)))
    files = {}
    for layer in sorted(rows):
        n = rows[layer]
        k = engram_shard(layer, shards)
        files[layer] = shard_file(k, shards)
        per_shard[k].append(("layers.%d.engram.embed.weight" % layer, "F8_E4M3", [n, 256],
                             lambda layer=layer, n=n: _weight_blocks(layer, n, seed)))
        per_shard[k].append(("layers.%d.engram.embed.scale" % layer, "F8_E8M0", [n, 8],
                             lambda layer=layer, n=n: _scale_blocks(layer, n, seed)))
        if filler:
            name = "layers.%d.ffn_norm.weight" % layer
            per_shard[k].append((name, "BF16", [256], lambda name=name: _filler_blocks(name, 512, seed)))
    tensors: Dict[str, dict] = {}
    for k, entries in per_shard.items():
        if entries:
            tensors.update(_write_safetensors(os.path.join(out_dir, shard_file(k, shards)), entries))
    total = sum(t["nbytes"] for t in tensors.values())
    index = {"metadata": {"total_size": total},
             "weight_map": {name: tensors[name]["file"] for name in sorted(tensors)}}
    index_path = os.path.join(out_dir, INDEX_NAME)
    with open(index_path + ".tmp", "w") as handle:
        json.dump(index, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.replace(index_path + ".tmp", index_path)
    return {"dir": out_dir, "index": index_path, "rows": rows, "files": files, "total_size": total,
            "tensors": tensors}


def _read_raw_header(path: str) -> Tuple[int, bytes]:
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        return length, handle.read(length)


def rewrite_header(path: str, mutate: Callable[[dict], dict]) -> None:
    """Replace a shard's JSON header by ``mutate(header)``, in place, keeping its length (space padded).

    For tests: a wrong dtype, a wrong shape, row counts that differ. The new header must not be longer.
    """
    length, raw = _read_raw_header(path)
    new = json.dumps(mutate(json.loads(raw)), separators=(",", ":")).encode()
    if len(new) > length:
        raise ValueError("%s: rewritten header is %d bytes, longer than the %d available" % (path, len(new), length))
    with open(path, "r+b") as handle:
        handle.seek(8)
        handle.write(new + b" " * (length - len(new)))


def corrupt_header(path: str, how: str = "json") -> None:
    """Damage a shard's header for tests.

    ``json``: garbage in place of the JSON; ``utf8``: bytes that are not UTF-8; ``length``: an absurd
    header length; ``truncate``: cut the file inside the header; ``offsets``: the first Engram weight's
    data_offsets point past the file.
    """
    length, raw = _read_raw_header(path)
    if how == "json":
        with open(path, "r+b") as handle:
            handle.seek(8)
            handle.write(b"{\"layers.1.engram\": [[[[ not json ")
    elif how == "utf8":
        with open(path, "r+b") as handle:
            handle.seek(9)
            handle.write(b"\xff\xfe" * 4)
    elif how == "length":
        with open(path, "r+b") as handle:
            handle.write(struct.pack("<Q", 1 << 40))
    elif how == "truncate":
        os.truncate(path, 8 + length // 2)
    elif how == "offsets":
        def move(header):
            for name, entry in header.items():
                if name.endswith("engram.embed.weight"):
                    begin, end = entry["data_offsets"]
                    entry["data_offsets"] = [begin + (1 << 30), end + (1 << 30)]
            return header
        rewrite_header(path, move)
    else:
        raise ValueError("unknown corruption %r" % how)


def _parse_rows(text: str) -> Dict[int, int]:
    rows = {}
    for item in text.split(","):
        layer, _, n = item.partition("=")
        rows[int(layer)] = int(n)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory to write the checkpoint into")
    parser.add_argument("--rows", type=_parse_rows, default=None,
                        help="rows per Engram layer, e.g. 1=120003,14=96001 (default)")
    parser.add_argument("--shards", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-filler", action="store_true", help="write only the Engram tensors")
    args = parser.parse_args(argv)
    info = make_checkpoint(args.out, rows=args.rows, shards=args.shards, seed=args.seed, filler=not args.no_filler)
    print(json.dumps({"dir": info["dir"], "index": info["index"], "rows": info["rows"], "files": info["files"],
                      "total_size": info["total_size"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
