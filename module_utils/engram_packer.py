#!/usr/bin/env python3
# -*- coding: utf-8 -*-
"""Pack one rank's Engram rows from a safetensors checkpoint into ``engram-l{L}-r{r}of{tp}.bin``.

Used by the ``engram_pack`` module (in-process) and, on workers that only see the checkpoint through
the ``dsv41-weights`` docker volume, as a stand-alone script inside the engine container::

    python3 engram_packer.py --checkpoint DIR --dest DIR --rank R --tp T [--layers 1,14]
        [--margin-bytes B] [--chunk-rows N] [--verify none|sample|full] [--no-resume]
        [--replace-invalid] [--nice] [--check] [--host-label NAME] [--json]

The last stdout line is one JSON object shaped like the module's result; exit 0 on success, 1 on failure.

The packer is six files (docs/packing.md has the table); this one runs a pack (lock, plan, refuse, write
each shard, report) and the command line:
- engram_packer_io.py: low-level IO (O_DIRECT source reads, pwritev/preadv row gather and scatter,
  page-cache advice, writeback, exclusive creation, priority);
- engram_packer_plan.py: options, the checkpoint's tensors, per-shard planning, the resume record;
- engram_packer_write.py: the streaming writer and the publication of a shard;
- engram_packer_verify.py: comparisons with the source (verification, resume);
- engram_format.py and safetensors_header.py: the packed format and the checkpoint headers.

How a shard is written (docs/reference.md sections 3 and 11):
- every number comes from the checkpoint headers (N per layer); rank r of tp owns [N*r//tp, N*(r+1)//tp);
- refuse when the bytes still to write plus a margin exceed the space an unprivileged writer has;
- rows stream in chunks through three fixed buffers; the source is read O_DIRECT (never cached), the
  kernel interleaves weights and scales as it writes; one chunk of writeback in flight, each chunk dropped
  from the page cache once on disk;
- ``.partial`` -> verify (header, size, sampled or all rows against the source) -> fsync -> rename to
  ``.bin`` -> fsync the directory: a ``.bin`` is complete and verified or absent, whatever kills us;
- an interrupted ``.partial`` resumes only when its ``.partial.source.json`` record names this exact
  source (header bytes, offsets, sizes, mtimes and inodes of both shard files), and only up to the end of
  the last recorded chunk whose rows still equal the source; otherwise it restarts;
- every file written in dest is created ``O_CREAT|O_EXCL|O_NOFOLLOW`` (a leftover of our own is unlinked
  first); a pre-existing partial that is not a regular file or has other names (``st_nlink > 1``) is
  refused: no write follows a link or lands in a file outside dest.

Standard library only (Debian's python3 on the hosts, the engine image's python3 in the container).
"""
from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import json
import os
import platform
import socket
import sys
from typing import Dict, List, Optional

try:
    from ansible.module_utils.engram_format import STATE_ABSENT, STATE_INVALID, STATE_PARTIAL, STATE_VALID
    from ansible.module_utils.engram_packer_interleave import interleave_method
    from ansible.module_utils.engram_packer_io import PackError
    from ansible.module_utils.engram_packer_plan import (  # noqa: F401  (the packer's API, in one place)
        DEFAULT_CHUNK_ROWS, DEFAULT_LAYERS, DEFAULT_MARGIN_BYTES, MAX_CHUNK_ROWS, LayerSource, PackOptions,
        ShardPlan, available_bytes, check_dest, dest_writable_problem, fmt_bytes, load_sources, plan_shard,
        source_record_path, validate_options, write_source_record)
    from ansible.module_utils.engram_packer_verify import SAMPLE_ROWS, VERIFY_MODES, sample_indices  # noqa: F401
    from ansible.module_utils.engram_packer_write import pack_shard
except ImportError:  # stand-alone: the packer's files side by side (the module writes them; the container runs them)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also under python3 -I / PYTHONSAFEPATH
    from engram_format import STATE_ABSENT, STATE_INVALID, STATE_PARTIAL, STATE_VALID  # type: ignore
    from engram_packer_interleave import interleave_method  # type: ignore
    from engram_packer_io import PackError  # type: ignore
    from engram_packer_plan import (  # type: ignore  # noqa: F401
        DEFAULT_CHUNK_ROWS, DEFAULT_LAYERS, DEFAULT_MARGIN_BYTES, MAX_CHUNK_ROWS, LayerSource, PackOptions,
        ShardPlan, available_bytes, check_dest, dest_writable_problem, fmt_bytes, load_sources, plan_shard,
        source_record_path, validate_options, write_source_record)
    from engram_packer_verify import SAMPLE_ROWS, VERIFY_MODES, sample_indices  # type: ignore  # noqa: F401
    from engram_packer_write import pack_shard  # type: ignore

# Every file the packer needs on a host, in import order (the module writes them for container mode).
PACKER_FILES = ("safetensors_header.py", "engram_format.py", "engram_packer_interleave.py", "engram_packer_io.py",
                "engram_packer_verify.py", "engram_packer_plan.py", "engram_packer_write.py", "engram_packer.py")

# ioprio_set(2) syscall numbers; aarch64 is what a DGX Spark runs.
_IOPRIO_SET_NR = {"x86_64": 251, "amd64": 251, "aarch64": 30, "arm64": 30, "riscv64": 30, "i386": 289,
                  "i686": 289, "armv7l": 314, "ppc64le": 273, "ppc64": 273, "s390x": 282}
_IOPRIO_CLASS_SHIFT, _IOPRIO_CLASS_BE, _IOPRIO_WHO_PROCESS = 13, 2, 1


def lower_priority() -> Dict[str, str]:
    """Lowest CPU priority and best-effort/7 IO priority for this thread and the threads it starts.

    Best effort: what was applied is returned, failures are reported, never raised. Best-effort level 7
    rather than the idle class: under BFQ the idle class can starve the pack for as long as the engine
    keeps reading its shards; with the ``none``/``mq-deadline`` schedulers usual on NVMe neither applies.
    """
    applied = {}
    try:
        current = os.getpriority(os.PRIO_PROCESS, 0)
        if current < 19:
            os.nice(19 - current)
        applied["nice"] = str(os.getpriority(os.PRIO_PROCESS, 0))
    except OSError as exc:
        applied["nice"] = "unchanged (%s)" % (exc.strerror or exc)
    number = _IOPRIO_SET_NR.get(platform.machine().lower())
    if number is None:
        applied["ioprio"] = "unchanged (no ioprio_set number for %s)" % platform.machine()
        return applied
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        value = (_IOPRIO_CLASS_BE << _IOPRIO_CLASS_SHIFT) | 7
        if libc.syscall(number, _IOPRIO_WHO_PROCESS, 0, value) == 0:
            applied["ioprio"] = "best-effort/7"
        else:
            applied["ioprio"] = "unchanged (%s)" % os.strerror(ctypes.get_errno())
    except (OSError, AttributeError) as exc:
        applied["ioprio"] = "unchanged (%s)" % exc
    return applied


# ---------------------------------------------------------------------------------------------- run

def _summary(plan: ShardPlan, state: str, reason: str = "", partial_rows: Optional[int] = None) -> str:
    name = os.path.basename(plan.path)
    if state == STATE_VALID:
        return "%s: valid (%d rows, %d bytes)" % (name, plan.rows, plan.size)
    if state == STATE_PARTIAL:
        return "%s: partial (%d of %d rows)" % (name, plan.resume_rows if partial_rows is None else partial_rows,
                                                plan.rows)
    if state == STATE_INVALID:
        return "%s: invalid (%s)" % (name, reason)
    return "%s: %s" % (name, state)


def _record(plan: ShardPlan, opts: PackOptions) -> dict:
    # until a shard is written its state after is its state before: a shard never reached is not valid
    after = plan.state_before
    return {"layer": plan.layer, "path": plan.path, "partial_path": plan.partial_path,
            "progress_path": plan.progress_path, "lo": plan.lo, "hi": plan.hi, "n": plan.n, "rows": plan.rows,
            "bytes": plan.size, "state_before": plan.state_before, "reason_before": plan.reason_before,
            "state_after": after, "action": plan.action, "resume_rows": plan.resume_rows,
            "required_bytes": plan.required_bytes, "written_bytes": 0, "seconds": None, "mb_per_s": None,
            "verify": opts.verify if plan.action not in ("skip", "refuse") else "none", "verified_rows": 0,
            "verify_seconds": None,
            "partial_rows": plan.resume_rows if plan.state_before == STATE_PARTIAL else 0}


def _set_diff(result: dict, plans: List[ShardPlan], records: List[dict]) -> None:
    """``diff`` (before/after text, one line per shard) and ``summary`` (``name: before -> after``)."""
    before, after, lines = [], [], []
    for plan, rec in zip(plans, records):
        b = _summary(plan, plan.state_before, plan.reason_before)
        a = _summary(plan, rec["state_after"], plan.reason_before, rec.get("partial_rows"))
        before.append(b)
        after.append(a)
        lines.append("%s -> %s" % (b, a.split(": ", 1)[1]))
    result["diff"] = {"before": "\n".join(before) + "\n", "after": "\n".join(after) + "\n"}
    result["summary"] = lines


def pack(opts: PackOptions) -> dict:
    """Plan, check and (unless check mode) pack. Returns the result; raises PackError with ``result``."""
    result = {"changed": False, "host": opts.host, "dest": opts.dest, "checkpoint": opts.checkpoint,
              "rank": opts.rank, "tp": opts.tp, "layers": list(opts.layers), "margin_bytes": opts.margin_bytes,
              "check_mode": opts.check_mode, "shards": [], "required_bytes": 0, "available_bytes": None}

    def fail(msg: str) -> PackError:
        return PackError(msg, result)

    try:
        validate_options(opts)
        # how staged (O_DIRECT) chunks are packed in memory, chosen before any buffer (a resume check
        # stages too); through the page cache the kernel gathers
        result["interleave"] = interleave_method()[0] if opts.direct else "kernel-gather"
    except ValueError as exc:
        raise fail("%s on %s." % (exc, opts.host)) from None
    except PackError as exc:
        raise fail(exc.msg) from None
    try:
        check_dest(opts.dest, opts.host)
        result["available_bytes"] = available_bytes(opts.dest)
        sources = load_sources(opts.checkpoint, opts.layers)
    except PackError as exc:
        raise fail(exc.msg) from None
    try:
        lock_fd = os.open(opts.dest, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise fail("Cannot open the destination %s on %s: %s." % (opts.dest, opts.host, exc.strerror or exc)) from None
    try:
        try:
            fcntl.flock(lock_fd, (fcntl.LOCK_SH if opts.check_mode else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise fail("Another Engram pack is running in %s on %s (the directory is locked): wait for it (see "
                           "the *.progress.json files there) and run again." % (opts.dest, opts.host)) from None
            raise
        return _pack_locked(opts, sources, result, fail)
    finally:
        os.close(lock_fd)


def _pack_locked(opts: PackOptions, sources: Dict[int, LayerSource], result: dict, fail) -> dict:
    try:
        plans = [plan_shard(opts, sources[layer]) for layer in opts.layers]
    except PackError as exc:
        raise fail(exc.msg) from None
    records = [_record(plan, opts) for plan in plans]
    if opts.check_mode:  # check mode predicts: every shard it would write ends valid
        for plan, record in zip(plans, records):
            if plan.action not in ("skip", "refuse"):
                record["state_after"] = STATE_VALID
    result["shards"] = records
    result["required_bytes"] = sum(plan.required_bytes for plan in plans)
    result["available_bytes"] = available_bytes(opts.dest)
    _set_diff(result, plans, records)
    refused = [plan for plan in plans if plan.action == "refuse"]
    if refused:
        raise fail("; ".join("%s on %s exists but is invalid: %s" % (p.path, opts.host, p.reason_before)
                             for p in refused)
                   + ". An invalid shard is never overwritten silently: move it aside, or set replace_invalid: true "
                     "(--replace-invalid) to repack it.")
    work = [plan for plan in plans if plan.action != "skip"]
    required, available = result["required_bytes"], result["available_bytes"]
    if work:
        problem = dest_writable_problem(opts.dest)
        if problem:
            raise fail("Cannot write Engram shards to %s on %s: %s." % (opts.dest, opts.host, problem))
        if required + opts.margin_bytes > available:
            short = required + opts.margin_bytes - available
            raise fail("Not enough free space on %s for rank %d of tp %d's Engram shards in %s: %s still to write "
                       "+ margin %s > %s available; free at least %s there (e.g. stale shards of another tp) or "
                       "lower margin_bytes." % (opts.host, opts.rank, opts.tp, opts.dest, fmt_bytes(required),
                                                fmt_bytes(opts.margin_bytes), fmt_bytes(available), fmt_bytes(short)))
    result["changed"] = bool(work)
    if opts.check_mode or not work:
        result["msg"] = _message(plans, opts, done=not opts.check_mode)
        return result
    if opts.nice:
        result["priority"] = lower_priority()
    for plan, record in zip(plans, records):
        if plan.action == "skip":
            continue
        try:
            pack_shard(plan, sources[plan.layer], opts, record)
        except PackError as exc:
            _set_diff(result, plans, records)
            raise fail(exc.msg) from None
        except OSError as exc:
            if not os.path.lexists(plan.partial_path):
                record["state_after"], record["partial_rows"] = STATE_ABSENT, 0
            _set_diff(result, plans, records)
            result["available_bytes_after"] = available_bytes(opts.dest)
            if exc.errno == errno.ENOSPC:
                raise fail("No space left on %s while writing %s (%s of rank %d's shards were to be written, %s "
                           "was free before, %s is free now): free space on that volume and run again; the "
                           "partial is kept and the pack resumes from it."
                           % (opts.host, plan.partial_path, fmt_bytes(required), opts.rank, fmt_bytes(available),
                              fmt_bytes(result["available_bytes_after"]))) from None
            raise fail("I/O error on %s while packing %s: %s (%s). The partial is kept; fix the cause and run "
                       "again." % (opts.host, plan.partial_path, exc.strerror or exc,
                                   getattr(exc, "filename", None) or "")) from None
    result["available_bytes_after"] = available_bytes(opts.dest)
    _set_diff(result, plans, records)
    result["msg"] = _message(plans, opts, done=True)
    return result


def _message(plans: List[ShardPlan], opts: PackOptions, done: bool) -> str:
    work = [p for p in plans if p.action != "skip"]
    if not work:
        return "All %d Engram shards of rank %d of tp %d are valid in %s." % (len(plans), opts.rank, opts.tp,
                                                                               opts.dest)
    verb = "Packed" if done else "Would pack"
    return "%s %s for rank %d of tp %d in %s." % (
        verb, ", ".join("layer %d (%s)" % (p.layer, p.action) for p in work), opts.rank, opts.tp, opts.dest)


# ---------------------------------------------------------------------------------------------- CLI

class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message):  # one JSON failure line and exit 1, like every other failure
        print(json.dumps({"failed": True, "changed": False, "msg": "Bad arguments: %s" % message}))
        sys.exit(1)


def _layers(text: str) -> List[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("layers must be comma separated integers, e.g. 1,14") from None


def main(argv: Optional[List[str]] = None) -> int:
    parser = _ArgumentParser(description="Pack one rank's Engram shards (docs/reference.md section 3).")
    parser.add_argument("--checkpoint", required=True, help="directory holding model.safetensors.index.json")
    parser.add_argument("--dest", required=True, help="Engram directory (mounted at /engram by the engine)")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--tp", type=int, required=True)
    parser.add_argument("--layers", type=_layers, default=list(DEFAULT_LAYERS))
    parser.add_argument("--margin-bytes", type=int, default=DEFAULT_MARGIN_BYTES)
    parser.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS)
    parser.add_argument("--verify", choices=VERIFY_MODES, default="sample")
    parser.add_argument("--no-resume", dest="resume", action="store_false")
    parser.add_argument("--replace-invalid", action="store_true")
    parser.add_argument("--nice", action="store_true", help="lowest CPU priority and best-effort/7 IO priority")
    parser.add_argument("--check", action="store_true", help="plan and check only; write nothing")
    parser.add_argument("--host-label", default=None, help="host name for messages (default: this hostname)")
    parser.add_argument("--sync", choices=("range", "fdatasync"), default="range", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="print only the JSON result line")
    args = parser.parse_args(argv)
    opts = PackOptions(checkpoint=args.checkpoint, dest=args.dest, rank=args.rank, tp=args.tp, layers=args.layers,
                       margin_bytes=args.margin_bytes, chunk_rows=args.chunk_rows, verify=args.verify,
                       resume=args.resume, nice=args.nice, replace_invalid=args.replace_invalid,
                       check_mode=args.check, host=args.host_label or socket.gethostname(), sync=args.sync)
    try:
        result = pack(opts)
        result["failed"] = False
        code = 0
    except PackError as exc:
        result = dict(exc.result)
        result.update(failed=True, msg=exc.msg)
        code = 1
    except Exception as exc:  # the caller parses one JSON line whatever happens
        result = {"failed": True, "changed": False, "msg": "Unexpected packer error on %s: %s: %s"
                  % (opts.host, type(exc).__name__, exc)}
        code = 1
    if not args.json:
        for line in result.get("summary", []):
            print(line)
        print(result.get("msg", ""))
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
