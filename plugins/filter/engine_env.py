# -*- coding: utf-8 -*-
"""Filters of the engine_env role: validate the desired serving env, split it into the part every rank shares
and the declared per-rank part, compare env across ranks and against files.

    {{ engine_env | engine_env_problems(engine_env_per_rank, fleet_rank, fleet_tp_size) }}  -> [str]
    {{ engine_env | engine_env_split(engine_env_per_rank, fleet_rank) }}   -> {shared: {..}, rank: {..}}
    {{ text | engine_env_parse }}                                          -> {KEY: value} (docker --env-file rules)
    {{ env | engine_env_masked(sparkfleet_secret_env_keys) }}              -> env as shown (secrets ********)
    {{ env | engine_env_fingerprint }}                                     -> sha256 of the autotune-relevant keys
    {{ engine_env | engine_env_gid_problems(engine_env_per_rank, mode) }}  -> [str]  (NCCL GID keys vs the mode)
    {{ resolved_hcas | engine_env_gid_keys }}                          -> {keys: {NCCL_IB_GID_INDEX, NCCL_IB_HCA}, problem}
    {{ env | engine_env_gid_check(resolved_hcas, host, rank, address) }}  -> '' or why a pinned index is wrong here

``engine_env_per_rank`` maps an env key to either one value templated in each host's context
(``NODE_RANK: "{{ fleet_rank }}"``) or a table ``{rank: value}`` whose missing ranks keep ``engine_env``'s value.
A per-rank key must be NODE_RANK or a key of ``engine_env``; anything else is an unknown key (a typo would
otherwise silently add a variable to one rank). Pure Python; unit-tested without Ansible.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - tests may import the plugin bare
    class AnsibleFilterError(ValueError):  # type: ignore[no-redef]
        pass

# Keys, values and env files follow module_utils/env_text (one place for the module, the snapshot and this role).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "module_utils"))
from env_text import key_problem as _key_problem, mask_env, parse_env_file, value_problem as _value_problem  # noqa: E402,E501
RANK_KEY = "NODE_RANK"
# The RoCE v2 GID index and the HCA NCCL uses: per node, resolved at every start (docs/reference.md section 11).
GID_KEYS = ("NCCL_IB_GID_INDEX", "NCCL_IB_HCA")
GID_MODES = ("resolved", "pinned", "unmanaged")
# The keep adapter's launch fingerprint covers these prefixes minus volatile switches (docs/reference.md section 4). The GID
# keys are volatile: they differ per node and move after a reboot without changing any tactic, so neither the
# cache provenance nor the ranks' launch sidecars may depend on them.
AUTOTUNE_PREFIXES = ("SGLANG_", "DSV41_", "SPARK_", "B12X_", "NCCL_")
AUTOTUNE_VOLATILE = frozenset({"DSV41_ENGRAM_PREFETCH_CHECK", "NCCL_DEBUG", "SGLANG_LOG_LEVEL"} | set(GID_KEYS))


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
    """An env file as docker --env-file reads it (lines end at \\n only): KEY=value lines, # comments and blank
    lines skipped (module_utils/env_text.parse_env_file)."""
    return parse_env_file(text)


def engine_env_masked(env: Any, extra: Any = ()) -> Any:
    """The env as it may be shown: values of secret-looking keys as ********, URLs without credentials."""
    return mask_env(env, extra or ())


def engine_env_fingerprint(env: dict) -> str:
    """sha256 over the keys that shape FlashInfer tactics (the keep adapter's prefixes, volatile switches left out)."""
    kept = sorted((str(k), str(v)) for k, v in (env or {}).items()
                  if str(k).startswith(AUTOTUNE_PREFIXES) and k not in AUTOTUNE_VOLATILE)
    return hashlib.sha256(json.dumps(kept).encode()).hexdigest()


def engine_env_gid_problems(env: Any, per_rank: Any, mode: Any) -> list:
    """Why the NCCL GID keys of the desired env do not fit engine_env_nccl_gid (empty when they do).

    resolved: the role sets NCCL_IB_GID_INDEX and NCCL_IB_HCA per rank, so engine_env and engine_env_per_rank must not
    (a second source would be silently overridden). pinned: the operator's NCCL_IB_GID_INDEX must be in engine_env
    (optionally a {rank: value} table in engine_env_per_rank). unmanaged: whatever engine_env says."""
    if mode not in GID_MODES:
        return [f"engine_env_nccl_gid must be one of {', '.join(GID_MODES)}, got {mode!r}"]
    env = env if isinstance(env, dict) else {}
    per_rank = per_rank if isinstance(per_rank, dict) else {}
    problems = []
    if mode == "resolved":
        for key in GID_KEYS:
            where = [name for name, table in (("engine_env", env), ("engine_env_per_rank", per_rank)) if key in table]
            if where:
                problems.append(f"{' and '.join(where)} set {key}, but engine_env_nccl_gid is resolved (each rank gets "
                                f"the RoCE v2 GID index resolved on its node at every start): remove {key}, or set "
                                "engine_env_nccl_gid: pinned to use your value (checked against the node's GID "
                                "table), or unmanaged to leave NCCL's keys to engine_env")
    elif mode == "pinned" and GID_KEYS[0] not in env:
        problems.append(f"engine_env_nccl_gid is pinned but engine_env has no {GID_KEYS[0]}: add it (and a "
                        f"{{rank: value}} table in engine_env_per_rank where nodes differ), or use resolved")
    return problems


def _hca_rows(hcas: Any) -> list:
    rows = []
    for name, row in sorted((hcas or {}).items()) if isinstance(hcas, dict) else []:
        if isinstance(row, dict) and row.get("index") is not None:
            rows.append((str(name), int(row.get("port") or 1), int(row["index"]), row.get("gid")))
    return rows


def engine_env_gid_keys(hcas: Any) -> dict:
    """{keys: {NCCL_IB_GID_INDEX, NCCL_IB_HCA}, problem} from one node's resolved {hca: {port, index, gid, ndev}}."""
    rows = _hca_rows(hcas)
    if not rows:
        return {"keys": {}, "problem": "no RoCE v2 GID was resolved on this node (see the preflight's gid check)"}
    indices = sorted({index for _, _, index, _ in rows})
    if len(indices) > 1:
        return {"keys": {}, "problem": "the fabric HCAs resolved different GID indices ("
                + ", ".join(f"{n}:{p} index {i}" for n, p, i, _ in rows) + "); NCCL_IB_GID_INDEX is one index for "
                "every HCA: name one HCA in engine_env_nccl_gid_hcas (preflight_hcas)"}
    return {"keys": {GID_KEYS[0]: str(indices[0]), GID_KEYS[1]: ",".join(f"{n}:{p}" for n, p, _, _ in rows)},
            "problem": ""}


def engine_env_gid_check(env: Any, hcas: Any, host: Any = "", rank: Any = "", address: Any = "") -> str:
    """'' when this rank's pinned NCCL_IB_GID_INDEX (and NCCL_IB_HCA, if pinned) is the RoCE v2 GID resolved on its
    node; otherwise one sentence naming the node, the pin and the resolved index."""
    env = env if isinstance(env, dict) else {}
    rows = _hca_rows(hcas)
    pin = env.get(GID_KEYS[0])
    if pin is None:
        return ""
    if not rows:
        return (f"{host} (rank {rank}): NCCL_IB_GID_INDEX is pinned to {pin} but no RoCE v2 GID of {address} was "
                "resolved on this node to check it against")
    described = ", ".join(f"{n} port {p} index {i}" for n, p, i, _ in rows)
    try:
        pinned = int(str(pin))
    except ValueError:
        return f"{host} (rank {rank}): NCCL_IB_GID_INDEX={pin!r} is not an integer"
    if any(i != pinned for _, _, i, _ in rows):
        return (f"{host} (rank {rank}): NCCL_IB_GID_INDEX is pinned to {pinned} but the RoCE v2 GID of {address} is "
                f"at {described} on this node now (GID indices move after reboots and netplan re-applies; a stale "
                "pin fails this rank's NCCL init): set engine_env_nccl_gid: resolved, or correct the pin")
    hca_pin = env.get(GID_KEYS[1])
    if hca_pin:
        names = {n for n, _, _, _ in rows}
        wanted = [part.split(":")[0].lstrip("=^") for part in str(hca_pin).split(",") if part.strip()]
        if not any(name.startswith(w) for w in wanted for name in names) or str(hca_pin).startswith("^"):
            return (f"{host} (rank {rank}): NCCL_IB_HCA is pinned to {hca_pin} but the RoCE v2 GID of {address} is on "
                    f"{described}")
    return ""


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
                "engine_env_cross_rank": engine_env_cross_rank, "engine_env_gid_problems": engine_env_gid_problems,
                "engine_env_gid_keys": engine_env_gid_keys, "engine_env_gid_check": engine_env_gid_check,
                "engine_env_masked": engine_env_masked}
