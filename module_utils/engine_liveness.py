# -*- coding: utf-8 -*-
"""Post-ready liveness of the serving engine (docs/reference.md section 11): judged by generated tokens advancing during a
real request, never by /health, plus exact-answer smoke prompts.

A fleet once served one repeated token while /health, the model list and GPU use stayed green; another
deadlocked in a collective with /health green. So, after every boot:

1. ``liveness``: one real streaming chat completion (temperature 0, thinking off, ``ignore_eos``) with
   ``stream_options: {include_usage, continuous_usage_stats}``. The completion token count (per-chunk usage when
   the server sends it, else one per text chunk as a lower bound, and the final usage) must reach ``min_tokens``
   within ``timeout_s``, and no gap between two chunks that carry text may exceed ``stall_s``. A stream that opens
   and then produces nothing (a hang in a collective) is reported with what it did see: the seconds until the
   first token or the stall, and the token count reached.
2. ``smoke``: every prompt of the table (non-streaming, temperature 0, thinking off) must answer exactly its
   expected text (only surrounding whitespace is ignored). docs/reference.md section 8: "19 + 23" gives ``42``.

Standard library plus decode_client (runs on the head as a module). ``check(...)`` returns the verdict dict; nothing here
restarts anything.
"""
from __future__ import annotations

import http.client
import json
import os
import time
from typing import Callable, Optional
from urllib.parse import urlsplit

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.decode_client import Endpoint as _ClientEndpoint, EventStream, delta_text
from ansible.module_utils.module_alias import warn_if_deprecated

CHAT_PATH = "/v1/chat/completions"
DEFAULT_PROMPT = ("Write a short story about a lighthouse keeper who finds a message in a bottle. Describe the "
                  "weather, the sea and the keeper's evening routine in plain prose.")


class LivenessError(Exception):
    """Bad input: one sentence an operator can act on."""


class Endpoint(_ClientEndpoint):
    """decode_client's endpoint (one new connection per request), with the URL checked first."""

    def __init__(self, url: str, api_key: Optional[str]):
        parts = urlsplit(url or "")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise LivenessError(f"url must be http(s)://host:port, got {url!r}")
        super().__init__(url, api_key)

    def headers(self, json_body: bool = True) -> dict:
        return super().headers(json_body=json_body)


def _body(model: Optional[str], prompt: str, max_tokens: int, stream: bool) -> bytes:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "chat_template_kwargs": {"thinking": False}}
    if model:
        body["model"] = model
    if stream:
        body.update(stream=True, ignore_eos=True,
                    stream_options={"include_usage": True, "continuous_usage_stats": True})
    return json.dumps(body).encode()


def stream_progress(ep: Endpoint, model: Optional[str], prompt: str, max_tokens: int, min_tokens: int,
                    timeout_s: float, stall_s: float, clock: Callable[[], float] = time.monotonic) -> dict:
    """Send one streaming request and follow its completion token count. Returns
    {live, tokens, first_token_s, seconds, max_gap_s, progress: [[s, tokens]...], finish_reason, reason}."""
    started = clock()
    out = {"live": False, "tokens": 0, "first_token_s": None, "seconds": None, "max_gap_s": None,
           "progress": [], "finish_reason": None, "usage_per_chunk": False, "reason": ""}
    tokens, last_text, max_gap = 0, None, 0.0
    conn = ep.connection(min(stall_s, timeout_s))
    try:
        conn.request("POST", ep.base + CHAT_PATH, body=_body(model, prompt, max_tokens, True), headers=ep.headers())
        resp = conn.getresponse()
        if resp.status != 200:
            out["reason"] = f"HTTP {resp.status}: {resp.read(300).decode('utf-8', 'replace').strip()}"
            return out
        for now, event in EventStream(resp, clock):   # a read raises socket.timeout after stall_s without a byte
            now -= started
            if event.get("error"):
                out["reason"] = f"server error in the stream: {json.dumps(event['error'])[:200]}"
                return out
            usage = event.get("usage") or {}
            text = ""
            for choice in event.get("choices") or ():
                text += delta_text(choice)
                out["finish_reason"] = choice.get("finish_reason") or out["finish_reason"]
            counted = usage.get("completion_tokens")
            if isinstance(counted, int) and (text or not event.get("choices")):
                out["usage_per_chunk"] = out["usage_per_chunk"] or bool(text)
                tokens = max(tokens, counted)
            elif text:
                tokens += 1      # chunks are not tokens; without usage a text chunk proves at least one
            if text:
                if last_text is None:
                    out["first_token_s"] = round(now, 3)
                else:
                    max_gap = max(max_gap, now - last_text)
                last_text = now
                out["progress"].append([round(now, 3), tokens])
                if max_gap > stall_s:
                    out["reason"] = f"tokens stopped advancing: {max_gap:.1f} s between two chunks (stall_s {stall_s:g})"
                    break
            if tokens >= min_tokens and now <= timeout_s:
                out["live"] = True
                break          # proven: closing the stream makes the server abort the rest of the request
            if now > timeout_s:
                break
    except (OSError, http.client.HTTPException, ValueError) as exc:
        waited = clock() - started
        if last_text is None:
            out["reason"] = (f"no token within {waited:.1f} s of the request ({exc.__class__.__name__}): the stream "
                             "opened but generation does not advance")
        else:
            out["reason"] = (f"tokens stopped advancing at {tokens} after {waited:.1f} s "
                             f"({exc.__class__.__name__}: nothing for {stall_s:g} s)")
    finally:
        conn.close()
        out["tokens"] = tokens
        out["seconds"] = round(clock() - started, 3)
        out["max_gap_s"] = round(max_gap, 3) if last_text is not None else None
    if not out["live"] and not out["reason"]:
        out["reason"] = (f"{tokens} completion token(s) in {out['seconds']:.1f} s, fewer than the {min_tokens} "
                         f"required within {timeout_s:g} s")
    if out["live"]:
        out["reason"] = ""
    return out


def ask(ep: Endpoint, model: Optional[str], prompt: str, timeout_s: float, max_tokens: int = 16) -> dict:
    """One non-streaming completion: {answer, finish_reason, error}."""
    conn = ep.connection(timeout_s)
    try:
        conn.request("POST", ep.base + CHAT_PATH, body=_body(model, prompt, max_tokens, False), headers=ep.headers())
        resp = conn.getresponse()
        raw = resp.read()
        if resp.status != 200:
            return {"answer": None, "finish_reason": None,
                    "error": f"HTTP {resp.status}: {raw[:300].decode('utf-8', 'replace').strip()}"}
        reply = json.loads(raw)
        choice = (reply.get("choices") or [{}])[0]
        return {"answer": (choice.get("message") or {}).get("content"), "finish_reason": choice.get("finish_reason"),
                "error": None}
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return {"answer": None, "finish_reason": None, "error": f"{exc.__class__.__name__}: {exc}"}
    finally:
        conn.close()


def check(url: str, api_key: Optional[str] = None, model: Optional[str] = None, prompt: str = DEFAULT_PROMPT,
          max_tokens: int = 64, min_tokens: int = 16, timeout_s: float = 120.0, stall_s: float = 30.0,
          smoke: Optional[list] = None, smoke_timeout_s: float = 60.0) -> dict:
    """The verdict: {ok, live, liveness, smoke: [{prompt, expected, answer, ok, error}], problems}."""
    if min_tokens < 1 or max_tokens < min_tokens:
        raise LivenessError(f"need 1 <= min_tokens <= max_tokens, got min_tokens={min_tokens}, max_tokens={max_tokens}")
    if timeout_s <= 0 or stall_s <= 0:
        raise LivenessError(f"timeout_s and stall_s must be more than 0, got {timeout_s} and {stall_s}")
    for item in smoke or []:
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) or "answer" not in item:
            raise LivenessError(f"each smoke entry needs a prompt and its exact answer, got {item!r}")
    ep = Endpoint(url, api_key)
    live = stream_progress(ep, model, prompt, max_tokens, min_tokens, timeout_s, stall_s)
    problems = [] if live["live"] else [f"not live: {live['reason']}"]
    answers = []
    if live["live"]:   # a hung engine would only time out again on every prompt
        for item in smoke or []:
            got = ask(ep, model, item["prompt"], smoke_timeout_s)
            expected = str(item["answer"])
            ok = got["error"] is None and isinstance(got["answer"], str) and got["answer"].strip() == expected
            answers.append({"prompt": item["prompt"], "expected": expected, "answer": got["answer"], "ok": ok,
                            "error": got["error"]})
            if not ok:
                problems.append(f"smoke prompt {item['prompt']!r} answered "
                                + (got["error"] if got["error"] else json.dumps(got["answer"]))
                                + f", expected exactly {json.dumps(expected)}")
    return {"ok": not problems, "live": live["live"], "liveness": live, "smoke": answers, "problems": problems}


def run_module(name: str) -> None:
    """The engine_liveness_info module (and its deprecated alias engine_liveness): judge the engine the arguments
    name and exit with the verdict (failing with one message per problem)."""
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            api_key_file=dict(type="path"),
            model=dict(type="str"),
            prompt=dict(type="str"),
            max_tokens=dict(type="int", default=64, no_log=False),
            min_tokens=dict(type="int", default=16, no_log=False),
            timeout_s=dict(type="float", default=120.0),
            stall_s=dict(type="float", default=30.0),
            smoke=dict(type="list", elements="dict", default=[]),
            smoke_timeout_s=dict(type="float", default=60.0),
        ),
        mutually_exclusive=[("api_key", "api_key_file")],
        supports_check_mode=True,
    )
    warn_if_deprecated(module, name)
    p = module.params
    key = p["api_key"]
    if p["api_key_file"] and os.path.exists(p["api_key_file"]):
        try:
            with open(p["api_key_file"]) as fh:
                key = fh.read().strip() or None
        except OSError as exc:
            module.fail_json(msg=f"cannot read the API key file {p['api_key_file']}: {exc.strerror or exc}")
    try:
        result = check(p["url"], key, p["model"], p["prompt"] or DEFAULT_PROMPT, p["max_tokens"], p["min_tokens"],
                       p["timeout_s"], p["stall_s"], p["smoke"], p["smoke_timeout_s"])
    except LivenessError as exc:
        module.fail_json(msg=str(exc))
    result.pop("ok")
    if result["problems"]:
        module.fail_json(msg=f"{p['url']}: " + "; ".join(result["problems"]), changed=False, **result)
    lv = result["liveness"]
    module.exit_json(changed=False, msg=f"{p['url']}: live ({lv['tokens']} tokens in {lv['seconds']} s, first after "
                                        f"{lv['first_token_s']} s); {len(result['smoke'])} smoke prompt(s) answered exactly",
                     **result)
