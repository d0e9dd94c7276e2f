# Over 600 lines on purpose: it ships to bench hosts as one standalone file (bare python3, no network) and runs
# alone from the command line.
"""Streaming decode benchmark against an OpenAI-compatible SGLang server (standard library only).

Used by the ``decode_bench`` module on a bench host (bare Python, maybe no network) and runnable alone::

    SPARKFLEET_API_KEY=... python3 module_utils/decode_client.py --url http://10.213.0.11:8888 \\
        --types prose code --concurrency 1 4 --reps 5 > result.json

Measuring protocol (docs/reference.md section 8; docs/bench.md has the full definitions):

- A condition is (prompt type, concurrency c). It runs ``warmup`` waves that are discarded, then ``reps``
  measured waves. A wave sends c streaming requests at once (threads released by one barrier); slot i
  sends prompt ``i % len(prompts)``, so every repetition sends the same prompts.
- Tokens are ``usage.completion_tokens`` of the final usage chunk (``stream_options.include_usage``),
  never a count of SSE chunks: a speculative engine commits several tokens per chunk.
- Per request: TTFT = first chunk with text - request start; decode rate = (tokens - 1) / (t_last -
  t_first) where t_first / t_last are the arrival times of the first / last chunk carrying text;
  TPOT = 1000 / decode rate (ms); end-to-end = stream end - request start; finish reason; sha256 of the
  text (first 16 hex digits).
- Per wave: aggregate = total completion tokens / wave wall time (first request start to last end);
  speculative view from the server's counters before and after the wave when it reports them.
- Guards (any one marks the condition invalid, its statistics are withheld, never averaged):
  ``failed_requests`` (HTTP error, broken stream, no [DONE], no usage, no text); ``token_count`` (a
  request that did not end with exactly ``max_tokens`` completion tokens AND finish_reason ``length``);
  ``foreign_traffic`` (the server reported more running + queued requests than c during a wave, counted
  more new requests than the wave sent, or never became idle before it); ``nondeterministic`` (at
  temperature 0, a slot's text hash differs between measured repetitions).
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import http.client
import json
import os
import re
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable
from urllib.parse import urlsplit

try:
    from ansible.module_utils.bench_stats import summarize
    from ansible.module_utils.prompt_catalog import DEFAULT_TYPES, prompts_for
except ImportError:  # standalone CLI: the sibling files
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_stats import summarize  # type: ignore[no-redef]
    from prompt_catalog import DEFAULT_TYPES, prompts_for  # type: ignore[no-redef]

CHAT_PATH = "/v1/chat/completions"
MIN_REPS = 3


class BenchError(Exception):
    """Bad input or a server the benchmark cannot use: one sentence an operator can act on."""


@dataclass
class BenchConfig:
    url: str
    api_key: str | None = None
    model: str | None = None
    types: list = field(default_factory=lambda: list(DEFAULT_TYPES))
    prompts: dict | None = None
    concurrency: list = field(default_factory=lambda: [1, 2, 4])
    max_tokens: int = 256
    warmup: int = 2
    reps: int = 5
    temperature: float = 0.0
    ignore_eos: bool = False
    request_timeout: float = 300.0
    poll_interval: float = 0.2
    idle_wait: float = 30.0

    def validate(self) -> dict:
        """Raise BenchError on bad input; return the prompts per type."""
        parts = urlsplit(self.url or "")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BenchError(f"url must look like http://HOST:PORT, not {self.url!r}")
        if not self.concurrency:
            raise BenchError("concurrency is empty: give at least one level, e.g. [1, 2, 4]")
        for level in self.concurrency:
            if not isinstance(level, int) or isinstance(level, bool) or level < 1:
                raise BenchError(f"concurrency {level!r} is not a positive whole number of simultaneous "
                                 "requests: use 1 or more")
        if not isinstance(self.reps, int) or self.reps < MIN_REPS:
            raise BenchError(f"reps={self.reps} is too few for a median with min-max and IQR: use at least "
                             f"{MIN_REPS} (5 recommended)")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise BenchError(f"warmup={self.warmup} must be 0 or more waves")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 2:
            raise BenchError(f"max_tokens={self.max_tokens}: a decode rate needs at least 2 tokens")
        if self.temperature < 0:
            raise BenchError(f"temperature={self.temperature} must not be negative")
        if self.request_timeout <= 0 or self.poll_interval <= 0 or self.idle_wait < 0:
            raise BenchError("request_timeout and poll_interval must be positive, idle_wait not negative")
        if not self.types:
            raise BenchError("types is empty: give at least one prompt type")
        try:
            return prompts_for(list(self.types), self.prompts)
        except ValueError as exc:
            raise BenchError(str(exc)) from None

    def public(self) -> dict:
        data = asdict(self)
        data.pop("api_key")
        data["api_key_set"] = bool(self.api_key)
        data.pop("prompts")
        return data


# --- HTTP --------------------------------------------------------------------------------------------
class Endpoint:
    """Where the server is and how to talk to it (one new connection per request)."""

    def __init__(self, url: str, api_key: str | None):
        parts = urlsplit(url)
        self.url = url.rstrip("/")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.base = parts.path.rstrip("/")
        self.api_key = api_key

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=timeout)

    def headers(self, json_body: bool = False) -> dict:
        headers = {"Accept": "application/json, text/event-stream"}
        if json_body:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        """(status, body); raises OSError / HTTPException when the server cannot be reached."""
        conn = self.connection(timeout)
        try:
            conn.request("GET", self.base + path, headers=self.headers())
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def get_json(self, path: str, timeout: float = 10.0) -> dict | None:
        """The JSON body of a 200 answer, or None for anything else (errors included)."""
        try:
            status, body = self.get(path, timeout)
            return json.loads(body) if status == 200 else None
        except (OSError, http.client.HTTPException, ValueError):
            return None


class EventStream:
    """The JSON events of an OpenAI-style server-sent event stream (``data: {...}`` lines), each with the clock
    reading taken when its line arrived. Iteration ends at ``data: [DONE]`` (then ``done`` is True) or at the end
    of the body; a read timeout and a malformed event raise as they happen (OSError, ValueError)."""

    def __init__(self, resp, clock: Callable[[], float] | None = None):
        self.resp, self.clock, self.done = resp, clock or time.perf_counter, False

    def __iter__(self):
        while True:
            line = self.resp.readline()
            now = self.clock()
            if not line:
                return
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                self.done = True
                return
            yield now, json.loads(data)


def delta_text(choice: dict) -> str:
    """The text a streamed choice adds (reasoning and answer alike: both are generated tokens)."""
    delta = choice.get("delta") or {}
    return (delta.get("reasoning_content") or "") + (delta.get("content") or "")


def preflight(cfg: BenchConfig) -> dict:
    """Read-only checks before any load: reachable, key accepted, model name, where load is reported.

    Returns {"model", "monitor", "server_info"}; raises BenchError with what to do otherwise.
    """
    ep = Endpoint(cfg.url, cfg.api_key)
    try:
        status, body = ep.get("/v1/models", timeout=min(30.0, cfg.request_timeout))
    except (OSError, http.client.HTTPException) as exc:
        raise BenchError(f"cannot reach the server at {cfg.url} from this host ({exc.__class__.__name__}: "
                         f"{exc}); check that the engine is up and the URL's host and port") from None
    if status in (401, 403):
        raise BenchError(f"the server at {cfg.url} rejected the API key (HTTP {status}): pass the key "
                         "from /state/api-key on the head as api_key")
    if status != 200:
        raise BenchError(f"GET {cfg.url}/v1/models answered HTTP {status}: {body[:200]!r}")
    model = cfg.model
    if not model:
        try:
            model = json.loads(body)["data"][0]["id"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise BenchError(f"GET {cfg.url}/v1/models did not list a model: {body[:200]!r}") from None
    info = ep.get_json("/server_info")
    monitor = "server_info" if info is not None and server_state(info).running is not None else None
    if monitor is None:
        try:
            status, text = ep.get("/metrics")
            if status == 200 and metrics_state(text.decode("utf-8", "replace")).running is not None:
                monitor = "metrics"
        except (OSError, http.client.HTTPException):
            pass
    return {"model": model, "monitor": monitor, "server_info": _strip_debug(info)}


# --- server state ------------------------------------------------------------------------------------
@dataclass
class ServerState:
    running: int | None
    queued: int | None
    counters: dict
    accept_length: float | None = None

    @property
    def load(self) -> int | None:
        if self.running is None:
            return None
        return self.running + (self.queued or 0)


def server_state(info: dict) -> ServerState:
    """Running/queued requests and counters from /server_info (the simulator's keys or SGLang's)."""
    states = info.get("internal_states") or [{}]
    first = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    running = info.get("num_running_reqs", first.get("#running-req"))
    queued = info.get("num_queue_reqs", first.get("#queue-req"))
    accept = first.get("avg_spec_accept_length")
    return ServerState(_int_or_none(running), _int_or_none(queued), dict(info.get("counters") or {}),
                       float(accept) if isinstance(accept, (int, float)) else None)


_METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def metrics_state(text: str) -> ServerState:
    """The same from Prometheus text: sglang:num_running_reqs, sglang:num_queue_reqs and *_total counters."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = _METRIC_LINE.match(line)
        if not match or line.startswith("#"):
            continue
        try:
            values[match.group(1)] = values.get(match.group(1), 0.0) + float(match.group(3))
        except ValueError:
            continue
    counters = {name.split(":", 1)[-1]: int(v) for name, v in values.items() if name.endswith("_total")}
    running = values.get("sglang:num_running_reqs")
    queued = values.get("sglang:num_queue_reqs")
    accept = values.get("sglang:spec_accept_length")
    return ServerState(_int_or_none(running), _int_or_none(queued), counters, accept)


def _int_or_none(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _strip_debug(info: dict | None) -> dict | None:
    if info is None:
        return None
    return {k: v for k, v in info.items() if k != "debug"}


class Monitor:
    """Polls the server's load during a wave (bounded by the wave) and reads counters around it."""

    def __init__(self, ep: Endpoint, source: str | None, interval: float):
        self.ep, self.source, self.interval = ep, source, interval

    def read(self) -> ServerState | None:
        if self.source == "server_info":
            info = self.ep.get_json("/server_info", timeout=5.0)
            return server_state(info) if info is not None else None
        if self.source == "metrics":
            try:
                status, body = self.ep.get("/metrics", timeout=5.0)
            except (OSError, http.client.HTTPException):
                return None
            return metrics_state(body.decode("utf-8", "replace")) if status == 200 else None
        return None

    def wait_idle(self, limit_s: float) -> int | None:
        """Wait (at most limit_s) until nothing runs or queues; return the load left (None: unknown)."""
        deadline = time.monotonic() + limit_s
        while True:
            state = self.read()
            load = state.load if state else None
            if load is None or load == 0 or time.monotonic() >= deadline:
                return load
            time.sleep(min(self.interval, max(0.0, deadline - time.monotonic())))

    def watch(self, stop: threading.Event, seen: list) -> None:
        """Append every observed load to ``seen`` until ``stop`` is set."""
        while not stop.is_set():
            state = self.read()
            if state is not None and state.load is not None:
                seen.append(state.load)
            stop.wait(self.interval)


# --- one request -------------------------------------------------------------------------------------
@dataclass
class RequestResult:
    type: str
    concurrency: int
    rep: int
    warmup: bool
    slot: int
    prompt_index: int
    ok: bool = False
    error: str | None = None
    status: int | None = None
    id: str | None = None
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    text_chunks: int = 0
    text_sha256: str | None = None
    ttft_ms: float | None = None
    decode_tok_s: float | None = None
    tpot_ms: float | None = None
    e2e_s: float | None = None
    t_start: float | None = None
    t_first: float | None = None
    t_last: float | None = None
    t_end: float | None = None


def stream_request(ep: Endpoint, body: bytes, timeout: float, result: RequestResult) -> None:
    """Send one streaming chat completion and fill ``result`` (times are time.perf_counter values)."""
    digest = hashlib.sha256()
    usage = None
    stream = None
    conn = ep.connection(timeout)
    result.t_start = time.perf_counter()
    try:
        conn.request("POST", ep.base + CHAT_PATH, body=body, headers=ep.headers(json_body=True))
        resp = conn.getresponse()
        result.status = resp.status
        if resp.status != 200:
            detail = resp.read(300).decode("utf-8", "replace").strip()
            result.error = f"HTTP {resp.status}: {detail}"
            return
        stream = EventStream(resp)
        for now, event in stream:
            if event.get("error"):
                result.error = f"server error in stream: {json.dumps(event['error'])[:200]}"
                return
            result.id = result.id or event.get("id")
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or ():
                text = delta_text(choice)
                if text:
                    if result.t_first is None:
                        result.t_first = now
                    result.t_last = now
                    result.text_chunks += 1
                    digest.update(text.encode("utf-8"))
                if choice.get("finish_reason"):
                    result.finish_reason = choice["finish_reason"]
    except (OSError, http.client.HTTPException, ValueError) as exc:
        result.error = f"{exc.__class__.__name__}: {exc}"
        return
    finally:
        result.t_end = time.perf_counter()
        conn.close()
        _finish(result, usage, stream is not None and stream.done, digest)


def _finish(result: RequestResult, usage: dict | None, done: bool, digest) -> None:
    if result.t_start is not None and result.t_end is not None:
        result.e2e_s = result.t_end - result.t_start
    if result.t_first is not None:
        result.ttft_ms = 1000.0 * (result.t_first - result.t_start)
        result.text_sha256 = digest.hexdigest()[:16]
    if usage:
        result.completion_tokens = _int_or_none(usage.get("completion_tokens"))
        result.prompt_tokens = _int_or_none(usage.get("prompt_tokens"))
    tokens = result.completion_tokens
    if tokens is not None and tokens >= 2 and result.t_last is not None and result.t_last > result.t_first:
        span = result.t_last - result.t_first
        result.decode_tok_s = (tokens - 1) / span
        result.tpot_ms = 1000.0 * span / (tokens - 1)
    if result.error:
        return
    if not done:
        result.error = f"stream ended before [DONE] after {result.text_chunks} text chunks"
    elif result.t_first is None:
        result.error = "the stream carried no text"
    elif result.finish_reason is None:
        result.error = "the stream ended without a finish_reason"
    elif tokens is None:
        result.error = ("no usage in the stream (the server ignored stream_options.include_usage): the token "
                        "count is unknown and chunks are not tokens")
    result.ok = result.error is None


# --- waves and conditions ----------------------------------------------------------------------------
@dataclass
class Wave:
    rep: int
    warmup: bool
    requests: list
    wall_s: float | None = None
    aggregate_tok_s: float | None = None
    load_seen: list = field(default_factory=list)
    busy_before: int | None = None
    new_requests_counted: int | None = None
    spec: dict | None = None


def _spec_view(before: ServerState | None, after: ServerState | None) -> dict | None:
    """Committed tokens per request-step and mean step time from the server's counters around a wave."""
    if before is None or after is None:
        return None
    d = {k: after.counters.get(k, 0) - before.counters.get(k, 0)
         for k in ("spec_verify_ct_total", "spec_accepted_tokens_total", "decode_steps_total",
                   "decode_step_us_total")}
    view = {}
    if d["spec_verify_ct_total"] > 0:
        view["tokens_per_step"] = d["spec_accepted_tokens_total"] / d["spec_verify_ct_total"]
    elif after.accept_length:
        view["tokens_per_step"] = after.accept_length
    if d["decode_steps_total"] > 0 and d["decode_step_us_total"] > 0:
        view["step_ms"] = d["decode_step_us_total"] / d["decode_steps_total"] / 1000.0
    return view or None


def run_wave(ep: Endpoint, cfg: BenchConfig, monitor: Monitor, model: str, kind: str, prompts: list,
             concurrency: int, rep: int, warmup: bool) -> Wave:
    """c simultaneous streaming requests; bounded by request_timeout."""
    wave = Wave(rep=rep, warmup=warmup, requests=[])
    if monitor.source:
        wave.busy_before = monitor.wait_idle(cfg.idle_wait) or None
    before = monitor.read()
    barrier = threading.Barrier(concurrency)
    threads = []
    for slot in range(concurrency):
        index = slot % len(prompts)
        result = RequestResult(type=kind, concurrency=concurrency, rep=rep, warmup=warmup, slot=slot,
                               prompt_index=index)
        wave.requests.append(result)
        body = json.dumps({
            "model": model, "messages": [{"role": "user", "content": prompts[index]}],
            "max_tokens": cfg.max_tokens, "temperature": cfg.temperature, "stream": True,
            "stream_options": {"include_usage": True}, "chat_template_kwargs": {"thinking": False},
            **({"ignore_eos": True} if cfg.ignore_eos else {}),
        }).encode()
        threads.append(threading.Thread(target=_released, args=(barrier, ep, body, cfg.request_timeout, result),
                                        daemon=True))
    for thread in threads:
        thread.start()
    stop = threading.Event()
    watcher = threading.Thread(target=monitor.watch, args=(stop, wave.load_seen), daemon=True)
    if monitor.source:  # started after the requests, so that its first poll already sees the wave
        watcher.start()
    deadline = time.monotonic() + cfg.request_timeout + 30.0
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    stop.set()
    if monitor.source:
        watcher.join(10.0)
    for result in wave.requests:
        if result.t_end is None and not result.error:
            result.error = f"no answer within request_timeout={cfg.request_timeout}s"
    after = monitor.read()
    if before is not None and after is not None and "num_requests_total" in after.counters:
        wave.new_requests_counted = after.counters["num_requests_total"] - before.counters.get(
            "num_requests_total", 0)
    wave.spec = _spec_view(before, after)
    starts = [r.t_start for r in wave.requests if r.t_start is not None]
    ends = [r.t_end for r in wave.requests if r.t_end is not None]
    if starts and ends and max(ends) > min(starts):
        wave.wall_s = max(ends) - min(starts)
        tokens = sum(r.completion_tokens or 0 for r in wave.requests if r.ok)
        wave.aggregate_tok_s = tokens / wave.wall_s
    return wave


def _released(barrier: threading.Barrier, ep: Endpoint, body: bytes, timeout: float,
              result: RequestResult) -> None:
    try:
        barrier.wait(timeout=30.0)
    except threading.BrokenBarrierError:
        pass
    stream_request(ep, body, timeout, result)


def evaluate_condition(kind: str, concurrency: int, waves: list, cfg: BenchConfig,
                       monitor_source: str | None) -> dict:
    """Apply the guards to a condition's measured waves; statistics only when it is valid."""
    measured = [w for w in waves if not w.warmup]
    requests = [r for w in measured for r in w.requests]
    reasons, warnings = [], []
    failed = [r for r in requests if not r.ok]
    if failed or len(measured) < cfg.reps:
        reasons.append(f"failed_requests: {len(failed)} of {len(requests)} requests failed in "
                       f"{len(measured)} of {cfg.reps} measured waves"
                       + (f" (first: {failed[0].error})" if failed else ""))
    wrong = [r for r in requests if r.ok and not (r.completion_tokens == cfg.max_tokens
                                                  and r.finish_reason == "length")]
    if wrong:
        seen = sorted({f"{r.completion_tokens} tokens/{r.finish_reason}" for r in wrong})
        reasons.append(f"token_count: {len(wrong)} requests did not end with exactly max_tokens="
                       f"{cfg.max_tokens} completion tokens and finish_reason 'length' (seen: {', '.join(seen)})")
    for wave in measured:
        if wave.busy_before:
            reasons.append(f"foreign_traffic: the server still had {wave.busy_before} requests running or "
                           f"queued before rep {wave.rep} after waiting {cfg.idle_wait}s for idle")
        if wave.load_seen and max(wave.load_seen) > concurrency:
            reasons.append(f"foreign_traffic: the server reported up to {max(wave.load_seen)} running + queued "
                           f"requests during rep {wave.rep}, which sent {concurrency}")
        if wave.new_requests_counted is not None and wave.new_requests_counted > concurrency:
            reasons.append(f"foreign_traffic: the server counted {wave.new_requests_counted} new requests "
                           f"during rep {wave.rep}, which sent {concurrency}")
    if monitor_source is None:
        warnings.append("foreign-traffic guard blind: the server reports its load on neither /server_info "
                        "nor /metrics")
    hashes: dict[str, list] = {}
    for r in requests:
        if r.ok and r.text_sha256:
            hashes.setdefault(str(r.slot), [])
            if r.text_sha256 not in hashes[str(r.slot)]:
                hashes[str(r.slot)].append(r.text_sha256)
    if cfg.temperature == 0:
        differing = sorted((slot for slot, seen in hashes.items() if len(seen) > 1), key=int)
        if differing:
            reasons.append(f"nondeterministic: greedy outputs differ between repetitions for slot(s) "
                           f"{', '.join(differing)} ({len(hashes[differing[0]])} distinct hashes of slot "
                           f"{differing[0]}): a correctness signal")
    else:
        warnings.append(f"hash guard off: temperature {cfg.temperature} samples")
    valid = not reasons
    condition = {
        "type": kind, "concurrency": concurrency, "valid": valid, "reasons": reasons, "warnings": warnings,
        "reps": len(measured), "n_requests": len(requests), "hashes": hashes,
        "monitor": {"source": monitor_source,
                    "max_load_per_rep": [max(w.load_seen) if w.load_seen else None for w in measured]},
        "stats": None, "samples": None,
    }
    if valid:
        samples = {
            "ttft_ms": [r.ttft_ms for r in requests], "decode_tok_s": [r.decode_tok_s for r in requests],
            "tpot_ms": [r.tpot_ms for r in requests], "e2e_s": [r.e2e_s for r in requests],
            "aggregate_tok_s": [w.aggregate_tok_s for w in measured],
        }
        spec_waves = [w.spec for w in measured if w.spec]
        spec = None
        if spec_waves:
            spec = {key: summarize([s[key] for s in spec_waves if key in s])
                    for key in ("tokens_per_step", "step_ms")}
        condition["stats"] = {key: summarize(values) for key, values in samples.items()}
        condition["stats"]["spec"] = spec
        condition["samples"] = samples
    return condition


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def run_benchmark(cfg: BenchConfig, log: Callable[[str], None] | None = None) -> dict:
    """The whole run: preflight, every condition, the guards. Raises BenchError before any load."""
    log = log or (lambda msg: None)
    prompts = cfg.validate()
    pre = preflight(cfg)
    ep = Endpoint(cfg.url, cfg.api_key)
    monitor = Monitor(ep, pre["monitor"], cfg.poll_interval)
    started = _now()
    conditions, requests = [], []
    for kind in cfg.types:
        for concurrency in cfg.concurrency:
            waves = []
            for index in range(cfg.warmup + cfg.reps):
                warmup = index < cfg.warmup
                # Warm-up waves are reps -warmup..-1, measured ones 0..reps-1.
                wave = run_wave(ep, cfg, monitor, pre["model"], kind, prompts[kind], concurrency,
                                index - cfg.warmup, warmup)
                waves.append(wave)
                if not any(r.ok for r in wave.requests):
                    log(f"{kind} c{concurrency}: every request of wave {index} failed; skipping the rest")
                    break
            condition = evaluate_condition(kind, concurrency, waves, cfg, pre["monitor"])
            conditions.append(condition)
            requests += [asdict(r) for w in waves for r in w.requests]
            stats = condition["stats"]
            log(f"{kind} c{concurrency}: " + (
                f"decode {stats['decode_tok_s']['median']:.2f} tok/s median" if condition["valid"]
                else "INVALID: " + "; ".join(condition["reasons"])))
    return {
        "started": started, "finished": _now(), "model": pre["model"], "url": cfg.url,
        "config": cfg.public(), "prompts": prompts, "conditions": conditions, "requests": requests,
        "server": {"before": pre["server_info"], "after": _strip_debug(ep.get_json("/server_info"))},
        "invalid_count": sum(1 for c in conditions if not c["valid"]),
    }


# --- CLI ---------------------------------------------------------------------------------------------
def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description="Decode benchmark of an OpenAI-compatible SGLang server "
                                                 "(JSON on stdout, progress on stderr)")
    parser.add_argument("--url", required=True)
    parser.add_argument("--api-key-file", help="file holding the API key (or set SPARKFLEET_API_KEY)")
    parser.add_argument("--model")
    parser.add_argument("--types", nargs="+", default=list(DEFAULT_TYPES))
    parser.add_argument("--prompts-json", help="JSON file: {type: [prompt, ...]} overriding the catalog")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument("--request-timeout", type=float, default=300.0)
    parser.add_argument("--poll-interval", type=float, default=0.2)
    parser.add_argument("--idle-wait", type=float, default=30.0)
    args = parser.parse_args(argv)
    key = os.environ.get("SPARKFLEET_API_KEY")
    if args.api_key_file:
        with open(args.api_key_file) as handle:
            key = handle.read().strip()
    prompts = None
    if args.prompts_json:
        with open(args.prompts_json) as handle:
            prompts = json.load(handle)
    cfg = BenchConfig(url=args.url, api_key=key or None, model=args.model, types=args.types, prompts=prompts,
                      concurrency=args.concurrency, max_tokens=args.max_tokens, warmup=args.warmup,
                      reps=args.reps, temperature=args.temperature, ignore_eos=args.ignore_eos,
                      request_timeout=args.request_timeout, poll_interval=args.poll_interval,
                      idle_wait=args.idle_wait)
    try:
        result = run_benchmark(cfg, log=lambda msg: print(msg, file=sys.stderr, flush=True))
    except BenchError as exc:
        print(f"decode_client: {exc}", file=sys.stderr)
        return 2
    json.dump(result, sys.stdout, indent=1)
    print()
    return 1 if result["invalid_count"] else 0


if __name__ == "__main__":
    sys.exit(main())
