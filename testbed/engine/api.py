# Over 600 lines on purpose: the simulated head's HTTP endpoints and the scheduler that paces them share one
# server object.
"""HTTP API of the simulated SGLang head (docs/reference.md section 7), paced by the step model in model.py.

Standard library only (http.server + threads). ``serve()`` starts a ThreadingHTTPServer and a scheduler
thread; the scheduler batches up to ``max_running_requests`` requests (the rest queue), runs one prefill
step for newly admitted requests (1 token each), then decode steps whose length comes from
``StepModel.step_ms`` and whose committed tokens per request come from ``StepModel.accepted_tokens``:
every streamed chunk carries the tokens of one step. docs/simulator.md documents the endpoints.

Endpoints: GET /health (503 until ready), GET /health_generate (one real generation), GET /v1/models,
POST /v1/chat/completions (stream or not; ``stream_options.include_usage`` adds a final chunk with
``usage`` and no choices), GET /server_info (counters since boot, running and queued requests;
``?timings=1`` adds ``debug.timings``: the server's own per-request chunk timestamps), GET /metrics
(Prometheus text, only with ``enable_metrics``). With an API key, every path except /health* and /metrics
needs ``Authorization: Bearer <key>`` (401 otherwise), as SGLang's middleware does.

Faults (``SimConfig.faults``): ``slow_start_s`` (simulated seconds before /health turns 200),
``drop_stream_after_tokens`` (close every stream abruptly once it has sent that many tokens),
``http_500_every`` (every Nth chat completion answers HTTP 500), ``omit_usage`` (never report usage),
``nondeterministic`` (greedy text differs from request to request), ``nccl_hang_after_requests`` (once that
many requests have finished, the ranks hang in a collective: /health stays 200, requests are accepted and
never produce a token).

Standalone: ``python -m testbed.engine.api --port 8888 [--time-scale 0.05] [--config cfg.json]``.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime
import hashlib
import itertools
import json
import os
import queue
import random
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterator
from urllib.parse import parse_qs, urlsplit

if __package__:
    from .model import SimConfig, StepModel, accept_rate, classify_prompt
else:  # run as a script: python3 testbed/engine/api.py
    from model import SimConfig, StepModel, accept_rate, classify_prompt  # type: ignore[no-redef]

# Exact-answer smoke prompts (T=0): the engine answers them exactly, then stops.
SMOKE_ANSWERS = {
    "What is 19 + 23? Reply only with the number.": "42",
    "What is 7 * 8? Reply only with the number.": "56",
    "What is the capital of France? Reply with one word.": "Paris",
    "Spell the word 'spark' backwards. Reply only with the letters.": "kraps",
}
KV_POOL_TOKENS = 491520  # the actual pool of the fleet's boot log (docs/reference.md section 1)
TIMINGS_KEPT = 1024
THINKING_TOKENS = 24
# The modelled GPU's steps do not wait for the host: a step the loop woke up late for is caught up by the
# next ones (no sleep until the chain is back on time), up to this much wall time behind; beyond it (a
# paused container, a stopped process) the cadence restarts from now instead of bursting.
MAX_CATCH_UP_S = 1.0
_END = object()


def next_deadline(previous: float | None, now: float, dt: float, max_lag_s: float = MAX_CATCH_UP_S) -> float:
    """The deadline of the step that starts now and lasts dt: one step after the previous deadline, so that
    scheduling delays under host load are caught up rather than lost; from now after an idle loop
    (previous None) or when the loop fell more than max_lag_s behind."""
    if previous is None or now - previous > max_lag_s:
        return now + dt
    return previous + dt

_VOCAB = {
    "prose": ("the", "fleet", "node", "engine", "memory", "request", "token", "draft", "model", "operator",
              "quiet", "river", "morning", "signal", "careful", "measure", "and", "of", "a", "to", "in",
              "which", "because", "while", "every", "stream", "bright", "window", "history", "winter",
              "garden", "across", "silent", "market", "letter", "answer", "simple", "steady", "north"),
    "code": ("def", " ", "(", ")", ":", "\n    ", "return", " x", " y", " =", " +", " if", " else", " for",
             " in", " range", "(n)", "\n", "result", ".append", "[", "]", " None", " self", ",", " i"),
    "json": ("{", "}", "\"id\"", "\"name\"", "\"items\"", ": ", ", ", "[", "]", "\"node\"", "\"rank\"", "0",
             "1", "2", "true", "false", "null", "\"status\"", "\"ok\"", "\n  "),
    "structured": ("| ", " |", "\n", "- ", "rank", "node", "step", "ms", "packed", "yes", "no", "1.", "2.",
                   "3.", " value", " name", "---", " total", " note"),
}


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _seed_of(*parts: object) -> int:
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big")


class TokenSource:
    """Deterministic text for a prompt: the greedy continuation, or a sampled one when given a salt."""

    def __init__(self, prompt: str, prompt_type: str, model_name: str, salt: object | None,
                 ignore_eos: bool):
        self.answer = SMOKE_ANSWERS.get(_normalise(prompt))
        seed = _seed_of(model_name, prompt, salt)
        self._rng = random.Random(seed)
        self._vocab = _VOCAB.get(prompt_type, _VOCAB["prose"])
        self.natural_length = 1 if self.answer is not None else 3000 + seed % 1000
        self.ignore_eos = ignore_eos
        self.produced = 0

    def next(self):
        """The next token's text, or _END at end of sequence."""
        if self.produced >= self.natural_length and not self.ignore_eos:
            return _END
        self.produced += 1
        if self.answer is not None and self.produced == 1:
            return self.answer
        token = self._rng.choice(self._vocab)
        if self._vocab is _VOCAB["prose"]:
            return (" " + token) if self._rng.random() > 0.08 else "."
        return token


@dataclass
class SimRequest:
    rid: str
    prompt: str
    prompt_type: str
    prompt_tokens: int
    max_tokens: int
    source: TokenSource
    rng: random.Random
    thinking: bool = False
    out: "queue.Queue" = field(default_factory=queue.Queue)
    state: str = "queued"
    generated: int = 0
    finish_reason: str | None = None
    cancelled: bool = False
    t_received: float = field(default_factory=time.monotonic)
    chunks: list = field(default_factory=list)

    def remaining(self) -> int:
        return self.max_tokens - self.generated


class Engine:
    """The scheduler: continuous batching with a queue, prefill then paced decode steps."""

    def __init__(self, config: SimConfig, log: Callable[[str], None], ready: threading.Event | None):
        self.config = config
        self.model = StepModel(config)
        self.log = log
        self.ready_event = ready
        self.started = time.monotonic()
        self.cond = threading.Condition()
        self.waiting: collections.deque[SimRequest] = collections.deque()
        self.running: list[SimRequest] = []
        self.stop = threading.Event()
        self.counters = collections.Counter()
        self.timings: collections.deque = collections.deque(maxlen=TIMINGS_KEPT)
        self._chat_numbers = itertools.count(1)
        self._window = {"steps": 0, "committed": 0, "request_steps": 0, "t0": time.monotonic()}
        self.described = self.model.describe()  # the config does not change while serving
        self.last_accept_len = 0.0
        self.last_gen_throughput = 0.0
        self.thread = threading.Thread(target=self._loop, name="sim-scheduler", daemon=True)

    # --- readiness and admission -----------------------------------------------------------------
    def is_ready(self) -> bool:
        slow = float(self.config.faults.get("slow_start_s", 0) or 0) * self.config.time_scale
        if time.monotonic() - self.started < slow:
            return False
        return self.ready_event is None or self.ready_event.is_set()

    def next_chat_number(self) -> int:
        """Counts chat completions only (the http_500_every fault's clock)."""
        return next(self._chat_numbers)

    def new_request(self, prompt: str, max_tokens: int, temperature: float, ignore_eos: bool,
                    thinking: bool) -> SimRequest:
        prompt_type = classify_prompt(prompt)
        greedy = temperature <= 0 and not self.config.faults.get("nondeterministic")
        salt = None if greedy else uuid.uuid4().hex
        return SimRequest(
            rid="chatcmpl-" + uuid.uuid4().hex[:24], prompt=prompt, prompt_type=prompt_type,
            prompt_tokens=8 + max(1, len(prompt) // 4), max_tokens=max_tokens,
            source=TokenSource(prompt, prompt_type, self.config.served_model_name, salt, ignore_eos),
            # Acceptance is a property of the text: greedy requests for one prompt accept alike every time.
            rng=random.Random(_seed_of("accept", prompt, salt)), thinking=thinking)

    def submit(self, req: SimRequest) -> None:
        with self.cond:
            self.waiting.append(req)
            self.counters["num_requests_total"] += 1
            self.counters["prompt_tokens_total"] += req.prompt_tokens
            self.cond.notify_all()

    def count(self, key: str, n: int = 1) -> None:
        with self.cond:
            self.counters[key] += n

    def snapshot(self) -> dict:
        with self.cond:
            return {"running": len(self.running), "queued": len(self.waiting), "counters": dict(self.counters)}

    # --- the loop --------------------------------------------------------------------------------
    def _sleep_until(self, deadline: float) -> None:
        delay = deadline - time.monotonic()
        if delay > 0:
            self.stop.wait(delay)

    def hung(self) -> bool:
        """The nccl_hang_after_requests fault: a collective never returns once that many requests finished."""
        after = int(self.config.faults.get("nccl_hang_after_requests", 0) or 0)
        return bool(after) and self.counters["num_requests_finished"] >= after

    def _loop(self) -> None:
        deadline = None
        while not self.stop.is_set():
            with self.cond:
                if self.hung():
                    self.cond.wait(0.2)
                    continue
                self.running = [r for r in self.running if not r.cancelled]
                while self.waiting and len(self.running) < self.config.max_running_requests:
                    req = self.waiting.popleft()
                    if not req.cancelled:
                        req.state = "prefill"
                        self.running.append(req)
                if not self.running:
                    deadline = None
                    self.cond.wait(0.05)
                    continue
                batch = list(self.running)
                queued = len(self.waiting)
            new = [r for r in batch if r.state == "prefill"]
            if new:
                deadline = self._prefill(new, batch, queued, deadline)
                continue
            deadline = self._decode(batch, queued, deadline)

    def _prefill(self, new: list[SimRequest], batch: list[SimRequest], queued: int,
                 deadline: float | None) -> float:
        chunk, tokens = [], 0
        for req in new:  # one chunk of at most chunked_prefill_size tokens (at least one request)
            if chunk and tokens + req.prompt_tokens > self.config.chunked_prefill_size:
                break
            chunk.append(req)
            tokens += req.prompt_tokens
        deadline = next_deadline(deadline, time.monotonic(),
                                 self.model.prefill_ms(tokens) * self.config.time_scale / 1000.0)
        self._sleep_until(deadline)
        if self.stop.is_set():
            return deadline
        now = time.monotonic()
        for req in chunk:
            req.state = "decode"
            self._emit(req, 1, now)
        self.log(self._prefix() + f"Prefill batch, #new-seq: {len(chunk)}, #new-token: {tokens}, "
                 f"#cached-token: 0, token usage: {self._usage(batch):.2f}, "
                 f"#running-req: {len(batch) - len(chunk)}, #queue-req: {queued}")
        self._retire()
        return deadline

    def _decode(self, batch: list[SimRequest], queued: int, deadline: float | None) -> float:
        types = collections.Counter(r.prompt_type for r in batch)
        dt = self.model.step_ms(len(batch), types.most_common(1)[0][0]) * self.config.time_scale / 1000.0
        deadline = next_deadline(deadline, time.monotonic(), dt)  # a steady cadence (MAX_CATCH_UP_S)
        start = deadline - dt  # when the step began on the modelled GPU
        self._sleep_until(deadline)
        if self.stop.is_set():
            return deadline
        now = time.monotonic()
        committed = 0
        for req in batch:
            if req.cancelled or req.state != "decode":
                continue
            n = min(self.model.accepted_tokens(req.prompt_type, req.rng), req.remaining())
            committed += self._emit(req, n, now)
        with self.cond:
            self.counters["decode_steps_total"] += 1
            self.counters["decode_step_us_total"] += int((now - start) * 1e6)
            self.counters["spec_verify_ct_total"] += len(batch)
            self.counters["spec_accepted_tokens_total"] += committed
        window = self._window
        window["steps"] += 1
        window["committed"] += committed
        window["request_steps"] += len(batch)
        if window["steps"] >= self.config.log_interval_steps:
            elapsed = max(1e-9, now - window["t0"])
            self.last_accept_len = window["committed"] / max(1, window["request_steps"])
            self.last_gen_throughput = window["committed"] / elapsed
            tokens_in_kv = sum(r.prompt_tokens + r.generated for r in batch)
            self.log(self._prefix() + f"Decode batch, #running-req: {len(batch)}, #full token: 0, "
                     f"#token: {tokens_in_kv}, token usage: {self._usage(batch):.2f}, "
                     f"accept len: {self.last_accept_len:.2f}, "
                     f"accept rate: {accept_rate(self.last_accept_len, self.config.dspark_block_size):.2f}, "
                     f"cuda graph: {len(batch) <= self.config.max_running_requests}, "
                     f"gen throughput (token/s): {self.last_gen_throughput:.2f}, #queue-req: {queued}")
            self._window = {"steps": 0, "committed": 0, "request_steps": 0, "t0": now}
        self._retire()
        return deadline

    def _emit(self, req: SimRequest, n: int, now: float) -> int:
        """Commit up to n tokens of req at time now; return how many were committed."""
        parts = []
        for _ in range(n):
            token = req.source.next()
            if token is _END:
                req.finish_reason = "stop"
                break
            parts.append(token)
        start = req.generated
        req.generated += len(parts)
        if req.finish_reason is None and req.generated >= req.max_tokens:
            req.finish_reason = "length"
        if parts:
            req.chunks.append((now, len(parts)))
        thinking_split = max(0, min(len(parts), THINKING_TOKENS - start)) if req.thinking else 0
        req.out.put(("tokens", parts[:thinking_split], parts[thinking_split:], req.finish_reason))
        with self.cond:
            self.counters["generation_tokens_total"] += len(parts)
        return len(parts)

    def _retire(self) -> None:
        with self.cond:
            done = [r for r in self.running if r.finish_reason is not None or r.cancelled]
            self.running = [r for r in self.running if r not in done]
            for req in done:
                req.state = "done"
                if req.finish_reason is not None:
                    self.counters["num_requests_finished"] += 1
                    self.timings.append(_timing_record(req))
            if done:
                self.cond.notify_all()

    def cancel(self, req: SimRequest) -> None:
        with self.cond:
            req.cancelled = True
            self.counters["num_requests_aborted"] += 1
            self.cond.notify_all()

    def shutdown(self) -> None:
        self.stop.set()
        with self.cond:
            for req in list(self.running) + list(self.waiting):
                req.out.put(("shutdown",))
            self.cond.notify_all()
        if self.thread.is_alive():
            self.thread.join(timeout=5)

    # --- reporting -------------------------------------------------------------------------------
    def _usage(self, batch: list[SimRequest]) -> float:
        return sum(r.prompt_tokens + r.generated for r in batch) / KV_POOL_TOKENS

    @staticmethod
    def _prefix() -> str:
        return f"[{datetime.datetime.now().strftime('%Y-%m-%d %H:%M:%S')} TP0 EP0] "

    def server_info(self, with_timings: bool = False) -> dict:
        snap = self.snapshot()
        cfg = self.config
        info = {
            "model_path": cfg.model_path, "served_model_name": cfg.served_model_name, "tp_size": cfg.tp,
            "ep_size": cfg.tp, "max_running_requests": cfg.max_running_requests,
            "chunked_prefill_size": cfg.chunked_prefill_size, "speculative_algorithm": "DSPARK",
            "dspark_block_size": cfg.dspark_block_size,
            "speculative_num_draft_tokens": cfg.dspark_block_size + 1,
            "max_total_num_tokens": KV_POOL_TOKENS, "enable_metrics": cfg.enable_metrics,
            "uptime_s": round(time.monotonic() - self.started, 3), "ready": self.is_ready(),
            "time_scale": cfg.time_scale,
            "num_running_reqs": snap["running"], "num_queue_reqs": snap["queued"],
            "counters": {key: snap["counters"].get(key, 0) for key in _COUNTERS},
            "internal_states": [{"#running-req": snap["running"], "#queue-req": snap["queued"],
                                 "avg_spec_accept_length": round(self.last_accept_len, 4),
                                 "last_gen_throughput": round(self.last_gen_throughput, 3)}],
            "step_model": self.described,
        }
        if with_timings:
            with self.cond:
                info["debug"] = {"clock": "time.monotonic", "timings": list(self.timings)}
        return info

    def metrics(self) -> str:
        snap = self.snapshot()
        label = f'{{model_name="{self.config.served_model_name}"}}'
        lines = []
        gauges = {"num_running_reqs": snap["running"], "num_queue_reqs": snap["queued"],
                  "spec_accept_length": round(self.last_accept_len, 4),
                  "gen_throughput": round(self.last_gen_throughput, 3)}
        for name, value in gauges.items():
            lines += [f"# TYPE sglang:{name} gauge", f"sglang:{name}{label} {value}"]
        for name in _COUNTERS:
            lines += [f"# TYPE sglang:{name} counter", f"sglang:{name}{label} {snap['counters'].get(name, 0)}"]
        return "\n".join(lines) + "\n"


_COUNTERS = ("num_requests_total", "num_requests_finished", "num_requests_failed", "num_requests_aborted",
             "prompt_tokens_total", "generation_tokens_total", "decode_steps_total", "decode_step_us_total",
             "spec_verify_ct_total", "spec_accepted_tokens_total")


def _timing_record(req: SimRequest) -> dict:
    record = {"id": req.rid, "prompt_type": req.prompt_type, "max_tokens": req.max_tokens,
              "completion_tokens": req.generated, "finish_reason": req.finish_reason,
              "t_received": req.t_received, "chunks": [[t, n] for t, n in req.chunks]}
    if req.chunks:
        t_first, n_first = req.chunks[0]
        t_last = req.chunks[-1][0]
        record["t_first_token"], record["t_last_token"] = t_first, t_last
        decoded = req.generated - n_first
        if decoded > 0 and t_last > t_first:
            record["server_decode_tok_s"] = decoded / (t_last - t_first)
            record["server_tpot_ms"] = 1000.0 * (t_last - t_first) / decoded
    return record


def _prompt_of(messages: list) -> str:
    texts = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts += [part.get("text", "") for part in content if isinstance(part, dict)]
    # The engine answers the last user turn; earlier turns only add prompt tokens.
    return texts[-1] if texts else ""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sglang-sim/1"
    server: "SimHTTPServer"

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - silence http.server's stderr log
        return

    def setup(self) -> None:
        super().setup()
        # Stream chunks leave at once (as uvicorn does), not held back by Nagle's algorithm.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    # --- plumbing --------------------------------------------------------------------------------
    @property
    def engine(self) -> Engine:
        return self.server.engine

    def _send_json(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def _error(self, status: int, message: str) -> None:
        self._send_json(status, {"object": "error", "message": message, "type": "invalid_request_error",
                                 "code": status})

    def _authorised(self, path: str) -> bool:
        key = self.engine.config.api_key
        if not key or path.startswith("/health") or path == "/metrics":
            return True
        return self.headers.get("Authorization", "") == f"Bearer {key}"

    def _route(self, method: str) -> None:
        url = urlsplit(self.path)
        path = url.path.rstrip("/") or "/"
        if not self._authorised(path):
            self._error(401, "Unauthorized: missing or wrong API key")
            return
        routes = {
            ("GET", "/health"): self._health, ("GET", "/health_generate"): self._health_generate,
            ("GET", "/v1/models"): self._models, ("GET", "/server_info"): self._server_info,
            ("GET", "/get_server_info"): self._server_info, ("GET", "/metrics"): self._metrics,
            ("POST", "/v1/chat/completions"): self._chat,
        }
        handler = routes.get((method, path))
        if handler is None:
            self._error(404, f"no route {method} {path}")
            return
        if path not in ("/health", "/server_info", "/get_server_info", "/metrics") \
                and not self.engine.is_ready():
            self._error(503, "server is starting")
            return
        handler(parse_qs(url.query))

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._route("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._route("POST")

    # --- endpoints -------------------------------------------------------------------------------
    def _health(self, _query) -> None:
        if self.engine.is_ready():
            self._send_json(200, {"status": "ok"})
        else:
            self._error(503, "server is starting")

    def _health_generate(self, _query) -> None:
        req = self.engine.new_request(next(iter(SMOKE_ANSWERS)), 1, 0.0, False, False)
        self.engine.submit(req)
        result = self._collect(req)
        if result is None:
            self._error(503, "generation did not finish")
        else:
            self._send_json(200, {"status": "ok", "text": result[1]})

    def _models(self, _query) -> None:
        cfg = self.engine.config
        self._send_json(200, {"object": "list", "data": [{
            "id": cfg.served_model_name, "object": "model", "created": int(time.time()),
            "owned_by": "sglang", "root": cfg.model_path, "max_model_len": 1048576}]})

    def _server_info(self, query) -> None:
        self._send_json(200, self.engine.server_info(with_timings=query.get("timings", ["0"])[0] == "1"))

    def _metrics(self, _query) -> None:
        if not self.engine.config.enable_metrics:
            self._error(404, "metrics are off (start with --enable-metrics)")
            return
        body = self.engine.metrics().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def _chat(self, _query) -> None:
        engine = self.engine
        try:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            messages = body["messages"]
            if not isinstance(messages, list) or not messages:
                raise ValueError("messages must be a non-empty list")
            max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 1024)
            if max_tokens < 1:
                raise ValueError("max_tokens must be at least 1")
            temperature = float(body.get("temperature", 1.0))
        except (KeyError, ValueError, TypeError, json.JSONDecodeError) as exc:
            self._error(400, f"bad request: {exc}")
            return
        every = int(engine.config.faults.get("http_500_every", 0) or 0)
        if every and engine.next_chat_number() % every == 0:
            engine.count("num_requests_total")
            engine.count("num_requests_failed")
            self._error(500, "Internal server error (injected fault)")
            return
        kwargs = body.get("chat_template_kwargs") or {}
        thinking = bool(kwargs.get("thinking", kwargs.get("enable_thinking", False)))
        req = engine.new_request(_prompt_of(messages), max_tokens, temperature,
                                 bool(body.get("ignore_eos", False)), thinking)
        engine.submit(req)
        options = body.get("stream_options") or {}
        include_usage = bool(options.get("include_usage")) and not engine.config.faults.get("omit_usage")
        if body.get("stream"):
            self._stream(req, include_usage, include_usage and bool(options.get("continuous_usage_stats")))
        else:
            self._complete(req, include_usage=not engine.config.faults.get("omit_usage"))

    def _collect(self, req: SimRequest):
        """Wait for a whole request; return (reasoning, content, finish) or None if the engine stopped."""
        reasoning, content = [], []
        while True:
            try:
                item = req.out.get(timeout=1.0)
            except queue.Empty:
                if self.engine.stop.is_set():
                    return None
                continue
            if item[0] == "shutdown":
                return None
            _, think, text, finish = item
            reasoning += think
            content += text
            if finish is not None:
                return "".join(reasoning), "".join(content), finish

    def _complete(self, req: SimRequest, include_usage: bool) -> None:
        result = self._collect(req)
        if result is None:
            self._error(503, "server shutting down")
            return
        reasoning, content, finish = result
        message = {"role": "assistant", "content": content}
        if reasoning:
            message["reasoning_content"] = reasoning
        payload = {"id": req.rid, "object": "chat.completion", "created": int(time.time()),
                   "model": self.engine.config.served_model_name,
                   "choices": [{"index": 0, "message": message, "finish_reason": finish}]}
        if include_usage:
            payload["usage"] = _usage(req)
        self._send_json(200, payload)

    def _stream(self, req: SimRequest, include_usage: bool, continuous: bool = False) -> None:
        engine = self.engine
        drop_after = int(engine.config.faults.get("drop_stream_after_tokens", 0) or 0)
        created = int(time.time())
        name = engine.config.served_model_name

        def chunk(delta: dict, finish: str | None, tokens: int = 0) -> dict:
            # stream_options.continuous_usage_stats: every chunk carries the usage so far (SGLang, vLLM).
            usage = ({"prompt_tokens": req.prompt_tokens, "completion_tokens": tokens,
                      "total_tokens": req.prompt_tokens + tokens} if continuous else None)
            return {"id": req.rid, "object": "chat.completion.chunk", "created": created, "model": name,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
                    "usage": usage}

        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            self._event(chunk({"role": "assistant", "content": ""}, None))
            sent = 0
            while True:
                try:
                    item = req.out.get(timeout=1.0)
                except queue.Empty:
                    if engine.stop.is_set():
                        raise ConnectionAbortedError("engine stopped")
                    continue
                if item[0] == "shutdown":
                    raise ConnectionAbortedError("engine stopped")
                _, think, text, finish = item
                delta = {}
                if think:
                    delta["reasoning_content"] = "".join(think)
                if text:
                    delta["content"] = "".join(text)
                sent += len(think) + len(text)
                if delta or finish is not None:
                    self._event(chunk(delta, finish, sent))
                if drop_after and sent >= drop_after and finish is None:
                    engine.cancel(req)
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if finish is not None:
                    break
            if include_usage:
                self._event({"id": req.rid, "object": "chat.completion.chunk", "created": created,
                             "model": name, "choices": [], "usage": _usage(req)})
            self._write(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, OSError):
            engine.cancel(req)

    def _event(self, payload: dict) -> None:
        self._write(b"data: " + json.dumps(payload).encode() + b"\n\n")

    def _write(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))


def _usage(req: SimRequest) -> dict:
    return {"prompt_tokens": req.prompt_tokens, "completion_tokens": req.generated,
            "total_tokens": req.prompt_tokens + req.generated}


class SimHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer carrying the engine; ``shutdown()`` also stops the scheduler and the socket."""
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address, engine: Engine):
        self.engine = engine
        super().__init__(address, _Handler)

    def shutdown(self) -> None:
        self.engine.shutdown()
        super().shutdown()
        self.server_close()


def serve(config: SimConfig, host: str, port: int, log: Callable[[str], None],
          ready: threading.Event | None = None) -> ThreadingHTTPServer:
    """Start the simulated head's HTTP API on host:port (0 = any free port) in background threads.

    Returns the server (``server.server_address`` has the port, ``server.engine`` the scheduler);
    call ``server.shutdown()`` to stop both. ``/health`` answers 503 until ``ready`` is set (if given).
    """
    engine = Engine(config, log, ready)
    server = SimHTTPServer((host, port), engine)
    engine.thread.start()
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="sim-http",
                     daemon=True).start()
    return server


@contextlib.contextmanager
def serving(config: SimConfig, log: Callable[[str], None] | None = None,
            ready: threading.Event | None = None) -> Iterator[tuple[SimHTTPServer, str]]:
    """Serve on 127.0.0.1 at a free port for a with-block: yields (server, base URL), shuts down after."""
    server = serve(config, "127.0.0.1", 0, log or (lambda line: None), ready)
    try:
        yield server, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


@contextlib.contextmanager
def serving_process(config: SimConfig, startup_timeout: float = 20.0) -> Iterator[tuple[subprocess.Popen, str]]:
    """Serve in a child process on 127.0.0.1 at a free port (own interpreter, own GIL): yields (process, URL).

    Use it when the caller's own threads must not share a GIL with the server (timing measurements).
    """
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(dataclasses.asdict(config), handle)
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--host", "127.0.0.1", "--port", "0",
                             "--config", handle.name, "--quiet"], stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], startup_timeout)
        line = proc.stdout.readline() if ready else ""
        match = re.match(r"Ready: API on port (\d+)", line)
        if not match:
            raise RuntimeError(f"the simulator did not start within {startup_timeout}s (said {line!r})")
        yield proc, f"http://127.0.0.1:{match.group(1)}"
    finally:
        os.unlink(handle.name)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Simulated SGLang head API (testbed)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8888)
    parser.add_argument("--config", help="JSON file with SimConfig fields")
    parser.add_argument("--time-scale", type=float)
    parser.add_argument("--max-running-requests", type=int)
    parser.add_argument("--enable-metrics", action="store_true")
    parser.add_argument("--quiet", action="store_true", help="do not print the engine's log lines")
    args = parser.parse_args(argv)
    fields = {}
    if args.config:
        with open(args.config) as handle:
            fields = json.load(handle)
    if args.time_scale is not None:
        fields["time_scale"] = args.time_scale
    if args.max_running_requests is not None:
        fields["max_running_requests"] = args.max_running_requests
    if args.enable_metrics:
        fields["enable_metrics"] = True
    log = (lambda line: None) if args.quiet else (lambda line: print(line, flush=True))
    server = serve(SimConfig(**fields), args.host, args.port, log)
    print(f"Ready: API on port {server.server_address[1]}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
