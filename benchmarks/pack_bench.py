#!/usr/bin/env python3
"""Engram packing benchmark: throughput against a plain copy, peak RSS, page cache growth.

For a synthetic checkpoint whose layer-1 shard packs to at least 2 GiB (tp 1, rank 0), each repetition
runs, on the same filesystem and with the source evicted from the page cache before each step:

1. the reference: a same-size sequential copy of the source shard (8 MiB read/write, one fsync at the end),
   timed as a subprocess like the packer;
2. the packer, as its command line in a subprocess (``engram_packer.py --json``, verify=sample), with a
   sampler in this process that reads, every 20 ms, ``Cached + Buffers`` from /proc/meminfo (system wide,
   noisy when other work runs) and, precisely, how many pages of the source shard and of the packed file are
   resident in the page cache (``mincore(2)`` on a PROT_READ mapping, which faults nothing in), and the
   packer's VmRSS; the packer's peak RSS comes from ``wait4``'s ``ru_maxrss``.

Each repetition runs copy, pack, pack, copy (ABBA, so drift in the disk's speed hits both alike); its
ratio is copy time / pack time for the same bytes. It prints one line per repetition, a summary and a
JSON document (``--json-out`` writes it to a file). Exit 1 when a threshold is missed: median throughput
ratio >= 0.90, peak RSS <= 128 MiB, page cache held by the packer's files <= 2 chunks.

    .venv/bin/python benchmarks/pack_bench.py [--workdir /tmp/sparkfleet-pack-bench] [--rows 8200000]
        [--repeat 3] [--chunk-rows 16384] [--keep]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "testbed"))
sys.path.insert(0, os.path.join(ROOT, "module_utils"))

import checkpoint as synthetic  # noqa: E402  (testbed/checkpoint.py)
from engram_format import HEADER_SIZE, ROW_BYTES  # noqa: E402
from engram_packer import DEFAULT_CHUNK_ROWS  # noqa: E402

PACKER = os.path.join(ROOT, "module_utils", "engram_packer.py")
MIB = 1 << 20
PAGE = mmap.PAGESIZE

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_MAP_FAILED = ctypes.c_void_p(-1).value


def resident_bytes(path: str) -> int:
    """Bytes of ``path`` in the page cache right now (0 if it does not exist)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return 0
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            return 0
        try:
            pages = (size + PAGE - 1) // PAGE
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                return 0
            raw = bytes(vec)
            return (pages - raw.count(0)) * PAGE
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def meminfo_cached() -> int:
    values = {}
    with open("/proc/meminfo") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key in ("Cached", "Buffers"):
                values[key] = int(rest.split()[0]) * 1024
    return values.get("Cached", 0) + values.get("Buffers", 0)


def vm_rss(pid: int) -> int:
    try:
        with open("/proc/%d/status" % pid) as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class Sampler(threading.Thread):
    def __init__(self, paths, pid=None, interval=0.02):
        super().__init__(daemon=True)
        self.paths, self.pid, self.interval = paths, pid, interval
        self.stop = threading.Event()
        self.base_cached = meminfo_cached()
        self.max_cached_delta = 0
        self.max_resident = 0
        self.max_rss = 0
        self.samples = 0

    def run(self):
        while not self.stop.is_set():
            self.max_cached_delta = max(self.max_cached_delta, meminfo_cached() - self.base_cached)
            self.max_resident = max(self.max_resident, sum(resident_bytes(p) for p in self.paths))
            if self.pid:
                self.max_rss = max(self.max_rss, vm_rss(self.pid))
            self.samples += 1
            self.stop.wait(self.interval)


def run_copy(src: str, out: str, nbytes: int) -> dict:
    """Same-size sequential copy with one fsync at the end, timed in a subprocess like the packer."""
    evict(src)
    code = ("import os,sys,time\n"
            "src,out,n=sys.argv[1],sys.argv[2],int(sys.argv[3])\n"
            "t=time.perf_counter()\n"
            "fi=os.open(src,os.O_RDONLY);fo=os.open(out,os.O_WRONLY|os.O_CREAT|os.O_TRUNC,0o644)\n"
            "left=n\n"
            "while left:\n"
            "    b=os.read(fi,min(8<<20,left));os.write(fo,b);left-=len(b)\n"
            "os.fsync(fo);os.close(fo);os.close(fi)\n"
            "print(time.perf_counter()-t)\n")
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code, src, out, str(nbytes)], stdout=subprocess.PIPE)
    sampler = Sampler([src, out], proc.pid)  # the control: what a plain copy leaves in the page cache
    sampler.start()
    stdout, _ = proc.communicate()
    wall = time.perf_counter() - started
    sampler.stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit("copy failed")
    evict(out)
    os.unlink(out)
    return {"seconds": wall, "inner_seconds": float(stdout.decode().strip()), "mb_per_s": nbytes / wall / 1e6,
            "file_cache_bytes": sampler.max_resident, "meminfo_cached_delta_bytes": sampler.max_cached_delta}


def run_pack(ckpt: str, dest: str, src: str, chunk_rows: int, extra) -> dict:
    evict(src)
    for name in os.listdir(dest):
        os.unlink(os.path.join(dest, name))
    argv = [sys.executable, PACKER, "--checkpoint", ckpt, "--dest", dest, "--rank", "0", "--tp", "1",
            "--layers", "1", "--margin-bytes", "0", "--chunk-rows", str(chunk_rows), "--json"] + list(extra)
    paths = [src, os.path.join(dest, "engram-l1-r0of1.partial"), os.path.join(dest, "engram-l1-r0of1.bin")]
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sampler = Sampler(paths, proc.pid)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    sampler.stop.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    out = proc.stdout.read().decode()
    err = proc.stderr.read().decode()
    result = json.loads(out.strip().splitlines()[-1])
    if result.get("failed"):
        raise SystemExit("packer failed: %s\n%s" % (result.get("msg"), err))
    shard = result["shards"][0]
    return {"seconds": wall, "mb_per_s": shard["bytes"] / wall / 1e6, "packer_seconds": shard["seconds"],
            "peak_rss_bytes": usage.ru_maxrss * 1024, "sampled_rss_bytes": sampler.max_rss,
            "file_cache_bytes": sampler.max_resident, "meminfo_cached_delta_bytes": sampler.max_cached_delta,
            "samples": sampler.samples, "bytes": shard["bytes"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default="/tmp/sparkfleet-pack-bench")
    parser.add_argument("--rows", type=int, default=8_200_000, help="rows of layer 1 (8.2M rows = 2.02 GiB packed)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS)
    parser.add_argument("--packer-args", default="", help="extra packer arguments, e.g. '--nice'")
    parser.add_argument("--json-out", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the synthetic checkpoint for the next run")
    args = parser.parse_args()

    ckpt = os.path.join(args.workdir, "checkpoint")
    dest = os.path.join(args.workdir, "engram")
    marker = os.path.join(ckpt, ".rows")
    if not (os.path.exists(marker) and open(marker).read() == str(args.rows)):
        shutil.rmtree(ckpt, ignore_errors=True)
        t = time.perf_counter()
        info = synthetic.make_checkpoint(ckpt, rows={1: args.rows}, shards=4, seed=0)
        with open(marker, "w") as handle:
            handle.write(str(args.rows))
        print("generated %s (%.1f GiB) in %.1f s" % (ckpt, info["total_size"] / (1 << 30), time.perf_counter() - t))
    os.makedirs(dest, exist_ok=True)
    with open(os.path.join(ckpt, "model.safetensors.index.json")) as handle:
        src = os.path.join(ckpt, json.load(handle)["weight_map"]["layers.1.engram.embed.weight"])
    nbytes = HEADER_SIZE + args.rows * ROW_BYTES
    chunk_bytes = args.chunk_rows * ROW_BYTES
    print("shard: %d rows, %.2f GiB packed; chunk %d rows = %.1f MiB; filesystem of %s"
          % (args.rows, nbytes / (1 << 30), args.chunk_rows, chunk_bytes / MIB, args.workdir))

    # ABBA order (copy, pack, pack, copy) within each repetition: drift in the disk's speed (other work on
    # the machine, the device's own caches) hits both sides alike. The ratio of a repetition is the copy's
    # total time over the packer's total time for the same number of bytes.
    copies, packs, ratios = [], [], []
    for rep in range(args.repeat):
        pair_copies, pair_packs = [], []
        for step in ("copy", "pack", "pack", "copy"):
            if step == "copy":
                pair_copies.append(run_copy(src, os.path.join(dest, "copy.bin"), nbytes))
            else:
                pair_packs.append(run_pack(ckpt, dest, src, args.chunk_rows, args.packer_args.split()))
        ratio = sum(c["seconds"] for c in pair_copies) / sum(p["seconds"] for p in pair_packs)
        ratios.append(ratio)
        copies += pair_copies
        packs += pair_packs
        print("rep %d: copy %s MB/s, pack %s MB/s, ratio %.3f, peak RSS %.1f MiB, file cache max %.1f MiB, "
              "Cached+Buffers delta max %.1f MiB"
              % (rep + 1, "/".join("%.0f" % c["mb_per_s"] for c in pair_copies),
                 "/".join("%.0f" % p["mb_per_s"] for p in pair_packs), ratio,
                 max(p["peak_rss_bytes"] for p in pair_packs) / MIB,
                 max(p["file_cache_bytes"] for p in pair_packs) / MIB,
                 max(p["meminfo_cached_delta_bytes"] for p in pair_packs) / MIB), flush=True)

    summary = {
        "rows": args.rows, "bytes": nbytes, "chunk_rows": args.chunk_rows, "chunk_bytes": chunk_bytes,
        "repeat": args.repeat, "packer_args": args.packer_args, "workdir": args.workdir,
        "copy_mb_per_s_median": round(statistics.median(c["mb_per_s"] for c in copies), 1),
        "pack_mb_per_s_median": round(statistics.median(p["mb_per_s"] for p in packs), 1),
        "ratio_median": round(statistics.median(ratios), 3), "ratio_min": round(min(ratios), 3),
        "ratio_max": round(max(ratios), 3),
        "ratio_total": round(sum(c["seconds"] for c in copies) / sum(p["seconds"] for p in packs), 3),
        "peak_rss_mib_max": round(max(p["peak_rss_bytes"] for p in packs) / MIB, 1),
        "file_cache_mib_max": round(max(p["file_cache_bytes"] for p in packs) / MIB, 1),
        "file_cache_chunks_max": round(max(p["file_cache_bytes"] for p in packs) / chunk_bytes, 2),
        "meminfo_cached_delta_mib_max": round(max(p["meminfo_cached_delta_bytes"] for p in packs) / MIB, 1),
        "meminfo_cached_delta_mib_median": round(statistics.median(p["meminfo_cached_delta_bytes"]
                                                                   for p in packs) / MIB, 1),
        "copy_file_cache_mib_max": round(max(c["file_cache_bytes"] for c in copies) / MIB, 1),
        "copy_meminfo_cached_delta_mib_median": round(statistics.median(c["meminfo_cached_delta_bytes"]
                                                                        for c in copies) / MIB, 1),
        "runs": {"copy": copies, "pack": packs, "ratios": ratios},
    }
    checks = {"throughput_ratio>=0.90": summary["ratio_median"] >= 0.90,
              "peak_rss<=128MiB": summary["peak_rss_mib_max"] <= 128,
              "file_cache<=2chunks": summary["file_cache_chunks_max"] <= 2.0}
    summary["checks"] = checks
    print("summary: copy %.0f MB/s, pack %.0f MB/s (medians); throughput ratio pack/copy %.3f (median of %d ABBA "
          "repetitions, range %.3f-%.3f; all runs %.3f); peak RSS %.1f MiB; page cache: packer files max %.1f MiB "
          "(%.2f chunks), Cached+Buffers delta max %.1f MiB (median %.1f)"
          % (summary["copy_mb_per_s_median"], summary["pack_mb_per_s_median"], summary["ratio_median"],
             args.repeat, summary["ratio_min"], summary["ratio_max"], summary["ratio_total"],
             summary["peak_rss_mib_max"], summary["file_cache_mib_max"], summary["file_cache_chunks_max"],
             summary["meminfo_cached_delta_mib_max"], summary["meminfo_cached_delta_mib_median"]))
    print("control: the copy's files held up to %.1f MiB of page cache (Cached+Buffers delta median %.1f MiB)"
          % (summary["copy_file_cache_mib_max"], summary["copy_meminfo_cached_delta_mib_median"]))
    print("checks: " + ", ".join("%s %s" % (k, "PASS" if v else "FAIL") for k, v in checks.items()))
    doc = json.dumps(summary, indent=2)
    if args.json_out:
        with open(args.json_out, "w") as handle:
            handle.write(doc + "\n")
    else:
        print(doc)
    if not args.keep:
        shutil.rmtree(args.workdir, ignore_errors=True)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
