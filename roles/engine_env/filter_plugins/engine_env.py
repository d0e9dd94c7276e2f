# -*- coding: utf-8 -*-
"""Filters of the engine_env role: validate the desired serving env, split it into the part every rank shares
and the declared per-rank part, compare env across ranks and against files.

    {{ engine_env | engine_env_problems(engine_env_per_rank, fleet_rank, fleet_tp_size) }}  -> [str]
    {{ engine_env | engine_env_split(engine_env_per_rank, fleet_rank) }}   -> {shared: {..}, rank: {..}}
    {{ text | engine_env_parse }}                                          -> {KEY: value} (docker --env-file rules)
    {{ env | engine_env_fingerprint }}                                     -> sha256 of the autotune-relevant keys

``engine_env_per_rank`` maps an env key to either one value templated in each host's context
(``NODE_RANK: "{{ fleet_rank }}"``) or a table ``{rank: value}`` whose missing ranks keep ``engine_env``'s value.
A per-rank key must be NODE_RANK or a key of ``engine_env``; anything else is an unknown key (a typo would
otherwise silently add a variable to one rank). Pure Python; unit-tested without Ansible.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - tests may import the plugin bare
    class AnsibleFilterError(ValueError):  # type: ignore[no-redef]
        pass

ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RANK_KEY = "NODE_RANK"
# The keep adapter's launch fingerprint covers these prefixes minus volatile switches (FLEET.md section 4).
AUTOTUNE_PREFIXES = ("SGLANG_", "DSV41_", "SPARK_", "B12X_", "NCCL_")
AUTOTUNE_VOLATILE = frozenset({"DSV41_ENGRAM_PREFETCH_CHECK", "NCCL_DEBUG", "SGLANG_LOG_LEVEL"})


def _value_problem(where: str, value: Any) -> str | None:
    if isinstance(value, bool):
        return f"{where} is a boolean ({value}); env values are strings: quote it, e.g. \"1\" or \"0\""
    if value is None:
        return f"{where} has no value; write an explicit value (\"\" for empty)"
    if not isinstance(value, (str, int, float)):
        return f"{where} is a {type(value).__name__}; env values are strings"
    text = str(value)
    if any(c in text for c in "\n\r\0"):
        return f"{where} contains a newline or NUL; an env file holds one KEY=value per line"
    return None


def _key_problem(where: str, key: Any) -> str | None:
    if not isinstance(key, str) or not ENV_KEY.match(key):
        return f"{where} {key!r} is not a variable name ([A-Za-z_][A-Za-z0-9_]*, no '=' or spaces)"
    return None


def _rank_of(key: Any, tp: int | None) -> int | None:
    if isinstance(key, bool):
        return None
    if isinstance(key, int):
        rank = key
    elif isinstance(key, str) and key.isdigit():
        rank = int(key)
    else:
        return None
    if tp is not None and not 0 <= rank < tp:
        return None
    return rank


def engine_env_problems(env: Any, per_rank: Any, rank: Any = None, tp: Any = None) -> list:
    """Every reason the desired env cannot be rendered for this rank; empty when it can."""
    problems: list = []
    if not isinstance(env, dict) or not env:
        return [f"engine_env must be a non-empty dict of KEY: value, got {type(env).__name__}"]
    if not isinstance(per_rank, dict):
        return [f"engine_env_per_rank must be a dict of KEY: value or KEY: {{rank: value}}, got {type(per_rank).__name__}"]
    try:
        tp_n = int(tp) if tp is not None else None
    except (TypeError, ValueError):
        tp_n = None
    for key, value in env.items():
        problems += [p for p in (_key_problem("engine_env key", key), _value_problem(f"engine_env.{key}", value)) if p]
    if RANK_KEY not in per_rank:
        problems.append(f"engine_env_per_rank must declare {RANK_KEY} (each rank's own number)")
    for key, spec in per_rank.items():
        bad = _key_problem("engine_env_per_rank key", key)
        if bad:
            problems.append(bad)
            continue
        if key != RANK_KEY and key not in env:
            problems.append(f"engine_env_per_rank has an unknown key {key}: a per-rank key must be {RANK_KEY} or a "
                            f"key of engine_env (known: {', '.join(sorted(env))})")
            continue
        if isinstance(spec, dict):
            if key == RANK_KEY:
                problems.append(f"engine_env_per_rank.{RANK_KEY} must be one value templated per host "
                                "(\"{{ fleet_rank }}\"), not a table")
                continue
            for rank_key, value in spec.items():
                if _rank_of(rank_key, tp_n) is None:
                    span = f"0..{tp_n - 1}" if tp_n else "0 or more"
                    problems.append(f"engine_env_per_rank.{key} has an unknown rank {rank_key!r} (ranks are {span})")
                bad = _value_problem(f"engine_env_per_rank.{key}[{rank_key}]", value)
                if bad:
                    problems.append(bad)
        else:
            bad = _value_problem(f"engine_env_per_rank.{key}", spec)
            if bad:
                problems.append(bad)
    if problems or rank is None:
        return problems
    split = engine_env_split(env, per_rank, rank)
    if str(split["rank"].get(RANK_KEY)) != str(rank):
        problems.append(f"engine_env_per_rank.{RANK_KEY} gives {split['rank'].get(RANK_KEY)!r} on a host whose "
                        f"fleet_rank is {rank}")
    return problems


def engine_env_split(env: dict, per_rank: dict, rank: Any) -> dict:
    """{shared: keys every rank gets identically, rank: the declared per-rank keys for this rank}, all strings."""
    r = int(rank)
    shared = {str(k): str(v) for k, v in sorted(env.items()) if k not in per_rank}
    own = {}
    for key, spec in sorted(per_rank.items()):
        if isinstance(spec, dict):
            table = {_rank_of(k, None): v for k, v in spec.items()}
            if r in table:
                own[key] = str(table[r])
            elif key in env:
                own[key] = str(env[key])
            else:
                raise AnsibleFilterError(f"engine_env_per_rank.{key} has no value for rank {r} and engine_env has no "
                                         "default for it")
        else:
            own[key] = str(spec)
    return {"shared": shared, "rank": own}


def engine_env_parse(text: str) -> dict:
    """An env file as docker --env-file reads it: KEY=value lines, # comments and blank lines skipped."""
    out = {}
    for line in (text or "").splitlines():
        line = line.lstrip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        out[key] = value
    return out


def engine_env_fingerprint(env: dict) -> str:
    """sha256 over the keys that shape FlashInfer tactics (the keep adapter's prefixes, volatile switches left out)."""
    kept = sorted((str(k), str(v)) for k, v in (env or {}).items()
                  if str(k).startswith(AUTOTUNE_PREFIXES) and k not in AUTOTUNE_VOLATILE)
    return hashlib.sha256(json.dumps(kept).encode()).hexdigest()


def engine_env_cross_rank(envs: dict, per_rank_keys: list) -> list:
    """{host: env} -> [{key, values: {host: value}}] for every key not declared per-rank whose value differs."""
    keys = sorted({k for env in envs.values() for k in (env or {})} - set(per_rank_keys or []))
    out = []
    for key in keys:
        values = {host: (env or {}).get(key) for host, env in sorted(envs.items())}
        if len(set(values.values())) > 1:
            out.append({"key": key, "values": values})
    return out


class FilterModule:
    def filters(self):
        return {"engine_env_problems": engine_env_problems, "engine_env_split": engine_env_split,
                "engine_env_parse": engine_env_parse, "engine_env_fingerprint": engine_env_fingerprint,
                "engine_env_cross_rank": engine_env_cross_rank}
