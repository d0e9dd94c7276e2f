# -*- coding: utf-8 -*-
"""The serving env as text: what a key and a value may be, how an env file reads, and what is shown of a secret.

One place for the rules that the engine_env role (validate, render, drift), the engine_container module and
fleet_snapshot share (issue 19 items 12 and 13).

- A key is ``^[A-Za-z_][A-Za-z0-9_]*$``. A value holds no line break of any kind: not ``\\n``, ``\\r`` or NUL, and
  none of the other separators ``str.splitlines`` honours (``\\v``, ``\\f``, ``\\x1c``-``\\x1e``, ``\\x85``,
  ``\\u2028``, ``\\u2029``); an env file holds one ``KEY=value`` per line, and a value that a reader could split
  would be a second, phantom key.
- An env file is read as docker ``--env-file`` reads it: lines end at ``\\n`` only (a trailing ``\\r`` is dropped),
  leading whitespace is skipped, ``#`` comments and blank lines are skipped, the value is everything after the
  first ``=``, taken literally.
- A value whose key looks secret (``*_KEY``, ``*_TOKEN``, ``*_SECRET``, ``*PASSWORD*``, ``API_KEY``, plus the
  keys the caller lists, e.g. from ``sparkfleet_secret_env_keys``) is shown as ``********``; any other value is
  shown with the credentials of a URL (``user:pass@``) removed.

Plain Python, standard library only (runs on the hosts and on the controller).
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Optional

ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # used with fullmatch: "$" would accept "A\n"
# NUL plus every character str.splitlines() breaks a line at.
LINE_BREAKS = "\0\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
MASK = "********"
SECRET_SUFFIXES = ("_KEY", "_TOKEN", "_SECRET")
SECRET_NAMES = frozenset({"API_KEY"})
# scheme://user[:password]@host...: the userinfo part goes.
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#@\s]*@")


def key_problem(where: str, key: Any) -> Optional[str]:
    """Why `key` cannot be an env key (None when it can)."""
    if not isinstance(key, str) or not ENV_KEY.fullmatch(key):
        return f"{where} {key!r} is not a variable name ([A-Za-z_][A-Za-z0-9_]*, no '=' or spaces)"
    return None


def line_break_in(text: str) -> Optional[str]:
    """The first line break (or NUL) in `text`, as repr, or None."""
    for ch in text:
        if ch in LINE_BREAKS:
            return repr(ch)
    return None


def value_problem(where: str, value: Any) -> Optional[str]:
    """Why `value` cannot be an env value (None when it can): only strings and numbers, one line."""
    if isinstance(value, bool):
        return f"{where} is a boolean ({value}); env values are strings: quote it, e.g. \"1\" or \"0\""
    if value is None:
        return f"{where} has no value; write an explicit value (\"\" for empty)"
    if not isinstance(value, (str, int, float)):
        return f"{where} is a {type(value).__name__}; env values are strings"
    found = line_break_in(str(value))
    if found:
        return (f"{where} contains a newline or another line break or NUL ({found}); an env file holds one "
                "KEY=value per line, so write the value on one line")
    return None


def parse_env_file(text: str) -> dict:
    """An env file as docker --env-file reads it (lines end at \\n only): {KEY: value}."""
    out = {}
    for line in (text or "").split("\n"):
        if line.endswith("\r"):
            line = line[:-1]
        line = line.lstrip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        out[key] = value
    return out


def is_secret_key(key: Any, extra: Iterable = ()) -> bool:
    """Whether a value under `key` is a secret: *_KEY, *_TOKEN, *_SECRET, *PASSWORD*, API_KEY or one of `extra`."""
    name = str(key).upper()
    listed = {str(k).upper() for k in (extra or ())}
    return (name in SECRET_NAMES or name in listed or name.endswith(SECRET_SUFFIXES) or "PASSWORD" in name)


def strip_url_credentials(text: Any) -> Any:
    """`text` with the user:password@ of every URL in it removed (non-strings are returned as they are)."""
    if not isinstance(text, str):
        return text
    return _URL_USERINFO.sub(r"\1", text)


def mask_value(key: Any, value: Any, extra: Iterable = ()) -> Any:
    """What may be shown of `value` under `key`: MASK for a secret key, else the value without URL credentials."""
    if value is None:
        return None
    if is_secret_key(key, extra):
        return MASK
    return strip_url_credentials(value)


def mask_env(env: Any, extra: Iterable = ()) -> Any:
    """A copy of an env dict (or a docker ``KEY=value`` list) with every secret masked."""
    if isinstance(env, dict):
        return {k: mask_value(k, v, extra) for k, v in env.items()}
    if isinstance(env, (list, tuple)):
        out = []
        for item in env:
            if isinstance(item, str) and "=" in item:
                k, _, v = item.partition("=")
                out.append(f"{k}={mask_value(k, v, extra)}")
            else:
                out.append(item)
        return out
    return env


def mask_text(text: Any, env: Any, extra: Iterable = ()) -> Any:
    """`text` (a diff, a message) with the value of every secret key of `env` replaced by MASK, URL credentials
    removed. Values shorter than 4 characters are not searched for (they would mask unrelated text)."""
    if not isinstance(text, str):
        return text
    for key, value in (env or {}).items():
        if value is not None and is_secret_key(key, extra) and len(str(value)) >= 4:
            text = text.replace(str(value), MASK)
    return strip_url_credentials(text)


_LINE_ASSIGNMENT = re.compile(r"(?m)^([ \t]*(?:export[ \t]+)?)([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_WORD_ASSIGNMENT = re.compile(r"(?<![A-Za-z0-9_])([A-Za-z_][A-Za-z0-9_]*)=(\S*)")


def _mask_string(text: str, secrets: list, extra: Iterable) -> str:
    key, sep, _ = text.partition("=")
    if sep and "\n" not in text and ENV_KEY.fullmatch(key) and is_secret_key(key, extra):
        return f"{key}={MASK}"
    if text in secrets:
        return MASK
    for value in secrets:
        if len(value) >= 4:
            text = text.replace(value, MASK)
    # KEY=value lines (an env file, the diff's env section) and KEY=value words (-e KEY=value) of a secret key.
    text = _LINE_ASSIGNMENT.sub(lambda m: f"{m[1]}{m[2]}={MASK}" if is_secret_key(m[2], extra) else m[0], text)
    text = _WORD_ASSIGNMENT.sub(lambda m: f"{m[1]}={MASK}" if is_secret_key(m[1], extra) else m[0], text)
    return strip_url_credentials(text)


def mask_tree(obj: Any, secrets: Iterable = (), extra: Iterable = ()) -> Any:
    """A copy of a result (dicts, lists, strings) as it may be shown: under a secret-looking dict key the value is
    MASK; an env difference row ({what: env, key, desired, actual}) of a secret key has both values masked; a
    ``KEY=value`` string of a secret key becomes ``KEY=********``; every known secret value (`secrets`) found in a
    string is replaced by MASK; URLs lose their credentials."""
    extra = list(extra or ())
    known = sorted({str(s) for s in (secrets or ()) if s is not None and str(s) != ""}, key=len, reverse=True)

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            env_row = node.get("what") == "env" and is_secret_key(node.get("key", ""), extra)
            out = {}
            for k, v in node.items():
                if (is_secret_key(k, extra) and not isinstance(v, (dict, list))) or \
                        (env_row and k in ("desired", "actual", "want", "have")):
                    out[k] = None if v is None else MASK
                else:
                    out[k] = walk(v)
            return out
        if isinstance(node, (list, tuple)):
            return [walk(v) for v in node]
        if isinstance(node, str):
            return _mask_string(node, known, extra)
        return node

    return walk(obj)


def secret_values(env: Any, extra: Iterable = ()) -> list:
    """The values of the secret-looking keys of an env dict or docker ``KEY=value`` list."""
    pairs = env.items() if isinstance(env, dict) else \
        (str(i).partition("=")[::2] for i in (env or []) if isinstance(i, str) and "=" in i)
    return [str(v) for k, v in pairs if v is not None and is_secret_key(k, extra)]
