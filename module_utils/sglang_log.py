# -*- coding: utf-8 -*-
# Over 600 lines on purpose: one streaming state machine (BootLogParser) whose block reader and fact handlers
# share its state; the line patterns live in sglang_log_lines.py, the module glue in sglang_log_module.py.
"""Parse an SGLang / DSV41 engine boot log into facts (docs/reference.md sections 2, 3, 4, 7).

Plain Python, standard library only: it runs on the fleet's hosts inside the ``boot_log_info`` module (and its alias ``boot_log_facts``)
and in the controller's unit tests.

How the log is read
-------------------
The log is read in 1 MiB blocks of bytes and never decoded as a whole. A serving log is almost all
``Decode batch`` lines, periodic ``Engram layer=N lookups=...`` lines and per-request lines (``Prefill batch``,
uvicorn's ``"POST ... HTTP/1.1" 200``) that carry no fact: "noise". For each block the parser counts
newlines and the noise tokens in C (``bytes.count``); when every line of the block is noise (and no requested
marker can occur in it) the block is accounted for without a Python loop: the counts advance, and only
the block's last ``Decode batch`` line and its latest periodic Engram line per (rank, layer) (found
backwards with ``rfind``) are kept. A block that holds anything else is cut into 16 KiB sub-blocks that
get the same test; a sub-block that still fails is split into lines and every line goes through the full
line parser, so boot lines, errors and markers are never skipped. Only parsed lines are decoded (UTF-8,
``errors='replace'``).

Line hygiene: ANSI colour codes are removed; a trailing CR is dropped (CRLF logs); the prefixes docker
(``2026-11-29T10:01:02.123456789Z``), SGLang (``[2026-11-29 10:01:02 TP0]``, ``[2026-11-29 10:01:02]``),
``(rank=1)`` and ``name | `` (compose) are stripped, in any combination, and the TP rank they carry is
kept for the line. A last line without a newline is parsed like any other (``truncated_last_line``).

Launches ("boots")
------------------
A log may hold several launches (``docker restart`` appends to the same container log; so does the recipe's
``logs/dsv41.log``); the LAST one counts and every fact is taken from it (line numbers stay absolute);
``launches`` lists each. A launch starts at (docs/reference.md section 7a)

1. the image launcher's first lines (``DSV41 MXFP8 dense linears routed ...``, ``DSV41 TP pad installed``,
   ``SKIP_PREPARE=...``, without a prefix): one opens a launch unless the current one holds nothing but
   launcher lines;
2. ``server_args={...}`` or ``server_args=ServerArgs(...)``: it joins a launch that holds only launcher
   lines so far, or (a log interleaving several ranks) a launch that has not ended and has no server_args
   of that ``node_rank`` yet; otherwise it opens a new launch. Its ``node_rank``, ``tp_size``, ``ep_size``
   and ``nnodes`` are the launch's rank, tp, ep and node count; without them the rank is that of the
   ``[... TP<r> EP<e>]`` prefixes when only one rank prints;
3. for logs of the old testbed simulator, its start lines ``dsv41 boot: rank=R tp=T`` / ``Starting DSV41
   rank R`` (no real log has them; kept so that saved logs of older runs still parse);
4. the first ``DSV4 memory calculation`` line after the current launch ended, unless it is tagged with a
   rank that has not printed its memory calculation in this launch yet (a log cut before its launch lines).

Everything from a launch's start to the next launch belongs to it: the Engram and draft lines of a restarted
launch come before its memory calculation and are its own.

Lines before the first start line form a boot of their own only when they hold something recognised.

A launch "ended" once it printed ``Ready: API on port`` (head), ``Dummy health check server started``
(worker) or an error (see ``ERROR_KINDS``). Quantities printed in ``GB`` are also reported as integer
``*_bytes`` (SGLang's GB is 2**30 bytes) next to the printed ``*_text``.

Known limits (documented, deliberate): a line containing two noise tokens (or one twice) can hide one
other line of its block from the fast path; in noise blocks a (rank, layer) key that was never seen
before is only discovered within the last periodic lines of a 1 MiB block (keys normally first appear at
boot, where every line is parsed).
"""
from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass, field
from typing import BinaryIO, Iterable, Optional

try:  # as an Ansible module_utils (AnsiballZ bundles it)
    from ansible.module_utils.sglang_log_lines import (  # noqa: F401  (re-exported)
        _ANSI_B, _RANK_TAG_B, MAX_NUL_FRACTION, LogNotText, check_text, split_prefix, split_prefix_ep)
except ImportError:  # plain Python with module_utils on sys.path (benchmarks/boot_log_bench.py)
    from sglang_log_lines import (  # type: ignore[no-redef]  # noqa: F401
        _ANSI_B, _RANK_TAG_B, MAX_NUL_FRACTION, LogNotText, check_text, split_prefix, split_prefix_ep)

BLOCK_SIZE = 1 << 20
TEXT_PROBE = 64 * 1024
MAX_TEXT = 500
PERIODIC_SCAN_LIMIT = 512

DECODE_TOKEN = b"Decode batch"
PERIODIC_TOKEN = b" lookups="
# Longer tokens that only these lines carry make ``bytes.count`` skip faster (about 30% here). A line
# that carries the classifying token but not the fast one simply sends its block to the line parser.
DECODE_FAST = b"Decode batch, #running-req"
PERIODIC_FAST = b" hit_rate="
# Frequent lines that carry no fact (one per request): counted like noise, never parsed.
IGNORED_TOKENS = (b"Prefill batch", b'HTTP/1.1" ')
SUB_BLOCK = 16 * 1024

ERROR_KINDS = (
    "nv_err_no_memory",
    "engram_retrieval_failed",
    "traceback",
    "shard_range_mismatch",
    "shard_truncated",
    "container_exit",
    "nccl_timeout",
    "shard_invalid",
)


# A launch (docs/reference.md section 7a) starts with the image launcher's lines, then ``server_args=``.
LAUNCHER_START = ("dense linears routed", "TP pad installed", "SKIP_PREPARE=")
_SERVER_ARGS = re.compile(r"\bserver_args\s*=\s*(?P<dc>ServerArgs\()?")
_SA_DICT_ITEM = re.compile(r"'(?P<key>\w+)':\s*(?P<val>'(?:[^'\\]|\\.)*'|\"[^\"]*\"|[^,{}\[\]()]+)")
_SA_DC_ITEM = re.compile(r"(?<![\w.])(?P<key>[a-z_]\w*)=(?P<val>'(?:[^'\\]|\\.)*'|\"[^\"]*\"|[^,{}\[\]()]+)")
_PYWARNING = re.compile(r":\d+: (?P<kind>[A-Z]\w*Warning): ")
_LOAD_END = re.compile(r"Load weight end\.(?P<rest>.*)")
_ELAPSED = re.compile(r"(?:\belapsed\s*=\s*|Time elapsed:\s*)(-?\d+(?:\.\d+)?)\s*s")
_QTY = re.compile(r"\b(?P<key>avail mem|mem usage)\s*=\s*(?P<num>-?\d+(?:\.\d+)?)\s*(?P<unit>GB|GiB|MB|MiB)")
_CAPTURE_END = re.compile(r"Capture (?P<what>.*?)\s*(?:CUDA|cuda) graph end")
_POOL_SIZES = re.compile(r"DSV4 pool sizes:\s*(?P<rest>.*)")
_INT_PAIR = re.compile(r"(\w+)=(-?\d+)\b")
_STARTUP = re.compile(r"Engine startup timings \(s\):\s*(?P<rest>.*)")
_NESTED = re.compile(r"(\w+)=\{([^}]*)\}")
_FLOAT_PAIR = re.compile(r"(\w+)=(-?\d+(?:\.\d+)?)")
_DUMMY_HEALTH = re.compile(r"Dummy health check server started.*?\bat\s+(?P<addr>\S+)")
_WARMUP = re.compile(r"Warm-up done in\s*(?P<s>\d+(?:\.\d+)?)\s*s")
_TP_PAD = re.compile(r"TP pad installed \(tp=(\d+)\)")
_DENSE_BACKEND = re.compile(r"routed to FlashInfer backend '([^']+)'")
# SGLang prints GPU memory as "GB" but computes it in GiB (free bytes / 2**30); the DSV4 memory calculation
# agrees: available_bytes - swa_fixed = bytes_per_full_token * full_token / 2**30 (docs/reference.md section 7a).
UNIT_BYTES = {"GB": 1 << 30, "GiB": 1 << 30, "MB": 1 << 20, "MiB": 1 << 20}
_START = re.compile(r"(?:Starting DSV41 rank|dsv41 boot: rank)\s*=?\s*(\d+)?(.*)")
_START_TP = re.compile(r"\btp\s*[= ]\s*(\d+)|\bof\s+(\d+)\b|^/(\d+)", re.I)
_KV_PAIR = re.compile(r"([A-Za-z_][\w]*)\s*=\s*(-?\d+(?:\.\d+)?)\s*(GB|GiB|MB|MiB)?")
_CAPTURE = re.compile(r"Capture (?P<what>.*?)\s*(?:CUDA|cuda) graph begin")
_BS_LIST = re.compile(r"\bbs\s*=\s*\[([^\]]*)\]?")
_AVAIL_MEM = re.compile(r"avail mem\s*=\s*(-?\d+(?:\.\d+)?)\s*(GB|GiB)?")
_ENGRAM_BOOT = re.compile(
    r"(?P<mode>\w+) nvme Engram layer=(?P<layer>\d+) rank=(?P<rank>\d+)"
    r"(?: rows=\[(?P<lo>\d+),\s*(?P<hi>\d+)\))?"
    r"(?: cache=(?P<cache>[\d.]+)GiB)?"
    r"(?: \((?P<slots>\d+) slots?, (?P<ways>\d+)-way, (?P<pct>[\d.]+)% of owned rows\))?"
    r"(?: scales=(?P<scales>[\d.]+)GiB)?"
    r"(?: io_threads=(?P<io>\d+))?"
    r"(?: packed=(?P<packed>True|False))?"
)
_PERIODIC_LAYER_B = re.compile(rb"Engram layer=(\d+) lookups=")
_PERIODIC = re.compile(
    r"Engram layer=(?P<layer>\d+) lookups=(?P<lookups>\d+)"
    r"(?: hit_rate=(?P<hit>[\d.]+)%)?"
    r"(?: reads=(?P<reads>\d+))?"
    r"(?: cache=(?P<cache>[\d.]+)GiB(?:\((?P<ways>\d+)-way\))?)?"
    r"(?: scales=(?P<scales>[\d.]+)GiB)?"
    r"(?: threads=(?P<threads>\d+))?"
    r"(?: packed=(?P<packed>True|False))?"
)
_RUNNING_AUTOTUNE = re.compile(r"Running FlashInfer autotune with cache:\s*(\S+)")
_KEEP_REUSED = re.compile(r"\[autotune_keep\] reused\s+(\S+)")
_PATHISH = re.compile(r"(\S*/\S+)")
_READY = re.compile(
    r"Ready: API on port (?P<port>\d+)(?: \(rank (?P<rank>\d+)\))?"
    r"(?:\.\s*Key is in (?P<key>\S+?)\.?\s*$|,\s*no API key)?"
)
_FRESH = re.compile(r"Fresh inference (?P<verdict>passed|failed)\b:?\s*(?P<rest>.*?)\s*$")
_FRESH_ANSWER = re.compile(r"^(?P<expr>.*?)\s*(?:=|\banswered\b)\s*(?P<answer>.*)$")
_CONTAINER_EXIT = re.compile(
    r"exited with (?:code|status)\s*(-?\d+)"
    r"|\bcontainer\b.*?\b(?:exited|died|is dead)\b(?:.*?\((-?\d+)\))?"
    r"|\bExited \((-?\d+)\)"
    r"|\bexit(?:ed)? code\s*[=:]?\s*(-?\d+)",
    re.I,
)
_EXCEPTION = re.compile(
    r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Failure|Fault|Abort)\b"
    r"|^[A-Za-z_][\w.]*: "
)
_FIELD_NAME = re.compile(r"[^a-z0-9]+")


@dataclass
class Marker:
    """One requested marker: ``re:<regex>`` is a regular expression, anything else a plain substring."""

    spec: str
    regex: Optional["re.Pattern[str]"] = None
    literal: Optional[str] = None
    literal_b: Optional[bytes] = None
    regex_b: Optional["re.Pattern[bytes]"] = None
    prefilter: bool = True

    @classmethod
    def parse(cls, spec: str) -> "Marker":
        if spec.startswith("re:"):
            pattern = spec[3:]
            try:
                rx = re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"marker {spec!r} is not a valid regular expression: {exc}") from exc
            m = cls(spec=spec, regex=rx)
            # A bytes twin lets the fast path skip blocks that cannot match; anchors would not mean the
            # same thing on a raw block (prefixes, CR), so anchored patterns always take the slow path.
            if re.search(r"\^|\$|\\A|\\Z|\\b|\\B", pattern):
                m.prefilter = False
            else:
                try:
                    m.regex_b = re.compile(pattern.encode("utf-8"))
                except re.error:
                    m.prefilter = False
            return m
        if not spec:
            raise ValueError("an empty marker matches every line; give a substring or re:<regex>")
        return cls(spec=spec, literal=spec, literal_b=spec.encode("utf-8"))

    def matches(self, message: str) -> bool:
        if self.regex is not None:
            return self.regex.search(message) is not None
        return self.literal in message  # type: ignore[operator]


@dataclass
class _Boot:
    index: int
    start_line: int
    start_text: Optional[str] = None
    explicit: bool = False
    rank: Optional[int] = None
    tp: Optional[int] = None
    ep: Optional[int] = None
    nnodes: Optional[int] = None
    rank_source: Optional[str] = None
    ranks_started: set = field(default_factory=set)
    prefix_ranks: dict = field(default_factory=dict)  # rank -> ep seen in "[... TP<r> EP<e>]"
    server_args: Optional[dict] = None
    server_args_ranks: set = field(default_factory=set)
    launcher: dict = field(default_factory=dict)
    weights: dict = field(default_factory=dict)     # rank key -> [load entries]
    startup: Optional[dict] = None
    worker_up: Optional[dict] = None
    warnings: dict = field(default_factory=dict)
    mem_calc_ranks: set = field(default_factory=set)
    evidence: bool = False
    ended: bool = False
    end_line: Optional[int] = None
    kv: dict = field(default_factory=dict)          # rank key -> dict
    captures: list = field(default_factory=list)
    draft: dict = field(default_factory=dict)       # rank key -> dict
    engram: list = field(default_factory=list)
    periodic: dict = field(default_factory=dict)    # (rank, layer) -> (lineno, raw)
    periodic_count: int = 0
    disagreements: list = field(default_factory=list)
    runs: list = field(default_factory=list)
    completed: list = field(default_factory=list)
    reused: list = field(default_factory=list)
    tuned: list = field(default_factory=list)
    keep_armed: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    errors_total: int = 0
    pending: list = field(default_factory=list)     # error entries of tracebacks still open
    server_fired_up: Optional[int] = None
    fresh: Optional[dict] = None
    ready: Optional[dict] = None
    ready_after_error: bool = False
    error_after_ready: bool = False
    decode_count: int = 0
    decode_last: Optional[tuple] = None
    markers: dict = field(default_factory=dict)     # spec -> [first_line, text, count]


def _num(text: str):
    try:
        if "." in text or "e" in text.lower():
            return float(text)
        return int(text)
    except ValueError:
        return text


def _value(text: str):
    text = text.strip()
    if text in ("True", "true"):
        return True
    if text in ("False", "false"):
        return False
    if text in ("None", "none"):
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "..."


_AVAIL_MEM_UNIT = re.compile(r"avail mem\s*=\s*(-?\d+(?:\.\d+)?)\s*(GB|GiB|MB|MiB)")


def _quantity(entry: dict, name: str, num: str, unit: str, number: bool = True) -> None:
    """``<name>_text`` (as printed), ``<name>_bytes`` (an integer) and, with ``number``, ``<name>_gb``."""
    if name.endswith("_gb"):
        name = name[:-3]
    entry[f"{name}_text"] = f"{num} {unit}"
    entry[f"{name}_bytes"] = int(round(float(num) * UNIT_BYTES[unit]))
    if number:
        entry[f"{name}_gb"] = float(num)


def _rank_key(rank: Optional[int]) -> str:
    return "unknown" if rank is None else str(rank)


class BootLogParser:
    """Streaming parser; feed it with ``parse_stream`` (or ``parse_bytes``/``parse_file``)."""

    def __init__(self, markers: Iterable[str] = (), max_errors: int = 100):
        self.markers = [Marker.parse(m) for m in (markers or [])]
        self.max_errors = max_errors
        self.lineno = 0
        self.nbytes = 0
        self.truncated_last_line = False
        self.history: list = []
        self.boot = _Boot(index=1, start_line=1)
        self.fast_blocks = 0
        self.slow_blocks = 0
        self._split_next = False

    # ------------------------------------------------------------------ blocks
    def feed_block(self, data: bytes, start: int, end: int) -> None:
        """Account for ``data[start:end]``: whole lines, the last one ending with a newline.

        A block whose lines are all noise (decode, periodic Engram, ignored) is accounted for from counts.
        A block that is not is cut into 16 KiB sub-blocks that get the same test, so one odd line costs the
        line parser 16 KiB, not 1 MiB; only failing sub-blocks go through the line parser. After a block
        that needed the line parser the next block is cut up straight away (sparse odd lines come in runs)."""
        if not self._split_next and self._try_fast(data, start, end, discover=True):
            return
        slow = False
        pos = start
        while pos < end:
            cut = data.rfind(b"\n", pos, min(pos + SUB_BLOCK, end)) + 1
            if cut <= pos:  # one line longer than a sub-block
                cut = data.find(b"\n", pos + SUB_BLOCK - 1, end) + 1
            if not self._try_fast(data, pos, cut, discover=False):
                slow = True
                self.slow_blocks += 1
                for raw in data[pos:cut - 1].split(b"\n"):
                    self.feed_line(raw)
            pos = cut
        self._split_next = slow

    def _try_fast(self, data: bytes, start: int, end: int, discover: bool) -> bool:
        nlines = data.count(b"\n", start, end)
        ndec = data.count(DECODE_FAST, start, end)
        nper = 0
        known = ndec
        if known < nlines:
            nper = data.count(PERIODIC_FAST, start, end)
            known += nper
            for token in IGNORED_TOKENS:
                if known >= nlines:
                    break
                known += data.count(token, start, end)
        if known != nlines or self._markers_possible(data, start, end):
            return False
        self._fast_block(data, start, end, nlines, ndec, nper, discover)
        self.fast_blocks += 1
        return True

    def _markers_possible(self, data: bytes, start: int, end: int) -> bool:
        if not self.markers:
            return False
        if data.find(b"\x1b", start, end) >= 0:
            return True
        for m in self.markers:
            if m.literal_b is not None:
                if data.find(m.literal_b, start, end) >= 0:
                    return True
            elif m.prefilter and m.regex_b is not None:
                if m.regex_b.search(data, start, end):
                    return True
            else:
                return True
        return False

    def _fast_block(self, data: bytes, start: int, end: int, nlines: int, ndec: int, nper: int,
                    discover: bool = True) -> None:
        """Advance counts; keep the block's last decode line and its latest periodic line per (rank, layer).

        The periodic scan runs backwards until every (rank, layer) seen so far has its latest line; a full
        block (``discover``) also looks a few lines further for keys not seen yet (bounded by
        PERIODIC_SCAN_LIMIT), a sub-block does not."""
        boot = self.boot
        base = self.lineno
        if ndec:
            p = data.rfind(DECODE_FAST, start, end)
            ls = max(data.rfind(b"\n", start, p) + 1, start)
            le = data.find(b"\n", p, end)
            lineno = base + nlines - data.count(b"\n", ls, end) + 1
            boot.decode_count += ndec
            boot.decode_last = (lineno, data[ls:le])
            boot.evidence = True
        if nper:
            boot.periodic_count += nper
            boot.evidence = True
            known = set(boot.periodic)
            seen: set = set()
            pos = end
            after = 0  # newlines between the current line start and the block end
            inspected = 0
            while inspected < nper and inspected < PERIODIC_SCAN_LIMIT:
                p = data.rfind(PERIODIC_FAST, start, pos)
                if p < 0:
                    break
                ls = max(data.rfind(b"\n", start, p) + 1, start)
                le = data.find(b"\n", p, end)
                after += data.count(b"\n", ls, pos)
                inspected += 1
                key = self._periodic_key(data[ls:le])
                if key is not None and key not in seen:
                    seen.add(key)
                    boot.periodic[key] = (base + nlines - after + 1, data[ls:le])
                pos = ls
                if known <= seen and ((known and not discover) or inspected >= 2 * len(seen) + 8):
                    break
        self.lineno = base + nlines

    # ------------------------------------------------------------------ lines
    def feed_line(self, raw: bytes) -> None:
        self.lineno += 1
        if b"\x1b" in raw:
            raw = _ANSI_B.sub(b"", raw)
        if DECODE_TOKEN in raw:
            boot = self.boot
            boot.decode_count += 1
            boot.decode_last = (self.lineno, raw)
            boot.evidence = True
            if self.markers:
                self._match_markers(raw)
            return
        if PERIODIC_TOKEN in raw:
            key = self._periodic_key(raw)
            if key is not None:
                boot = self.boot
                boot.periodic_count += 1
                boot.periodic[key] = (self.lineno, raw)
                boot.evidence = True
                if self.markers:
                    self._match_markers(raw)
                return
        for token in IGNORED_TOKENS:
            if token in raw:
                if self.markers:
                    self._match_markers(raw)
                return
        self._rare(raw)

    def _periodic_key(self, raw: bytes) -> Optional[tuple]:
        m = _PERIODIC_LAYER_B.search(raw)
        if m is None:
            return None
        t = _RANK_TAG_B.search(raw, 0, m.start())
        rank = int(t.group(1) or t.group(2)) if t else self.boot.rank
        return (rank, int(m.group(1)))

    def _match_markers(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        _, msg = split_prefix(text)
        self._markers_on(msg, text)

    def _markers_on(self, msg: str, text: str) -> None:
        table = self.boot.markers
        for m in self.markers:
            if m.matches(msg):
                hit = table.get(m.spec)
                if hit is None:
                    table[m.spec] = [self.lineno, _clip(text), 1]
                else:
                    hit[2] += 1

    def _rare(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace")
        if text.endswith("\r"):
            text = text.rstrip("\r")
        tag, ep, msg = split_prefix_ep(text)
        n = self.lineno

        if tag is None and any(t in msg for t in LAUNCHER_START):
            self._launcher_start(n, text)
        elif "server_args=" in msg:
            self._server_args(n, msg, text)
        elif "Starting DSV41 rank" in msg or "dsv41 boot: rank" in msg:
            self._start_line(n, tag, msg, text)
        elif "DSV4 memory calculation" in msg:
            self._memory_calc_boundary(n, tag, text)

        boot = self.boot
        if tag is not None and tag not in boot.prefix_ranks:
            boot.prefix_ranks[tag] = ep
            if boot.rank is None and boot.rank_source is None and len(boot.prefix_ranks) == 1:
                boot.rank, boot.rank_source = tag, "prefix"
            elif boot.rank_source == "prefix":
                boot.rank = None  # several ranks' prefixes in one log: no single default rank
        rank = tag if tag is not None else boot.rank
        stripped = msg.strip()

        if boot.pending and stripped:
            self._traceback_line(n, tag, msg, stripped)

        if "DSV4 memory calculation" in msg or "max_total_num_tokens=" in msg:
            self._kv(rank, msg)
        elif "DSV4 pool sizes:" in msg:
            self._pool_sizes(n, rank, msg)
        elif "Memory pool end" in msg:
            self._pool_end(rank, msg)
        elif "Load weight begin" in msg:
            self._load_begin(n, rank, msg)
        elif "Load weight end" in msg:
            self._load_end(n, rank, msg)
        elif "Engine startup timings" in msg:
            self._startup(n, msg)
        elif "Dummy health check server started" in msg:
            m = _DUMMY_HEALTH.search(msg)
            boot.worker_up = {"up": True, "line": n, "address": m.group("addr") if m else None, "text": _clip(text)}
            boot.ended = True
            boot.evidence = True
        elif tag is None:
            self._launcher_line(n, msg)
        if "graph begin" in msg:
            self._capture(n, rank, msg)
        elif "graph end" in msg:
            self._capture_end(n, rank, msg)
        if "Warning" in msg or "invalid scales" in msg:
            self._warning(msg)
        if "draft runner" in msg:
            self._draft(n, rank, msg)
        if "nvme Engram layer=" in msg:
            self._engram(n, rank, msg, text)
        elif "Engram layer=" in msg and " lookups=" in msg:
            key = self._periodic_key(raw)
            if key is not None:
                boot.periodic_count += 1
                boot.periodic[key] = (n, raw)
                boot.evidence = True
        if "FlashInfer autotune" in msg or "autotune_keep" in msg or "tuned and saved" in msg:
            self._autotune(n, rank, msg)
        if "fired up and ready to roll" in msg:
            boot.server_fired_up = n
            boot.evidence = True
        if "Fresh inference" in msg:
            self._fresh(n, msg)
        if "Ready: API on port" in msg:
            self._ready(n, rank, msg, text)
        self._errors(n, rank, msg, text)
        if self.markers:
            self._markers_on(msg, text)

    # ------------------------------------------------------------------ boots
    def _new_boot(self, n: int, text: Optional[str], explicit: bool) -> None:
        old = self.boot
        old.pending.clear()
        if old.evidence or old.explicit:
            old.end_line = n - 1
            self.history.append(old)
            index = old.index + 1
        else:
            index = old.index
        self.boot = _Boot(index=index, start_line=n, start_text=_clip(text) if text else None, explicit=explicit)

    def _start_line(self, n: int, tag: Optional[int], msg: str, text: str) -> None:
        m = _START.search(msg)
        rank = int(m.group(1)) if m and m.group(1) else tag
        tp = None
        if m:
            t = _START_TP.search(m.group(2) or "")
            if t:
                tp = int(t.group(1) or t.group(2) or t.group(3))
        boot = self.boot
        joins = boot.explicit and not boot.ended and (
            not boot.evidence  # nothing but start lines so far (e.g. "dsv41 boot:" then "Starting DSV41")
            or (rank is not None and boot.ranks_started and rank not in boot.ranks_started)
        )
        if not joins:
            self._new_boot(n, text, explicit=True)
            boot = self.boot
            boot.rank, boot.tp = rank, tp
        else:
            if rank is not None and boot.ranks_started and rank not in boot.ranks_started:
                boot.rank = None  # several ranks in one log: no single default rank
            elif boot.rank is None and not boot.ranks_started:
                boot.rank = rank
            if tp is not None:
                boot.tp = tp
        if rank is not None:
            boot.ranks_started.add(rank)

    def _launcher_start(self, n: int, text: str) -> None:
        """A launcher line opens a launch unless the current one holds nothing but launcher lines."""
        boot = self.boot
        if boot.server_args is not None or boot.evidence or (boot.explicit and not boot.launcher):
            self._new_boot(n, text, explicit=True)
        elif not boot.explicit:
            boot.start_line, boot.start_text = n, _clip(text)
        self.boot.explicit = True
        self._launcher_line(n, text)

    def _server_args(self, n: int, msg: str, text: str) -> None:
        m = _SERVER_ARGS.search(msg)
        body = msg[m.end():] if m else msg
        item = _SA_DC_ITEM if m and m.group("dc") else _SA_DICT_ITEM
        fields = {}
        for g in item.finditer(body):
            val = g.group("val").strip()
            fields[g.group("key")] = val[1:-1] if val[:1] in "'\"" and len(val) > 1 else _value(val)
        node_rank = fields.get("node_rank") if isinstance(fields.get("node_rank"), int) else None
        boot = self.boot
        # Joins the current launch when that one printed only launcher lines so far, or (a log that
        # interleaves several ranks) when another rank's server_args follows before the launch ended.
        joins = boot.server_args is None and not boot.evidence or (
            boot.server_args is not None and not boot.ended and node_rank is not None
            and node_rank not in boot.server_args_ranks)
        if not joins:
            self._new_boot(n, text, explicit=True)
            boot = self.boot
        elif not boot.explicit:
            boot.start_line, boot.start_text = n, _clip(text)
        boot.explicit = True
        boot.evidence = True
        if boot.server_args is None:
            boot.server_args = {"line": n, "form": "dataclass" if m and m.group("dc") else "dict",
                                "fields": fields, "text": _clip(text)}
        if node_rank is not None:
            boot.server_args_ranks.add(node_rank)
            boot.ranks_started.add(node_rank)
        if len(boot.server_args_ranks) > 1:
            boot.rank = None
        elif node_rank is not None:
            boot.rank, boot.rank_source = node_rank, "server_args"
        for key, attr in (("tp_size", "tp"), ("ep_size", "ep"), ("nnodes", "nnodes")):
            if isinstance(fields.get(key), int):
                setattr(boot, attr, fields[key])

    def _memory_calc_boundary(self, n: int, tag: Optional[int], text: str) -> None:
        boot = self.boot
        if boot.ended and (tag is None or tag in boot.mem_calc_ranks or not boot.mem_calc_ranks):
            self._new_boot(n, text, explicit=False)
            self.boot.evidence = True
        self.boot.mem_calc_ranks.add(tag)

    # ------------------------------------------------------------------ facts
    def _kv(self, rank: Optional[int], msg: str) -> None:
        entry = self.boot.kv.setdefault(_rank_key(rank), {})
        for key, val, unit in _KV_PAIR.findall(msg):
            base = key
            if key == "available_gpu_mem":
                key = "available_gpu_mem_gb"
            entry[key] = _num(val)
            if unit:
                entry.setdefault("units", {})[key] = unit
                _quantity(entry, base, val, unit, number=False)
            if key == "max_total_num_tokens":
                entry["pool_tokens"] = entry[key]
        self.boot.evidence = True

    def _pool_sizes(self, n: int, rank: Optional[int], msg: str) -> None:
        """``DSV4 pool sizes: full=...``: printed before and after the --max-total-tokens cap; the last is the pool."""
        m = _POOL_SIZES.search(msg)
        sizes = {"line": n}
        sizes.update({k: int(v) for k, v in _INT_PAIR.findall(m.group("rest") if m else msg)})
        entry = self.boot.kv.setdefault(_rank_key(rank), {})
        entry.setdefault("pool_sizes", []).append(sizes)
        if "full" in sizes:
            entry["pool_full_tokens"] = sizes["full"]
            if "max_total_num_tokens" not in entry:
                entry["pool_tokens"] = sizes["full"]
        self.boot.evidence = True

    def _pool_end(self, rank: Optional[int], msg: str) -> None:
        m = _AVAIL_MEM_UNIT.search(msg)
        if m:
            entry = self.boot.kv.setdefault(_rank_key(rank), {})
            _quantity(entry, "memory_pool_end_avail_mem", m.group(1), m.group(2))
        self.boot.evidence = True

    def _load_begin(self, n: int, rank: Optional[int], msg: str) -> None:
        loads = self.boot.weights.setdefault(_rank_key(rank), [])
        entry = {"rank": rank, "line": n, "end_line": None}
        m = _AVAIL_MEM_UNIT.search(msg)
        if m:
            _quantity(entry, "begin_avail_mem", m.group(1), m.group(2))
        loads.append(entry)
        self.boot.evidence = True

    def _load_end(self, n: int, rank: Optional[int], msg: str) -> None:
        loads = self.boot.weights.setdefault(_rank_key(rank), [])
        if not loads or loads[-1]["end_line"] is not None:
            loads.append({"rank": rank, "line": None, "end_line": None})
        entry = loads[-1]
        entry["end_line"] = n
        rest = _LOAD_END.search(msg).group("rest")
        for key, val in re.findall(r"\b(type|quant|dtype)\s*=\s*([^\s,]+)", rest):
            entry[key] = val
        e = _ELAPSED.search(rest)
        if e:
            entry["elapsed_s"] = float(e.group(1))
        for q in _QTY.finditer(rest):
            _quantity(entry, q.group("key").replace(" ", "_"), q.group("num"), q.group("unit"))
        self.boot.evidence = True

    def _capture_end(self, n: int, rank: Optional[int], msg: str) -> None:
        m = _CAPTURE_END.search(msg)
        if m is None:
            return
        what = m.group("what").strip() or "cuda"
        cap = next((c for c in reversed(self.boot.captures)
                    if c["rank"] == rank and c.get("end_line") is None and c["what"] == what), None)
        if cap is None:
            cap = {"line": None, "rank": rank, "what": what}
            self.boot.captures.append(cap)
        cap["end_line"] = n
        e = _ELAPSED.search(msg)
        if e:
            cap["elapsed_s"] = float(e.group(1))
        for q in _QTY.finditer(msg):
            key = "end_avail_mem" if q.group("key") == "avail mem" else "mem_usage"
            _quantity(cap, key, q.group("num"), q.group("unit"))
        self.boot.evidence = True

    def _startup(self, n: int, msg: str) -> None:
        rest = _STARTUP.search(msg).group("rest")
        out: dict = {"line": n}
        for name, inner in _NESTED.findall(rest):
            out[name] = {k: float(v) for k, v in _FLOAT_PAIR.findall(inner)}
        for name, val in _FLOAT_PAIR.findall(_NESTED.sub("", rest)):
            out[name] = float(val)
        self.boot.startup = out
        self.boot.evidence = True

    def _launcher_line(self, n: int, msg: str) -> None:
        """The image launcher's own lines (boot.py, adapters): no prefix (docs/reference.md section 7a)."""
        launcher = self.boot.launcher
        text = _clip(msg.strip())
        if "SKIP_PREPARE=" in msg:
            launcher["skip_prepare"] = "SKIP_PREPARE=1" in msg
        elif "TP pad installed" in msg:
            m = _TP_PAD.search(msg)
            launcher["tp_pad"] = int(m.group(1)) if m else True
        elif "dense linears routed" in msg:
            m = _DENSE_BACKEND.search(msg)
            launcher["dense_backend"] = m.group(1) if m else None
        elif "Batch output sanity check" in msg:
            launcher["sanity_check"] = {"line": n, "passed": "sanity check passed" in msg, "text": text}
            self.boot.evidence = True
        elif "Warm-up done in" in msg:
            m = _WARMUP.search(msg)
            launcher["warmup"] = {"line": n, "seconds": float(m.group("s")) if m else None, "text": text}
            self.boot.evidence = True
        else:
            return
        launcher.setdefault("lines", []).append({"line": n, "text": text})

    def _warning(self, msg: str) -> None:
        m = _PYWARNING.search(msg)
        if m:
            kind = m.group("kind")
        elif "invalid scales" in msg:
            kind = "invalid_scales"
        else:
            return
        self.boot.warnings[kind] = self.boot.warnings.get(kind, 0) + 1

    def _capture(self, n: int, rank: Optional[int], msg: str) -> None:
        m = _CAPTURE.search(msg)
        if m is None:
            return
        cap = {"line": n, "rank": rank, "what": m.group("what").strip() or "cuda"}
        for key, val in re.findall(r"\b(backend|num_tokens_per_req)\s*=\s*([\w.-]+)", msg):
            cap[key] = _value(val)
        bs = _BS_LIST.search(msg)
        if bs:
            cap["bs"] = [int(x) for x in re.findall(r"\d+", bs.group(1))]
        mem = _AVAIL_MEM.search(msg)
        if mem:
            cap["avail_mem_gb"] = float(mem.group(1))
        self.boot.captures.append(cap)
        self.boot.evidence = True

    def _draft(self, n: int, rank: Optional[int], msg: str) -> None:
        entry = {"line": n, "rank": rank}
        for key, val in re.findall(r"\b([A-Za-z_]\w*)\s*=\s*([^\s,]+)", msg):
            entry[key] = _value(val)
        self.boot.draft[_rank_key(rank)] = entry
        self.boot.evidence = True

    def _engram(self, n: int, rank: Optional[int], msg: str, text: str) -> None:
        m = _ENGRAM_BOOT.search(msg)
        if m is None:
            return
        g = m.groupdict()
        lo = int(g["lo"]) if g["lo"] is not None else None
        hi = int(g["hi"]) if g["hi"] is not None else None
        self.boot.engram.append({
            "line": n,
            "mode": g["mode"],
            "layer": int(g["layer"]),
            "rank": int(g["rank"]),
            "rows_lo": lo,
            "rows_hi": hi,
            "rows": (hi - lo) if lo is not None and hi is not None else None,
            "cache_gib": float(g["cache"]) if g["cache"] else None,
            "slots": int(g["slots"]) if g["slots"] else None,
            "ways": int(g["ways"]) if g["ways"] else None,
            "percent": float(g["pct"]) if g["pct"] else None,
            "scales_gib": float(g["scales"]) if g["scales"] else None,
            "io_threads": int(g["io"]) if g["io"] else None,
            "packed": None if g["packed"] is None else g["packed"] == "True",
            "text": _clip(text),
        })
        self.boot.evidence = True

    def _autotune(self, n: int, rank: Optional[int], msg: str) -> None:
        boot = self.boot
        boot.evidence = True
        if "per-rank caches disagree" in msg:
            boot.disagreements.append({"line": n, "rank": rank})
        m = _RUNNING_AUTOTUNE.search(msg)
        if m:
            boot.runs.append({"line": n, "rank": rank, "path": m.group(1)})
        if "FlashInfer autotune completed" in msg:
            boot.completed.append({"line": n, "rank": rank})
        if "[autotune_keep] armed" in msg:
            boot.keep_armed.append({"line": n, "rank": rank})
        m = _KEEP_REUSED.search(msg)
        if m:
            boot.reused.append({"line": n, "rank": rank, "path": m.group(1)})
        if "tuned and saved" in msg:
            tail = msg.split("tuned and saved", 1)[1]
            p = _PATHISH.search(tail) or _PATHISH.search(msg)
            boot.tuned.append({"line": n, "rank": rank, "path": p.group(1) if p else None})

    def _fresh(self, n: int, msg: str) -> None:
        m = _FRESH.search(msg)
        if m is None:
            return
        a = _FRESH_ANSWER.match(m.group("rest"))
        self.boot.fresh = {
            "line": n,
            "passed": m.group("verdict") == "passed",
            "expression": a.group("expr") if a else None,
            "answer": a.group("answer").strip("'\"") if a else None,
            "text": _clip(msg.strip()),
        }
        self.boot.evidence = True

    def _ready(self, n: int, rank: Optional[int], msg: str, text: str) -> None:
        m = _READY.search(msg)
        if m is None:
            return
        boot = self.boot
        boot.ready = {
            "line": n,
            "port": int(m.group("port")),
            "rank": int(m.group("rank")) if m.group("rank") else rank,
            "api_key": m.group("key"),
            "text": _clip(text),
        }
        if boot.errors_total:
            boot.ready_after_error = True
        boot.ended = True
        boot.evidence = True

    # ------------------------------------------------------------------ errors
    def _error(self, n: int, kind: str, rank: Optional[int], text: str, **extra) -> dict:
        boot = self.boot
        boot.errors_total += 1
        boot.ended = True
        boot.evidence = True
        if boot.ready is not None:
            boot.error_after_ready = True
        entry = {"line": n, "kind": kind, "rank": rank, "text": _clip(text)}
        entry.update(extra)
        if len(boot.errors) < self.max_errors:
            boot.errors.append(entry)
        return entry

    def _errors(self, n: int, rank: Optional[int], msg: str, text: str) -> None:
        if "NV_ERR_NO_MEMORY" in msg:
            self._error(n, "nv_err_no_memory", rank, text)
        if "Engram retrieval failed" in msg:
            self._error(n, "engram_retrieval_failed", rank, text)
        if "does not match this rank's range" in msg:
            self._error(n, "shard_range_mismatch", rank, text)
        truncated = "is truncated" in msg and ("ngram" in msg or ".bin" in msg or "shard" in msg)
        if truncated:
            self._error(n, "shard_truncated", rank, text)
        elif "re-run the pack step" in msg and "does not match this rank's range" not in msg:
            self._error(n, "shard_invalid", rank, text)  # bad header, wrong size
        if "Watchdog caught collective operation timeout" in msg:
            self._error(n, "nccl_timeout", rank, text)
        if "xit" in msg or "died" in msg or "dead" in msg:
            m = _CONTAINER_EXIT.search(msg)
            if m:
                code = next((g for g in m.groups() if g is not None), None)
                self._error(n, "container_exit", rank, text, code=int(code) if code is not None else None)
        if "Traceback (most recent call last)" in msg:
            entry = self._error(n, "traceback", rank, text, exception=None, exception_line=None, frames=0)
            self.boot.pending.append(entry)

    def _traceback_line(self, n: int, tag: Optional[int], msg: str, stripped: str) -> None:
        """Frames are indented; the first unindented line of the same rank (or untagged) ends it."""
        pending = self.boot.pending
        idx = None
        for i in range(len(pending) - 1, -1, -1):
            if tag is None or pending[i]["rank"] in (tag, None):
                idx = i
                break
        if idx is None:
            return
        entry = pending[idx]
        if msg[:1] in (" ", "\t") or stripped.startswith("File \""):
            entry["frames"] += 1
            return
        if stripped.startswith(("During handling of the above exception", "The above exception was")):
            return
        pending.pop(idx)
        if _EXCEPTION.search(stripped):
            entry["exception"] = _clip(stripped)
            entry["exception_line"] = n

    # ------------------------------------------------------------------ result
    def result(self) -> dict:
        boot = self.boot
        boots = len(self.history) + (1 if (boot.evidence or boot.explicit) else 0)
        if boot.end_line is None:
            boot.end_line = self.lineno
        history = [self._summary(b) for b in self.history]
        if boots > len(self.history):
            history.append(self._summary(boot))
        ready = {
            "ready": boot.ready is not None,
            "line": boot.ready["line"] if boot.ready else None,
            "port": boot.ready["port"] if boot.ready else None,
            "rank": boot.ready["rank"] if boot.ready else None,
            "api_key": boot.ready["api_key"] if boot.ready else None,
            "text": boot.ready["text"] if boot.ready else None,
            "server_fired_up": boot.server_fired_up is not None,
            "server_fired_up_line": boot.server_fired_up,
            "fresh_inference": boot.fresh,
        }
        return {
            "lines": self.lineno,
            "bytes": self.nbytes,
            "truncated_last_line": self.truncated_last_line,
            "boots": boots,
            "boot_start_line": boot.start_line if boots else None,
            "boot_start_text": boot.start_text if boots else None,
            "boot": {"rank": boot.rank, "tp": boot.tp, "ep": boot.ep, "nnodes": boot.nnodes,
                     "ranks_started": sorted(boot.ranks_started), "rank_source": boot.rank_source},
            "boot_history": history,
            "launches": history,
            "server_args": boot.server_args,
            "launcher": self._launcher_result(boot),
            "weights": self._weights_result(boot),
            "weights_by_rank": {k: [dict(e) for e in v] for k, v in boot.weights.items()},
            "startup_timings": boot.startup,
            "worker_up": boot.worker_up or {"up": False, "line": None, "address": None, "text": None},
            # Not "warnings": Ansible shows a module result's top-level warnings as messages (strings only).
            "warning_counts": dict(boot.warnings),
            "warnings_total": sum(boot.warnings.values()),
            "status": self._status(boot, boots),
            "kv": _prefer(boot.kv),
            "kv_by_rank": {k: dict(v) for k, v in boot.kv.items()},
            "graphs": self._graphs(boot),
            "draft": _prefer(boot.draft),
            "engram": boot.engram,
            "engram_periodic": self._periodic_result(boot),
            "engram_periodic_lines": boot.periodic_count,
            "autotune": self._autotune_result(boot),
            "markers": self._markers_result(boot),
            "errors": boot.errors,
            "errors_total": boot.errors_total,
            "ready": ready,
            "decode": self._decode_result(boot),
        }

    @staticmethod
    def _status(boot: _Boot, boots: int) -> str:
        if not boots:
            return "empty"
        if boot.errors_total and (boot.ready is None or boot.error_after_ready):
            return "failed"
        if boot.ready is not None:
            return "ready"
        if boot.worker_up is not None:
            return "up"      # a worker: its health server runs, Ready is the head's
        if any(c.get("end_line") for c in boot.captures) or boot.decode_count or boot.periodic_count:
            return "captured"
        kv = boot.kv.values()
        if any("pool_tokens" in e or "memory_pool_end_avail_mem_bytes" in e for e in kv):
            return "pool"
        if any(e.get("end_line") for loads in boot.weights.values() for e in loads) or boot.captures \
                or boot.draft:
            return "loaded"
        return "booting"

    def _summary(self, b: _Boot) -> dict:
        return {
            "index": b.index,
            "start_line": b.start_line,
            "end_line": b.end_line,
            "status": self._status(b, 1),
            "ready": b.ready is not None,
            "worker_up": b.worker_up is not None,
            "rank": b.rank,
            "tp": b.tp,
            "errors_total": b.errors_total,
            "first_error": b.errors[0] if b.errors else None,
        }

    @staticmethod
    def _launcher_result(boot: _Boot) -> dict:
        out = {"skip_prepare": None, "tp_pad": None, "dense_backend": None, "sanity_check": None,
               "warmup": None, "lines": []}
        out.update(boot.launcher)
        return out

    @staticmethod
    def _weights_result(boot: _Boot) -> dict:
        """The preferred rank's loads: the first is the target, a ``...DSpark`` type (or the second) the draft."""
        out = {"target": None, "draft": None}
        if not boot.weights:
            return out
        ranks = sorted(int(k) for k in boot.weights if k != "unknown")
        loads = boot.weights[str(ranks[0])] if ranks else boot.weights["unknown"]
        for i, e in enumerate(loads):
            kind = "draft" if "DSpark" in str(e.get("type", "")) or (i and "type" not in e) else "target"
            if out[kind] is None:
                out[kind] = dict(e)
        return out

    @staticmethod
    def _graphs(boot: _Boot) -> dict:
        verify = [c for c in boot.captures if "verify" in c["what"]]
        chosen = _prefer_list(verify)
        return {
            "verify_bs": chosen.get("bs") if chosen else None,
            "num_tokens_per_req": chosen.get("num_tokens_per_req") if chosen else None,
            "backend": chosen.get("backend") if chosen else None,
            "avail_mem_gb": chosen.get("avail_mem_gb") if chosen else None,
            "captures": boot.captures,
        }

    def _periodic_result(self, boot: _Boot) -> list:
        out = []
        for (rank, layer), (lineno, raw) in sorted(
                boot.periodic.items(), key=lambda kv: (-1 if kv[0][0] is None else kv[0][0], kv[0][1])):
            text = _ANSI_B.sub(b"", raw).decode("utf-8", "replace").rstrip("\r")
            _, msg = split_prefix(text)
            m = _PERIODIC.search(msg)
            entry = {"layer": layer, "rank": rank, "line": lineno, "text": _clip(text)}
            if m:
                g = m.groupdict()
                entry.update({
                    "lookups": int(g["lookups"]),
                    "hit_rate": float(g["hit"]) if g["hit"] else None,
                    "reads": int(g["reads"]) if g["reads"] else None,
                    "cache_gib": float(g["cache"]) if g["cache"] else None,
                    "ways": int(g["ways"]) if g["ways"] else None,
                    "scales_gib": float(g["scales"]) if g["scales"] else None,
                    "threads": int(g["threads"]) if g["threads"] else None,
                    "packed": None if g["packed"] is None else g["packed"] == "True",
                })
            out.append(entry)
        return out

    @staticmethod
    def _autotune_result(boot: _Boot) -> dict:
        tuned_ranks = {e["rank"] for e in boot.runs} | {e["rank"] for e in boot.tuned}
        reused_ranks = {e["rank"] for e in boot.reused}
        if boot.reused and (boot.runs or boot.tuned or boot.disagreements):
            outcome = "mixed"
        elif boot.reused:
            outcome = "reused"
        elif boot.runs or boot.tuned or boot.disagreements:
            outcome = "tuned"
        else:
            outcome = "none"
        return {
            "disagreements": len(boot.disagreements),
            "disagreement_lines": [e["line"] for e in boot.disagreements],
            "runs": boot.runs,
            "completed": len(boot.completed),
            "reused": boot.reused,
            "tuned": boot.tuned,
            "keep_armed": bool(boot.keep_armed),
            "outcome": outcome,
            "ranks_reused": sorted(r for r in reused_ranks if r is not None),
            "ranks_tuned": sorted(r for r in tuned_ranks if r is not None),
        }

    def _markers_result(self, boot: _Boot) -> dict:
        out = {}
        for m in self.markers:
            hit = boot.markers.get(m.spec)
            out[m.spec] = {
                "found": hit is not None,
                "regex": m.regex is not None,
                "line": hit[0] if hit else None,
                "text": hit[1] if hit else None,
                "count": hit[2] if hit else 0,
            }
        return out

    def _decode_result(self, boot: _Boot) -> dict:
        out: dict = {"count": boot.decode_count, "line": None, "text": None, "truncated": False}
        out.update(dict.fromkeys(DECODE_KEYS))
        if boot.decode_last is None:
            return out
        lineno, raw = boot.decode_last
        text = _ANSI_B.sub(b"", raw).decode("utf-8", "replace").rstrip("\r")
        out["line"] = lineno
        out["text"] = _clip(text)
        out["truncated"] = self.truncated_last_line and lineno == self.lineno
        out.update(parse_decode_fields(text))
        return out


DECODE_KEYS = ("running_req", "accept_len", "accept_rate", "gen_throughput", "cuda_graph", "queue_req")
_DECODE_ALIASES = {
    "running_req": "running_req",
    "queue_req": "queue_req",
    "gen_throughput_token_s": "gen_throughput",
    "accept_len": "accept_len",
    "accept_rate": "accept_rate",
    "cuda_graph": "cuda_graph",
}


def parse_decode_fields(text: str) -> dict:
    """Parse ``Decode batch, #running-req: 1, ... #queue-req: 0`` into normalised keys."""
    i = text.find("Decode batch")
    rest = text[i + len("Decode batch"):].lstrip(",. ") if i >= 0 else text
    fields: dict = {}
    for part in rest.split(","):
        name, sep, val = part.partition(":")
        if not sep:
            continue
        key = _FIELD_NAME.sub("_", name.strip().lower()).strip("_")
        if not key or not val.strip():
            continue
        fields[_DECODE_ALIASES.get(key, key)] = _value(val)
    return fields


def _prefer(by_rank: dict) -> Optional[dict]:
    """The entry of rank 0, else of the lowest rank, else the untagged one."""
    if not by_rank:
        return None
    ranks = sorted(int(k) for k in by_rank if k != "unknown")
    if ranks:
        return dict(by_rank[str(ranks[0])])
    return dict(by_rank["unknown"])


def _prefer_list(entries: list) -> Optional[dict]:
    if not entries:
        return None
    tagged = [e for e in entries if e.get("rank") is not None]
    if tagged:
        low = min(e["rank"] for e in tagged)
        return next(e for e in tagged if e["rank"] == low)
    return entries[0]


def parse_stream(stream: BinaryIO, markers: Iterable[str] = (), max_errors: int = 100,
                 where: str = "the log") -> dict:
    """Parse a binary stream. Raises ``LogNotText`` and ``ValueError`` (bad marker)."""
    parser = BootLogParser(markers=markers, max_errors=max_errors)
    head = stream.read(TEXT_PROBE)
    check_text(head, where)
    carry = b""
    data = head
    nbytes = 0
    while data:
        nbytes += len(data)
        i = data.find(b"\n")
        if i < 0:
            carry += data
        else:
            parser.feed_line(carry + data[:i])
            j = data.rfind(b"\n")
            if j > i:
                parser.feed_block(data, i + 1, j + 1)
            carry = data[j + 1:]
        data = stream.read(BLOCK_SIZE)
    if carry:
        parser.truncated_last_line = True
        parser.feed_line(carry)
    parser.nbytes = nbytes
    return parser.result()


def parse_bytes(data: bytes, markers: Iterable[str] = (), max_errors: int = 100,
                where: str = "the log") -> dict:
    """Parse a log held in memory."""
    return parse_stream(io.BytesIO(data), markers=markers, max_errors=max_errors, where=where)


def parse_file(path: str, markers: Iterable[str] = (), max_errors: int = 100) -> dict:
    """Parse the log at ``path`` (the function ``boot_log_info`` uses). Raises OSError, LogNotText."""
    with open(path, "rb", buffering=0) as stream:
        result = parse_stream(stream, markers=markers, max_errors=max_errors, where=path)
    result["path"] = os.path.abspath(path)
    return result
