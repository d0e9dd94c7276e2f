#!/usr/bin/env python3
"""Benchmark of the wo_a fp8-twin kernels against the bf16 einsum (issue 9). Needs a CUDA GPU.

    python benchmarks/wo_a_bench.py --out results.json --md table.md           # dispatcher configs
    python benchmarks/wo_a_bench.py --sweep --out sweep.json --md sweep.md      # + candidate configs

For every G and M: time per layer from CUDA-graph replay over --sets distinct weight sets (so L2,
60 MB on an H200, cannot hold them), achieved bandwidth on the fp8 bytes, the einsum's time at the
same shape, the fraction of the device-to-device copy bandwidth measured in the same run, bitwise
determinism over repeated eager and graph runs, and the error against a float64 reference at full
shape. Inputs are fresh random values (never zeros); outputs are poisoned with NaN before checks.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: E402

from kernels import wo_a_gluon as GL  # noqa: E402
from kernels import wo_a_w8 as K  # noqa: E402

R, D = 1024, 4096
DEFAULT_MS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 512, 1024)  # issue 26
GB10_BANDWIDTH = 273e9
GB10_SMS = 48
GB10_CLOCK_GHZ = 2.2  # the fleet's clock cap (nvidia-smi -lgc 0,2200)
LAYERS = 43


# ------------------------------------------------------------------------------------------ inputs


def random_twin(groups: int, gen: torch.Generator) -> K.Twin:
    """A twin with random e4m3 values (every finite code may occur) and realistic block scales."""
    dev = "cuda"
    codes = torch.randint(0, 256, (groups, R, D), generator=gen, device=dev, dtype=torch.int32).to(torch.uint8)
    codes = torch.where((codes & 0x7F) == 0x7F, codes ^ 0x01, codes)  # drop the two NaN codes
    values = codes.view(torch.float8_e4m3fn)
    exps = torch.randint(112, 122, (groups, R // 32, D // 32), generator=gen, device=dev,
                         dtype=torch.int32).to(torch.uint8)
    return K.Twin(values.contiguous(), exps.contiguous())


def random_x(m: int, groups: int, gen: torch.Generator, odd: bool = False) -> torch.Tensor:
    if not odd:
        return torch.randn((m, groups, D), generator=gen, device="cuda", dtype=torch.float32).to(torch.bfloat16)
    big = torch.randn((m, groups + 1, D + 40), generator=gen, device="cuda", dtype=torch.float32).to(torch.bfloat16)
    return big[:, 1:, 24:24 + D]  # token stride (G+1)*(D+40), group stride D+40: neither a multiple of 16


# ------------------------------------------------------------------------------------------ timing


def graph_time_us(step_fns, replays: int, repeats: int) -> float:
    """Median time per call (us) of the calls in step_fns captured into one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in step_fns:  # warm-up outside the capture (compiles, allocator)
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in step_fns:
            fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) * 1e3 / (replays * len(step_fns)))
    del graph
    return statistics.median(samples)


def copy_bandwidth(nbytes: int = 1 << 30, iters: int = 20) -> float:
    """Device-to-device copy bandwidth in B/s, counting bytes read plus bytes written."""
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dst.copy_(src)
        stop.record()
        stop.synchronize()
        samples.append(2 * nbytes * iters / (start.elapsed_time(stop) * 1e-3))
    del src, dst
    torch.cuda.empty_cache()
    return statistics.median(samples)


@triton.jit
def _read_kernel(src_ptr, out_ptr, n_per_prog, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """Streams n_per_prog int32 words per program and stores one XOR: a pure-read reference. With PDL
    (a programmatic dependent launch) the next kernel may start at once and the store waits for the
    previous kernel, as the ring kernel's PDL launch does."""
    if PDL:
        gdc_launch_dependents()
    base = tl.program_id(0).to(tl.int64) * n_per_prog
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for off in range(0, n_per_prog, BLOCK):
        acc ^= tl.load(src_ptr + base + off + tl.arange(0, BLOCK))
    if PDL:
        gdc_wait()
    tl.store(out_ptr + tl.program_id(0), tl.xor_sum(acc, axis=0))


def read_ceiling(nbytes: int, sets: int, replays: int, repeats: int, pdl: bool = False) -> dict:
    """Best time to read nbytes once (same graph method as the kernels): the achievable floor, for
    plain launches or programmatic dependent ones."""
    words = nbytes // 4
    bufs = [torch.randint(-2**31, 2**31 - 1, (words,), dtype=torch.int32, device="cuda") for _ in range(sets)]
    best = None
    for block, progs_per_sm, warps, stages in itertools.product((1024, 2048, 4096), (2, 4, 8), (4, 8), (1, 3)):
        progs = 132 * progs_per_sm
        n_per = -(-words // progs)
        n_per = -(-n_per // block) * block
        progs = -(-words // n_per)
        if progs * n_per != words:
            continue
        out = torch.empty(progs, dtype=torch.int32, device="cuda")
        fns = [lambda b=b: _read_kernel[(progs,)](b, out, n_per, BLOCK=block, PDL=pdl, num_warps=warps,
                                                  num_stages=stages, launch_pdl=pdl) for b in bufs]
        t = graph_time_us(fns, replays, repeats)
        if best is None or t < best["us"]:
            best = {"us": t, "block": block, "programs": progs, "warps": warps, "stages": stages}
    del bufs
    best["GBps"] = nbytes / (best["us"] * 1e-6) / 1e9
    return best


# ------------------------------------------------------------------------------------------ checks


def full_shape_check(groups: int, m: int, twin: K.Twin, w_bf16: torch.Tensor, gen, cfg=None) -> dict:
    """Error against float64 and the bf16 einsum, every output written, bitwise determinism, for the
    timed case (aligned x: the ring kernel on the gluon path); plus the error with odd x strides
    (the register kernel or the mid path there)."""
    out = {}
    for odd in (False, True):
        x = random_x(m, groups, gen, odd=odd)
        ref = torch.einsum("tgd,grd->tgr", x.double(), w_bf16.double())
        y = torch.full((m, groups, R), float("nan"), dtype=torch.bfloat16, device="cuda")
        K.wo_a(x, twin, out=y, config=cfg)
        rel = ((y.double() - ref).norm() / ref.norm()).item()
        if odd:
            out["odd_strides_rel_err_vs_fp64"] = rel
            out["written"] &= bool(torch.isfinite(y).all())
            continue
        ein = torch.einsum("tgd,grd->tgr", x, w_bf16)
        out.update(written=bool(torch.isfinite(y).all()), rel_err_vs_fp64=rel,
                   einsum_rel_err_vs_fp64=((ein.double() - ref).norm() / ref.norm()).item())
        first, same = y.clone(), True
        for _ in range(20):
            y.fill_(float("nan"))
            K.wo_a(x, twin, out=y, config=cfg)
            same &= bool(torch.equal(y.view(torch.int16), first.view(torch.int16)))
        out["deterministic_eager_x21"] = same
    return out


# ------------------------------------------------------------------------------------------ sweep


def sweep_candidates(m: int, groups: int = 4) -> list[K.KernelConfig]:
    """Round-2 candidates: the acc-scale kernel (block scales on the fp32 partials) and round 1's
    kernel around its best tiles, over split-K, warps and stages, plus the dispatcher's current
    configuration for this M (so the sweep can only improve on it)."""
    out = []
    try:
        out.append(K.default_config(m, groups, R, D))
    except ValueError:
        pass
    acc = dict(acc_scale=True)
    if m == 1:
        for split in (8, 16):
            out.append(K.KernelConfig(1, 32, 128, split, 8, 1, fma=True))
        for br, split in itertools.product((64, 128), (8, 16)):
            out.append(K.KernelConfig(16, br, 128, split, 4, 2, **acc))
    elif m <= 16:
        for br, bk, warps, stages, split in itertools.product((64, 128), (128, 256), (4, 8), (2, 3), (4, 8, 16)):
            out.append(K.KernelConfig(16, br, bk, split, warps, stages, **acc))
        for stages, split in itertools.product((2, 3), (4, 8, 16)):
            out.append(K.KernelConfig(16, 64, 128, split, 4, stages))
    else:
        p2 = 1 << (m - 1).bit_length()
        bm = min(max(16, p2), 128)
        for br, swap, split in itertools.product((64, 128), (False, True), (2, 4, 8)):
            out.append(K.KernelConfig(bm, br, 128, split, 4 if br == 64 else 8, 3, swap_ab=swap, **acc))
        base = K.default_config(m, groups, R, D)
        for split in (1, 2, 4, 8):
            out.append(replace(base, split_k=split))
    seen, uniq = set(), []
    for c in out:
        if c.fits(R, D) and c not in seen:
            seen.add(c)
            uniq.append(c)
    return uniq


def bucket_of(m: int) -> int:
    """The swept M whose best configuration serves this M."""
    if m == 1:
        return 1
    if m <= 16:
        return 8
    return m


def compile_key(c: K.KernelConfig, m: int) -> tuple:
    mclass = 1 if m == 1 else (16 if m % 16 == 0 else 0)
    return tuple(sorted(asdict(c).items())) + (mclass,)  # split-K is a compile-time constant


def launch_dispatcher(x, twin, y, cfg: dict) -> None:
    """A compile task's launch on the dispatcher with a round 1-3 `KernelConfig` (this benchmark's tilings)."""
    K.wo_a(x, twin, out=y, config=K.KernelConfig(**cfg))


def compile_worker(launch, tasks) -> list:
    """Runs each (G, M, config) once through ``launch(x, twin, y, cfg)`` so Triton's on-disk cache holds every
    kernel (parallel compile); returns (G, M, config, reason) for each that raised. ``launch`` must be a
    module-level function (it travels to the spawned workers by name)."""
    torch.cuda.init()
    gen = torch.Generator(device="cuda").manual_seed(1)
    twins = {}
    failures = []
    for groups, m, cfg in tasks:
        twin = twins.get(groups) or twins.setdefault(groups, random_twin(groups, gen))
        x = random_x(m, groups, gen)
        y = torch.empty((m, groups, R), dtype=torch.bfloat16, device="cuda")
        try:
            launch(x, twin, y, cfg)
            torch.cuda.synchronize()
        except Exception as exc:  # reported; the caller skips or records it
            failures.append((groups, m, cfg, repr(exc)[:300]))
    return failures


def precompile(tasks, workers: int, launch=launch_dispatcher) -> list:
    """``compile_worker`` over ``workers`` spawned processes (in this process when ``workers`` <= 1)."""
    if workers <= 1 or not tasks:
        return compile_worker(launch, tasks)
    chunks = [tasks[i::workers] for i in range(workers)]
    with mp.get_context("spawn").Pool(workers) as pool:
        return [f for part in pool.map(functools.partial(compile_worker, launch), chunks) for f in part]


# ------------------------------------------------------------------------------------------ main


def device_info() -> dict:
    props = torch.cuda.get_device_properties(0)
    info = {"device": props.name, "sms": props.multi_processor_count,
            "l2_mb": getattr(props, "L2_cache_size", 0) / 2**20, "torch": torch.__version__,
            "triton": triton.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
    try:
        info["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as exc:  # informational only
        info["nvidia_smi"] = repr(exc)
    return info


def measure(groups, ms, sets, replays, repeats, gen, twins, w_bf16, xs_all, configs=None, with_einsum=True):
    """Time kernel (dispatcher config, or configs[m]) and einsum for each M."""
    rows = []
    for m in ms:
        cfg = configs.get(m) if configs else None
        xs = xs_all[m]
        outs = [torch.empty((m, groups, R), dtype=torch.bfloat16, device="cuda") for _ in range(sets)]
        fns = [lambda i=i: K.wo_a(xs[i], twins[i], out=outs[i], config=cfg) for i in range(sets)]
        t_k = graph_time_us(fns, replays, repeats)
        # graph replay reproduces the eager result bit for bit
        graph_ok = True
        eager = [K.wo_a(xs[i], twins[i], config=cfg) for i in range(2)]
        graph_ok &= all(torch.equal(eager[i].view(torch.int16), outs[i].view(torch.int16)) for i in range(2))
        ein_fns = [lambda i=i: torch.einsum("tgd,grd->tgr", xs[i], w_bf16[i]) for i in range(sets)]
        t_e = graph_time_us(ein_fns, replays, repeats) if with_einsum else float("nan")
        path = "small" if cfg is not None and m <= K.SMALL_MAX_M else "mid" if cfg is not None else K.select_path(m, groups)
        if cfg is None and path == "gluon":
            cfg_ring = GL.ring_config_for(m, groups, R, D, "cuda") if GL.ring_ok(xs[0], twins[0]) else None
            used = cfg_ring or GL.config_for(m, groups, R, D, "cuda")
        elif cfg is None and path == "wide":
            used = K.wide_config(m, groups, R, D)
        elif cfg is None and path == "tc":
            used = K.tc_config(m, groups, R, D)
        elif cfg is None and path == "wg":
            used = K.wg_config(m, groups, R, D)
        elif cfg is None and path == "einsum":  # prefill without the bf16 weight: bf16 scratch + cuBLAS
            used = None
        else:
            used = cfg or K.default_config(m, groups, R, D)
        row = {"G": groups, "M": m, "path": path,
               "config": {"kind": type(used).__name__, **asdict(used)} if used is not None else
               {"kind": "prefill", "batched": K._prefill_batched(m, groups)},
               "kernel_us": t_k, "einsum_us": t_e, "graph_matches_eager": graph_ok}
        if isinstance(used, GL.RingConfig) and used.pdl:  # the same calls without PDL
            plain = plain_ring_config(path, used, m, groups)
            plain_fns = [lambda i=i: K.wo_a(xs[i], twins[i], out=outs[i], config=plain) for i in range(sets)]
            row["plain_launch_us"] = graph_time_us(plain_fns, replays, repeats)
            row["plain_launch_config"] = asdict(plain)
            for c in (plain, replace(used, pdl=False)):  # PDL gives the plain launch's bits
                plain_eager = K.wo_a(xs[0], twins[0], config=c).view(torch.int16)
                row["graph_matches_eager"] &= bool(torch.equal(plain_eager, eager[0].view(torch.int16)))
        if isinstance(used, K.WgConfig) and used.pdl:  # the wg tiling as a plain launch: the same bits
            plain = replace(used, pdl=False)
            plain_fns = [lambda i=i: K.wo_a(xs[i], twins[i], out=outs[i], config=plain) for i in range(sets)]
            row["plain_launch_us"] = graph_time_us(plain_fns, replays, repeats)
            row["plain_launch_config"] = asdict(plain)
            plain_eager = K.wo_a(xs[0], twins[0], config=plain).view(torch.int16)
            row["graph_matches_eager"] &= bool(torch.equal(plain_eager, eager[0].view(torch.int16)))
        rows.append(row)
    return rows


def plain_ring_config(path: str, used: GL.RingConfig, m: int, groups: int) -> GL.RingConfig:
    """The ring tiling that the same rows get as plain launches (no PDL): round 6's tiling for 1..16
    rows (the gluon path), the wide path's tiling with PDL off for 17+ rows (the ring has no plain
    tiling of its own there: ring_config_for returns None)."""
    plain = GL.ring_config_for(m, groups, R, D, "cuda", pdl=False) if path == "gluon" else None
    return plain if plain is not None else replace(used, pdl=False)


def apply_wide_table(table: dict) -> None:
    """Install a wide-path table ({"wide": {G: [[top, RingConfig fields]...]}, "wide_max_m": {G: M},
    "einsum_faster": [[lo, hi, G]...]}) in the dispatcher for this run."""
    K.WIDE_TABLE.clear()
    K.WIDE_TABLE.update({int(g): tuple((int(top), GL.RingConfig(**c)) for top, c in rows)
                         for g, rows in table["wide"].items()})
    K.WIDE_MAX_M.clear()
    K.WIDE_MAX_M.update({int(g): int(m) for g, m in table["wide_max_m"].items()})
    K.EINSUM_FASTER["H200"] = tuple((int(lo), int(hi), int(g)) for lo, hi, g in table["einsum_faster"])


def apply_tc_tables(tables: dict) -> None:
    """Install the tc path's tables chosen by benchmarks/wo_a_tc_sweep.py ({"tc": {G: [[lo, hi, TcConfig
    fields]]}, "prefill_batched": {G: [[lo, hi or None]]}}) in the dispatcher for this run."""
    K.TC_TABLE.clear()
    K.TC_TABLE.update({int(g): tuple((int(lo), int(hi), K.TcConfig(**c)) for lo, hi, c in rows)
                       for g, rows in tables["tc"].items()})
    K.PREFILL_BATCHED.clear()
    K.PREFILL_BATCHED.update({int(g): tuple((int(lo), None if hi is None else int(hi)) for lo, hi in rows)
                              for g, rows in tables["prefill_batched"].items()})


def profile_one(args) -> int:
    groups, m = args.groups[0], args.ms[0]
    chosen = json.loads(Path(args.profile_from).read_text()).get("chosen", {}).get(str(groups), {})
    cfg = K.KernelConfig(**chosen[str(m)]) if str(m) in chosen else None
    gen = torch.Generator(device="cuda").manual_seed(1)
    twins = [random_twin(groups, gen) for _ in range(8)]
    x = random_x(m, groups, gen)
    for i in range(30):
        K.wo_a(x, twins[i % 8], config=cfg)
    torch.cuda.synchronize()
    print("profiled", groups, m, cfg)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="wo_a_bench.json")
    ap.add_argument("--md", default=None)
    ap.add_argument("--groups", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--ms", type=int, nargs="+", default=list(DEFAULT_MS))
    ap.add_argument("--sets", type=int, default=16, help="distinct weight sets rotated per graph (>= 8)")
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--sweep", action="store_true", help="also time candidate configs and report the best")
    ap.add_argument("--sweep-ms", type=int, nargs="+", default=None)
    ap.add_argument("--sweep-groups", type=int, nargs="+", default=None)
    ap.add_argument("--mid-sweep-groups", type=int, nargs="+", default=[4],
                    help="groups whose M > 16 sizes are swept (others reuse their tiles, split-K rescaled)")
    ap.add_argument("--workers", type=int, default=min(14, os.cpu_count() or 1))
    ap.add_argument("--deadline", type=float, default=420.0, help="seconds after start when the sweep stops")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--wide-table", default=None,
                    help="JSON from benchmarks/wo_a_wide_sweep.py --table-out: run the dispatcher with that table")
    ap.add_argument("--profile-from", default=None,
                    help="results JSON of a sweep: only run its chosen config for --groups[0], --ms[0] "
                         "30 times (a target for ncu) and exit")
    ap.add_argument("--tc-tables", default=None,
                    help="JSON from benchmarks/wo_a_tc_sweep.py: run the dispatcher with its chosen tables")
    args = ap.parse_args()
    if args.tc_tables:
        apply_tc_tables(json.loads(Path(args.tc_tables).read_text())["tables"])
    if args.wide_table:  # a table chosen by benchmarks/wo_a_wide_sweep.py, measured as the dispatcher's
        apply_wide_table(json.loads(Path(args.wide_table).read_text()))
    if args.profile_from:
        return profile_one(args)
    if args.sets < 8:
        ap.error("--sets must be at least 8 so that L2 cannot hold the weights")
    t0 = time.time()
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    info = device_info()
    info.update(seed=seed, sets=args.sets, replays=args.replays, repeats=args.repeats,
                command=" ".join([Path(sys.executable).name] + sys.argv))
    print(json.dumps(info), flush=True)
    result = {"info": info, "rows": [], "checks": [], "sweep": [], "compile_failures": []}

    if args.sweep:
        sweep_ms = args.sweep_ms or args.ms
        tasks, seen = [], set()
        for g in args.sweep_groups or args.groups:
            for m in sweep_ms:
                if m > 16 and g not in args.mid_sweep_groups:
                    continue
                for c in sweep_candidates(m, g):
                    key = compile_key(c, m)
                    if key not in seen:
                        seen.add(key)
                        tasks.append((g, m, asdict(c)))
        tc = time.time()
        result["compile_failures"] = precompile(tasks, args.workers)
        print(f"precompiled {len(tasks)} (G, M, config) in {time.time() - tc:.0f}s, "
              f"{len(result['compile_failures'])} failed", flush=True)
    failed = {compile_key(K.KernelConfig(**c), m) for g, m, c, _ in result["compile_failures"]}

    copy_bw = copy_bandwidth()
    info["copy_bandwidth_GBps"] = copy_bw / 1e9
    print(f"copy bandwidth (read+write) {copy_bw / 1e9:.0f} GB/s", flush=True)

    best_any = {}
    for groups in args.groups:
        twins = [random_twin(groups, gen) for _ in range(args.sets)]
        w_bf16 = [K.dequantize(t) for t in twins]
        all_ms = set(args.ms) | set(args.sweep_ms or ())
        xs_all = {m: [random_x(m, groups, gen) for _ in range(args.sets)] for m in all_ms}
        best = {}
        ceiling = read_ceiling(twins[0].values.numel(), args.sets, args.replays, args.repeats)
        result.setdefault("read_ceiling", {})[groups] = ceiling
        print(f"G={groups}: pure read of the fp8 bytes {ceiling['us']:.2f} us ({ceiling['GBps']:.0f} GB/s) {ceiling}",
              flush=True)
        ceiling_pdl = None
        if GL.pdl_enabled("cuda"):
            ceiling_pdl = read_ceiling(twins[0].values.numel(), args.sets, args.replays, args.repeats, pdl=True)
            result.setdefault("read_ceiling_pdl", {})[groups] = ceiling_pdl
            print(f"G={groups}: pure read, PDL launches {ceiling_pdl['us']:.2f} us ({ceiling_pdl['GBps']:.0f} GB/s)",
                  flush=True)
        if args.sweep and groups in (args.sweep_groups or args.groups):
            for m in args.sweep_ms or args.ms:
                if m > 16 and groups not in args.mid_sweep_groups:
                    continue
                x0 = xs_all[m][0]
                ref = torch.einsum("tgd,grd->tgr", x0.double(), w_bf16[0].double())
                for cfg in sweep_candidates(m, groups):
                    if time.time() - t0 > args.deadline:
                        break
                    if compile_key(cfg, m) in failed:
                        continue
                    try:
                        t = measure(groups, [m], args.sets, max(20, args.replays // 4), 3, gen, twins, w_bf16,
                                    xs_all, {m: cfg}, with_einsum=False)[0]
                        y = K.wo_a(x0, twins[0], config=cfg)
                        t["rel_err_vs_fp64"] = ((y.double() - ref).norm() / ref.norm()).item()
                        if not t["rel_err_vs_fp64"] < 1e-2 or not t["graph_matches_eager"]:
                            result["sweep"].append(t)
                            continue
                    except Exception as exc:
                        result["sweep"].append({"G": groups, "M": m, "config": asdict(cfg), "error": repr(exc)[:300]})
                        continue
                    result["sweep"].append(t)
                    if m not in best or t["kernel_us"] < best[m][0]:
                        best[m] = (t["kernel_us"], cfg)
                ranked = sorted((t for t in result["sweep"] if t["G"] == groups and t["M"] == m and "kernel_us" in t
                                 and t.get("rel_err_vs_fp64", 1) < 1e-2), key=lambda t: t["kernel_us"])
                for t in ranked[:6]:
                    c = t["config"]
                    print(f"sweep G={groups} M={m}: {t['kernel_us']:.2f} us  m{c['block_m']} r{c['block_r']} "
                          f"k{c['block_k']} s{c['split_k']} w{c['num_warps']} st{c['num_stages']}"
                          f"{' bf16' if c['bf16_scale'] else ''}{' swap' if c['swap_ab'] else ''}"
                          f"{' fma' if c['fma'] else ''}{' acc' if c.get('acc_scale') else ''}", flush=True)
        for b, (_, cfg) in best.items():
            best_any.setdefault(b, (groups, cfg))
        chosen = None
        if best or best_any:
            # final rows on the best configuration found for each M's bucket (same kernels the table gets)
            chosen = {}
            for m in args.ms:
                b = bucket_of(m)
                if b in best and best[b][1].fits(R, D):
                    chosen[m] = best[b][1]
                elif b in best_any:  # swept at another G only: same tiles, split scaled to keep the grid
                    other_g, cfg = best_any[b]
                    split = max(1, cfg.split_k * other_g // groups)
                    while split > 1 and not replace(cfg, split_k=split).fits(R, D):
                        split //= 2
                    chosen[m] = replace(cfg, split_k=split)
            result.setdefault("chosen", {})[groups] = {m: asdict(c) for m, c in chosen.items()}
        rows = measure(groups, args.ms, args.sets, args.replays, args.repeats, gen, twins, w_bf16, xs_all, chosen)
        for row in rows:
            m = row["M"]
            chk = full_shape_check(groups, m, twins[0], w_bf16[0], gen, (chosen or {}).get(m))
            row.update(chk)
            if m in best:
                row["best_sweep_us"], row["best_sweep_config"] = best[m][0], asdict(best[m][1])
            fp8_bytes = twins[0].nbytes
            row["fp8_GBps"] = fp8_bytes / (row["kernel_us"] * 1e-6) / 1e9
            row["copy_fraction"] = row["fp8_GBps"] * 1e9 / copy_bw
            row["speedup_vs_einsum"] = row["einsum_us"] / row["kernel_us"]
            row["einsum_bf16_GBps"] = 2 * groups * R * D / (row["einsum_us"] * 1e-6) / 1e9
            row["read_floor_us"] = ceiling["us"]
            row["read_floor_pdl_us"] = ceiling_pdl["us"] if ceiling_pdl else None
            result["rows"].append(row)
            print(f"G={groups} M={m:3d} {row['path']:5s} kernel {row['kernel_us']:7.2f} us  einsum "
                  f"{row['einsum_us']:7.2f} us  x{row['speedup_vs_einsum']:.2f}  {row['fp8_GBps']:6.0f} GB/s "
                  f"({100 * row['copy_fraction']:.0f}% of copy)  err {row['rel_err_vs_fp64']:.1e} "
                  f"det {row['deterministic_eager_x21'] and row['graph_matches_eager']}", flush=True)
        del twins, w_bf16, xs_all
        torch.cuda.empty_cache()

    info["wall_s"] = time.time() - t0
    result["kernel_fallbacks"], lines = fallback_report(K._FAILED)
    Path(args.out).write_text(json.dumps(result, indent=1))
    table = markdown(result)
    if args.md:
        Path(args.md).write_text(table + "".join(f"\n{line}" for line in lines))
    print(table)
    for line in lines:
        print(line, file=sys.stderr)
    return 1 if lines else 0


def fallback_report(failed: dict) -> tuple[dict, list[str]]:
    """The dispatcher's compile-once fallbacks of this run ((path, device) -> reason) as JSON and as
    lines for the table. A fallback means some rows were timed on the next path, not on the one the
    table names (seen once: a broken refactor of the mid kernel turned G=4 96/128 rows into 51-53 us
    einsum-path rows with only a log line), so the benchmark then exits 1."""
    out = {f"{path} on {device}": reason for (path, device), reason in sorted(failed.items())}
    lines = [f"FALLBACK: the {key} kernel failed ({reason}); rows after it ran on the next path: "
             f"this table is not the dispatcher's" for key, reason in out.items()]
    return out, lines


def markdown(result: dict) -> str:
    info = result["info"]
    lines = [f"Device: {info['device']} ({info['sms']} SMs), torch {info['torch']}, triton {info['triton']}, "
             f"CUDA {info['cuda']}; nvidia-smi: {info.get('nvidia_smi', '')}; copy bandwidth "
             f"{info['copy_bandwidth_GBps']:.0f} GB/s (read+write); {info['sets']} weight sets per graph.",
             "",
             "| G | M | path | fp8 kernel (us) | bf16 einsum (us) | speedup | fp8 GB/s | % of copy BW | "
             "without PDL (us) | pure fp8 read (us; PDL) | rel err vs fp64 | deterministic | config "
             "(m,r,k,split,warps,stages; gluon: rows,tokens,warps,K blocks; ring: rows,tokens,warps,K blocks "
             "per stage,stages[,pdl][,rows x2: two warps along the rows share x]; tc: tokens,rows,K,split,warps,"
             "stages,operand order; wg: rows,tokens,K,split,warps,stages[,pdl]) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        c = r["config"]
        det = r["deterministic_eager_x21"] and r["graph_matches_eager"] and r["written"]
        if c.get("kind") == "prefill":
            cfg_text = ("all groups: bf16 scratch [G, R, D] + one batched GEMM" if c.get("batched")
                        else "per group: bf16 scratch [R, D] + cuBLAS")
        elif c.get("kind") == "TcConfig":
            cfg_text = (f"tc {c['block_t']},{c['block_r']},{c['block_k']},{c['split_k']},{c['num_warps']},"
                        f"{c['num_stages']},{'W as A' if c['w_as_a'] else 'x as A'}"
                        f"{',per 32-K dot' if c.get('sub_blocks') else ''}")
        elif c.get("kind") == "WgConfig":
            cfg_text = (f"wg {c['block_r']},{c['block_n']},{c['block_k']},{c['split_k']},{c['num_warps']},"
                        f"{c['stages']}{',pdl' if c.get('pdl') else ''}"
                        f"{',ws' + str(c['decoders']) if c.get('decoders') else ''}"
                        f"{',no TMA warp' if c.get('decoders') and not c.get('tma_warp', True) else ''}")
        elif c.get("kind") == "RingConfig":
            cfg_text = (f"ring {c['block_r']},{c['block_m']},{c['num_warps']},{c['sb']},{c['stages']}"
                        f"{',pdl' if c.get('pdl') else ''}{',rows x2' if c.get('row_warps', 1) == 2 else ''}")
        elif r["path"] == "gluon":
            cfg_text = f"{c['block_r']},{c['block_m']},{c['num_warps']},{c['blocks']}"
        else:
            cfg_text = (f"{c['block_m']},{c['block_r']},{c['block_k']},{c['split_k']},{c['num_warps']},"
                        f"{c['num_stages']}{',bf16' if c['bf16_scale'] else ''}{',swap' if c['swap_ab'] else ''}"
                        f"{',fma' if c['fma'] else ''}{',acc' if c.get('acc_scale') else ''}")
        plain = f"{r['plain_launch_us']:.2f}" if r.get("plain_launch_us") else "-"
        floor = f"{r['read_floor_us']:.2f}" + (f"; {r['read_floor_pdl_us']:.2f}" if r.get("read_floor_pdl_us") else "")
        lines.append(f"| {r['G']} | {r['M']} | {r['path']} | {r['kernel_us']:.2f} | {r['einsum_us']:.2f} | "
                     f"{r['speedup_vs_einsum']:.2f}x | {r['fp8_GBps']:.0f} | {100 * r['copy_fraction']:.0f}% | "
                     f"{plain} | {floor} | {r['rel_err_vs_fp64']:.1e} | {'yes' if det else 'NO'} | {cfg_text} |")
    lines.append("")
    lines.append(f"GB10 projection per decode step ({LAYERS} layers; per layer the larger of the byte time at "
                 f"{GB10_BANDWIDTH / 1e9:.0f} GB/s and the H200 time scaled by SMs x clock, "
                 f"{info['sms']} x 1.98 GHz -> {GB10_SMS} x {GB10_CLOCK_GHZ} GHz):")
    scale = info["sms"] * 1.98 / (GB10_SMS * GB10_CLOCK_GHZ)
    for r in result["rows"]:
        if r["M"] in (1, 2, 4, 6, 8, 12, 16):
            g = r["G"]
            fp8 = LAYERS * max(g * R * D * (1 + 1 / 1024) / GB10_BANDWIDTH * 1e6, r["kernel_us"] * scale) / 1e3
            bf16 = LAYERS * max(2 * g * R * D / GB10_BANDWIDTH * 1e6, r["einsum_us"] * scale) / 1e3
            lines.append(f"- G={g} M={r['M']}: fp8 twin >= {fp8:.2f} ms, bf16 einsum >= {bf16:.2f} ms")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
