#!/usr/bin/env python3
"""Engram packing benchmark: the packer against two copies of the same bytes, in the same run.

For each output size (default 2 and 4 GiB: layers 1 and 14 of one synthetic checkpoint, tp 1, rank 0)
it runs, ``--repeat`` times (default 5) and in rotating order (plain, pattern, pack; then pattern, pack,
plain; ...), with the source evicted from the page cache and the outputs removed before each step:

- ``plain``: a sequential copy of as many bytes of the source shard, 8 MiB reads and writes, one fsync at
  the end (what ``cp`` + ``sync`` costs);
- ``pattern``: the same copy with the packer's own IO pattern: chunks of ``chunk_rows * 264`` bytes read
  ``O_DIRECT`` by one thread and written ``O_DIRECT`` by another (three chunk buffers, the packer's own
  ``io_buffer``: private, huge pages; so a read overlaps a write), a block-unaligned tail written through
  the page cache, an fsync at the end;
- ``pack``: the packer's command line (``engram_packer.py --json``, default ``verify=sample``).

Every step runs under a small exec'd launcher (a bare ``python3 -I -S`` that forks, execs the step and
``wait4``s it), so peak RSS (``ru_maxrss``) and CPU (user, system) are the step's alone, not this
process's. A sampler thread reads, every 50 ms, how many pages of the source shard and of the output
(``.partial``, ``.bin`` or the copy) are in the page cache (``mincore(2)`` on a read-only mapping, which
faults nothing in). After the repetitions, ``--verify-repeat`` packs with ``verify=full`` give the cost of
full verification (the packer reports ``verify_seconds`` per shard; sampled verification's comes from
the main packs). It prints medians with min-max and the per-repetition ratios, writes JSON
(``--json-out``), and exits 1 when a target of issue 24 is missed (medians): throughput >= 0.90 of the
pattern copy and >= 1.0 of the plain copy, CPU <= 0.7 s per GB written, peak RSS <= 64 MiB, page cache
held by source + output <= 2 chunks at any sample.

    .venv/bin/python benchmarks/pack_bench.py [--sizes 2,4] [--repeat 5] [--verify-repeat 3]
        [--chunk-rows 16384] [--workdir /var/tmp/sparkfleet-pack-bench] [--keep] [--json-out FILE]
        [--interleave auto|numpy|kernel-gather]
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
GIB = 1 << 30
PAGE = mmap.PAGESIZE
ROWS_PER_GIB = (GIB - HEADER_SIZE) // ROW_BYTES
LAYERS = (1, 14)  # the checkpoint's two Engram layers carry the two sizes

# The launcher: holds nothing, forks and execs the step, waits for it and prints its rusage as JSON.
LAUNCHER = r"""
import json, os, sys, time
t = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execv(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
_, status, ru = os.wait4(pid, 0)
doc = {"rc": os.waitstatus_to_exitcode(status), "wall_s": time.perf_counter() - t, "user_s": ru.ru_utime,
       "sys_s": ru.ru_stime, "maxrss_bytes": ru.ru_maxrss * 1024}
with open(sys.argv[1], "w") as handle:
    json.dump(doc, handle)
"""

# The two reference copies, run as their own Python processes like the packer.
PLAIN_COPY = r"""
import os, sys
src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
fi = os.open(src, os.O_RDONLY)
fo = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
buf = bytearray(8 << 20)
view = memoryview(buf)
done = 0
while done < n:
    got = os.readv(fi, [view[:min(len(buf), n - done)]])
    if got <= 0:
        sys.exit("source too short")
    os.write(fo, view[:got])
    done += got
os.fsync(fo)
os.close(fo)
os.close(fi)
"""

PATTERN_COPY = r"""
import os, queue, sys, threading
src, out, n, chunk = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, sys.argv[5])  # module_utils: the packer's own buffers (private, huge pages)
from engram_packer_io import ALIGN, io_buffer
fi = os.open(src, os.O_RDONLY | os.O_DIRECT)
fo = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
fd = os.open(out, os.O_WRONLY | os.O_DIRECT)
bufs = [io_buffer(chunk + ALIGN) for _ in range(3)]
free, todo = queue.Queue(), queue.Queue()
for i in range(3):
    free.put(i)
def writer():
    while True:
        item = todo.get()
        if item is None:
            return
        i, pos, length = item
        view = memoryview(bufs[i])
        whole = length - length % ALIGN
        if whole:
            os.pwrite(fd, view[:whole], pos)
        if length > whole:
            os.pwrite(fo, view[whole:length], pos + whole)
        view.release()
        free.put(i)
thread = threading.Thread(target=writer)
thread.start()
done = 0
while done < n:
    i = free.get()
    length = min(chunk, n - done)
    span = length + (-length) % ALIGN
    view = memoryview(bufs[i])
    got = os.preadv(fi, [view[:span]], done)
    view.release()
    if got < length:
        sys.exit("source too short")
    todo.put((i, done, length))
    done += length
todo.put(None)
thread.join()
os.fsync(fo)
os.posix_fadvise(fo, 0, 0, os.POSIX_FADV_DONTNEED)
for f in (fd, fo, fi):
    os.close(f)
"""

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_MAP_FAILED = ctypes.c_void_p(-1).value


def resident_bytes(path: str) -> int:
    """Bytes of ``path`` in the page cache right now, by mincore(2) (0 if it does not exist)."""
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
            return (pages - bytes(vec).count(0)) * PAGE
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def evict(path: str) -> None:
    if os.path.exists(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


class Residency(threading.Thread):
    """Samples the page-cache residency of a source and of the output names, every ``interval`` s."""

    def __init__(self, source: str, outputs, interval: float = 0.05):
        super().__init__(daemon=True)
        self.source, self.outputs, self.interval = source, outputs, interval
        self.stop = threading.Event()
        self.max_source = self.max_output = self.max_total = 0
        self.samples = 0

    def run(self):
        while not self.stop.is_set():
            src = resident_bytes(self.source)
            out = sum(resident_bytes(p) for p in self.outputs)
            self.max_source, self.max_output = max(self.max_source, src), max(self.max_output, out)
            self.max_total = max(self.max_total, src + out)
            self.samples += 1
            self.stop.wait(self.interval)


def launch(argv, source: str, outputs, tmp: str) -> dict:
    """Run ``argv`` under the launcher while sampling residency; returns the launcher's figures."""
    report = os.path.join(tmp, "launcher.json")
    sampler = Residency(source, outputs)
    load = os.getloadavg()[0]
    sampler.start()
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", LAUNCHER, report] + list(argv),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sampler.stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit("launcher failed: %s" % proc.stderr.decode()[-2000:])
    with open(report) as handle:
        doc = json.load(handle)
    os.unlink(report)
    if doc["rc"] != 0:
        raise SystemExit("%s failed (rc %d): %s" % (argv[1], doc["rc"], proc.stderr.decode()[-2000:]))
    doc.update(stdout=proc.stdout.decode(), load1=load, source_cache_bytes=sampler.max_source,
               output_cache_bytes=sampler.max_output, total_cache_bytes=sampler.max_total, samples=sampler.samples)
    return doc


def clean(dest: str) -> None:
    for name in os.listdir(dest):
        os.unlink(os.path.join(dest, name))


def run_step(kind: str, ckpt: str, dest: str, src: str, layer: int, nbytes: int, chunk_rows: int, verify: str,
             tmp: str) -> dict:
    clean(dest)
    evict(src)
    out = os.path.join(dest, "copy.bin")
    if kind == "plain":
        doc = launch([sys.executable, "-I", "-c", PLAIN_COPY, src, out, str(nbytes)], src, [out], tmp)
    elif kind == "pattern":
        doc = launch([sys.executable, "-I", "-c", PATTERN_COPY, src, out, str(nbytes), str(chunk_rows * ROW_BYTES),
                      os.path.join(ROOT, "module_utils")],
                     src, [out], tmp)
    else:
        names = [os.path.join(dest, "engram-l%d-r0of1.%s" % (layer, ext)) for ext in ("partial", "bin")]
        doc = launch([sys.executable, "-I", PACKER, "--checkpoint", ckpt, "--dest", dest, "--rank", "0", "--tp", "1",
                      "--layers", str(layer), "--margin-bytes", "0", "--chunk-rows", str(chunk_rows), "--verify",
                      verify, "--json"], src, names, tmp)
        result = json.loads(doc["stdout"].strip().splitlines()[-1])
        if result.get("failed"):
            raise SystemExit("packer failed: %s" % result.get("msg"))
        shard = result["shards"][0]
        if shard["bytes"] != nbytes:
            raise SystemExit("packed %d bytes, expected %d" % (shard["bytes"], nbytes))
        doc["verify_seconds"] = shard["verify_seconds"]
        doc["interleave"] = result.get("interleave")  # numpy or kernel-gather (engram_packer_interleave)
    doc.pop("stdout")
    written = os.path.getsize(out) if kind != "pack" else nbytes
    if written != nbytes:
        raise SystemExit("%s wrote %d bytes, expected %d" % (kind, written, nbytes))
    gb = nbytes / 1e9
    doc.update(kind=kind, bytes=nbytes, mb_per_s=nbytes / doc["wall_s"] / 1e6, s_per_gb=doc["wall_s"] / gb,
               cpu_s_per_gb=(doc["user_s"] + doc["sys_s"]) / gb, user_s_per_gb=doc["user_s"] / gb,
               sys_s_per_gb=doc["sys_s"] / gb)
    clean(dest)
    return doc


def spread(values) -> dict:
    values = list(values)
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4), "n": len(values)}


def fmt(stat: dict, scale: float = 1.0, digits: int = 2) -> str:
    return "%.*f (%.*f-%.*f)" % (digits, stat["median"] * scale, digits, stat["min"] * scale, digits,
                                 stat["max"] * scale)


def measure_size(ckpt: str, dest: str, tmp: str, layer: int, rows: int, args) -> dict:
    with open(os.path.join(ckpt, "model.safetensors.index.json")) as handle:
        src = os.path.join(ckpt, json.load(handle)["weight_map"]["layers.%d.engram.embed.weight" % layer])
    nbytes = HEADER_SIZE + rows * ROW_BYTES
    chunk_bytes = args.chunk_rows * ROW_BYTES
    order = ["plain", "pattern", "pack"]
    runs = {k: [] for k in order}
    ratios = {"pattern": [], "plain": []}
    for rep in range(args.repeat):
        step_order = order[rep % 3:] + order[:rep % 3]  # rotate: each kind runs first, second and third
        this = {}
        for kind in step_order:
            this[kind] = run_step(kind, ckpt, dest, src, layer, nbytes, args.chunk_rows, "sample", tmp)
            runs[kind].append(this[kind])
        for ref in ("pattern", "plain"):
            ratios[ref].append(this[ref]["wall_s"] / this["pack"]["wall_s"])
        print("  %.2f GiB rep %d (%s): MB/s plain %.0f, pattern %.0f, pack %.0f; pack/pattern %.3f, pack/plain %.3f; "
              "pack CPU %.2f s/GB (%s), RSS %.1f MiB, cache %.2f chunks; load %.1f"
              % (nbytes / GIB, rep + 1, ",".join(step_order), this["plain"]["mb_per_s"], this["pattern"]["mb_per_s"],
                 this["pack"]["mb_per_s"], ratios["pattern"][-1], ratios["plain"][-1], this["pack"]["cpu_s_per_gb"],
                 this["pack"]["interleave"], this["pack"]["maxrss_bytes"] / MIB,
                 this["pack"]["total_cache_bytes"] / chunk_bytes,
                 this["pack"]["load1"]), flush=True)
    full = [run_step("pack", ckpt, dest, src, layer, nbytes, args.chunk_rows, "full", tmp)
            for _ in range(args.verify_repeat)]
    gb = nbytes / 1e9
    summary = {"bytes": nbytes, "rows": rows, "layer": layer, "source": src,
               "ratio_pack_over_pattern": spread(ratios["pattern"]), "ratio_pack_over_plain": spread(ratios["plain"]),
               "verify_sample_s_per_gb": spread(r["verify_seconds"] / gb for r in runs["pack"]),
               "verify_full_s_per_gb": spread(r["verify_seconds"] / gb for r in full) if full else None,
               "pack_full_s_per_gb": spread(r["s_per_gb"] for r in full) if full else None,
               "interleave": sorted({str(r["interleave"]) for r in runs["pack"]}), "runs": runs, "full_runs": full}
    for kind in order:
        rs = runs[kind]
        summary[kind] = {"mb_per_s": spread(r["mb_per_s"] for r in rs), "s_per_gb": spread(r["s_per_gb"] for r in rs),
                         "cpu_s_per_gb": spread(r["cpu_s_per_gb"] for r in rs),
                         "user_s_per_gb": spread(r["user_s_per_gb"] for r in rs),
                         "sys_s_per_gb": spread(r["sys_s_per_gb"] for r in rs),
                         "maxrss_mib": spread(r["maxrss_bytes"] / MIB for r in rs),
                         "source_cache_chunks": spread(r["source_cache_bytes"] / chunk_bytes for r in rs),
                         "output_cache_chunks": spread(r["output_cache_bytes"] / chunk_bytes for r in rs),
                         "total_cache_chunks": spread(r["total_cache_bytes"] / chunk_bytes for r in rs),
                         "load1": spread(r["load1"] for r in rs)}
    return summary


def report(doc: dict, json_out) -> None:
    """Print the table, the scaling and the checks of the sizes measured so far; write the JSON."""
    checks = {}
    print("\nmedian (min-max)     | plain MB/s | pattern MB/s | pack MB/s | pack/pattern | pack/plain | CPU s/GB "
          "pack (user+sys) | pattern CPU | plain CPU | pack RSS MiB | cache chunks (src+out) | verify sample s/GB | "
          "verify full s/GB")
    for name, s in doc["sizes"].items():
        print("%-20s | %s | %s | %s | %s | %s | %s (%.2f+%.2f) | %s | %s | %s | %s | %s | %s"
              % (name, fmt(s["plain"]["mb_per_s"], digits=0), fmt(s["pattern"]["mb_per_s"], digits=0),
                 fmt(s["pack"]["mb_per_s"], digits=0), fmt(s["ratio_pack_over_pattern"]),
                 fmt(s["ratio_pack_over_plain"]), fmt(s["pack"]["cpu_s_per_gb"]),
                 s["pack"]["user_s_per_gb"]["median"], s["pack"]["sys_s_per_gb"]["median"],
                 fmt(s["pattern"]["cpu_s_per_gb"]), fmt(s["plain"]["cpu_s_per_gb"]),
                 fmt(s["pack"]["maxrss_mib"], digits=1),
                 fmt(s["pack"]["total_cache_chunks"]), fmt(s["verify_sample_s_per_gb"], digits=3),
                 fmt(s["verify_full_s_per_gb"]) if s["verify_full_s_per_gb"] else "-"))
        checks["%s pack/pattern >= 0.90" % name] = s["ratio_pack_over_pattern"]["median"] >= 0.90
        checks["%s pack/plain >= 1.0" % name] = s["ratio_pack_over_plain"]["median"] >= 1.0
        checks["%s CPU <= 0.7 s/GB" % name] = s["pack"]["cpu_s_per_gb"]["median"] <= 0.7
        checks["%s RSS <= 64 MiB" % name] = s["pack"]["maxrss_mib"]["max"] <= 64
        checks["%s cache <= 2 chunks" % name] = s["pack"]["total_cache_chunks"]["max"] <= 2.0
    if len(doc["sizes"]) == 2:
        small, large = doc["sizes"].values()
        doc["scaling"] = {
            "s_per_gb_large_over_small": round(large["pack"]["s_per_gb"]["median"]
                                               / small["pack"]["s_per_gb"]["median"], 3),
            "cpu_per_gb_large_over_small": round(large["pack"]["cpu_s_per_gb"]["median"]
                                                 / small["pack"]["cpu_s_per_gb"]["median"], 3),
            "rss_mib_large_minus_small": round(large["pack"]["maxrss_mib"]["median"]
                                               - small["pack"]["maxrss_mib"]["median"], 1)}
        print("scaling (larger/smaller size): time per GB x%.3f, CPU per GB x%.3f, RSS %+.1f MiB"
              % (doc["scaling"]["s_per_gb_large_over_small"], doc["scaling"]["cpu_per_gb_large_over_small"],
                 doc["scaling"]["rss_mib_large_minus_small"]))
    doc["checks"] = checks
    print("checks: " + ", ".join("%s %s" % (k, "PASS" if v else "FAIL") for k, v in checks.items()), flush=True)
    if json_out:
        with open(json_out, "w") as handle:
            handle.write(json.dumps(doc, indent=2) + "\n")
        print("JSON written to %s" % json_out, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default="/var/tmp/sparkfleet-pack-bench")
    parser.add_argument("--sizes", default="2,4", help="output sizes in GiB, comma separated (at most two)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--verify-repeat", type=int, default=3, help="packs with verify=full per size")
    parser.add_argument("--only", type=float, default=None, help="measure only this one of --sizes (same checkpoint)")
    parser.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS)
    parser.add_argument("--json-out", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the synthetic checkpoint for the next run")
    parser.add_argument("--interleave", choices=("auto", "numpy", "kernel-gather"), default="auto",
                        help="the packer's interleave (SPARKFLEET_PACK_INTERLEAVE; auto: numpy where importable)")
    args = parser.parse_args()
    os.environ["SPARKFLEET_PACK_INTERLEAVE"] = args.interleave  # inherited by the launcher and the packer
    sizes = [float(x) for x in args.sizes.split(",") if x.strip()]
    if not 1 <= len(sizes) <= len(LAYERS) or args.repeat < 1:
        raise SystemExit("--sizes takes one or two sizes, --repeat at least 1")
    rows = {layer: int(size * ROWS_PER_GIB) for layer, size in zip(LAYERS, sizes)}

    ckpt = os.path.join(args.workdir, "checkpoint")
    dest = os.path.join(args.workdir, "engram")
    tmp = os.path.join(args.workdir, "tmp")
    marker = os.path.join(ckpt, ".rows")
    wanted = json.dumps(rows, sort_keys=True)
    if not (os.path.exists(marker) and open(marker).read() == wanted):
        shutil.rmtree(ckpt, ignore_errors=True)
        started = time.perf_counter()
        info = synthetic.make_checkpoint(ckpt, rows=rows, shards=4, seed=0)
        with open(marker, "w") as handle:
            handle.write(wanted)
        print("generated %s (%.1f GiB) in %.0f s" % (ckpt, info["total_size"] / GIB, time.perf_counter() - started))
    os.makedirs(dest, exist_ok=True)
    os.makedirs(tmp, exist_ok=True)
    chunk_bytes = args.chunk_rows * ROW_BYTES
    print("chunk %d rows = %.2f MiB; %d repetitions per size, rotating order; %d verify=full packs per size; "
          "%d CPUs, load %.1f; %s" % (args.chunk_rows, chunk_bytes / MIB, args.repeat, args.verify_repeat,
                                      os.cpu_count(), os.getloadavg()[0], args.workdir), flush=True)
    doc = {"chunk_rows": args.chunk_rows, "interleave_setting": args.interleave, "chunk_bytes": chunk_bytes,
           "repeat": args.repeat,
           "verify_repeat": args.verify_repeat, "cpus": os.cpu_count(), "workdir": args.workdir,
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "sizes": {}}
    for layer, n in rows.items():
        if args.only is not None and abs(n - args.only * ROWS_PER_GIB) > 1:
            continue
        doc["sizes"]["%.2f GiB" % ((HEADER_SIZE + n * ROW_BYTES) / GIB)] = measure_size(ckpt, dest, tmp, layer, n, args)
        report(doc, args.json_out)  # after each size: a run cut short keeps what it measured
    if not args.keep:
        shutil.rmtree(args.workdir, ignore_errors=True)
    return 0 if all(doc["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
