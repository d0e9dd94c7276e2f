# -*- coding: utf-8 -*-
"""``autotune_plan``: one fleet-wide decision from every rank's ``autotune_cache`` inventory.

The rule (docs/reference.md section 4): a key is usable only when EVERY rank has a cache for it that is compatible with
the image and environment about to run, and the ranks' launch sidecars agree. Otherwise the key is invalidated
on ALL ranks together, so that no rank keeps a cache its peers lack (a hit on one rank and a retune on another
desynchronises the collectives).

    {{ per_host_results | autotune_plan(ranks, tp) }}

``per_host_results``: {host: the registered result of ``autotune_cache`` (state=present, with ``expected``)}.
``ranks``: {host: TP rank}. ``tp``: the TP size about to run. Pure Python; unit-tested without Ansible.
"""
from __future__ import annotations

from typing import Any, Optional

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - the plugin is always loaded by Ansible; tests may import it bare
    class AnsibleFilterError(ValueError):  # type: ignore[no-redef]
        pass


def _rank_map(ranks: Any, tp: int) -> dict:
    if not isinstance(ranks, dict) or not ranks:
        raise AnsibleFilterError(f"autotune_plan: ranks must be a dict of host -> rank, got {ranks!r}")
    by_rank: dict = {}
    for host, rank in ranks.items():
        try:
            r = int(rank)
        except (TypeError, ValueError):
            raise AnsibleFilterError(f"autotune_plan: rank of {host} is {rank!r}, not an integer") from None
        if not 0 <= r < tp:
            raise AnsibleFilterError(f"autotune_plan: {host} has rank {r}, outside 0..{tp - 1} for tp={tp}")
        if r in by_rank:
            raise AnsibleFilterError(f"autotune_plan: rank {r} is claimed by both {by_rank[r]} and {host}")
        by_rank[r] = host
    return by_rank


def _sidecar_fingerprint(entry: dict, rank: int) -> Optional[str]:
    for sidecar in entry.get("sidecars") or []:
        if sidecar.get("rank") == rank:
            return sidecar.get("content_sha256") or sidecar.get("sha256")
    return None


def autotune_plan(per_host_results: dict, ranks: dict, tp: int) -> dict:
    """Return {usable, invalidate, reasons, per_rank} (see the module docstring)."""
    try:
        tp = int(tp)
    except (TypeError, ValueError):
        raise AnsibleFilterError(f"autotune_plan: tp must be an integer, got {tp!r}") from None
    if tp < 1:
        raise AnsibleFilterError(f"autotune_plan: tp must be 1 or more, got {tp}")
    if not isinstance(per_host_results, dict):
        raise AnsibleFilterError("autotune_plan: expects a dict of host -> autotune_cache result, "
                                 f"got {type(per_host_results).__name__}")
    by_rank = _rank_map(ranks, tp)

    fleet_problems: list = []
    entries: dict = {}  # rank -> {key: entry}
    for r in range(tp):
        host = by_rank.get(r)
        if host is None:
            fleet_problems.append(f"rank {r} has no host in ranks, so its caches cannot be checked")
            entries[r] = None
            continue
        result = per_host_results.get(host)
        if not isinstance(result, dict) or result.get("failed") or result.get("skipped") \
                or not isinstance(result.get("keys"), list):
            fleet_problems.append(f"rank {r} ({host}) has no inventory (task missing, failed or skipped)")
            entries[r] = None
            continue
        entries[r] = {e["key"]: e for e in result["keys"] if isinstance(e, dict) and "key" in e}

    all_keys = sorted({k for table in entries.values() if table for k in table})
    usable, invalidate, reasons = [], [], {}
    per_rank = {
        r: {"host": by_rank.get(r), "present": [], "missing": [], "incompatible": [], "usable": [], "invalidate": []}
        for r in range(tp)
    }
    for key in all_keys:
        why = list(fleet_problems)
        fingerprints = {}
        for r in range(tp):
            table = entries[r]
            if table is None:
                continue
            host = by_rank[r]
            entry = table.get(key)
            if entry is None or r not in (entry.get("ranks_present") or []):
                why.append(f"rank {r} ({host}) has no cache for this key")
                per_rank[r]["missing"].append(key)
                continue
            per_rank[r]["present"].append(key)
            compatible = entry.get("compatible")
            if compatible is None:
                why.append(f"rank {r} ({host}): compatibility unknown (autotune_cache ran without expected)")
                per_rank[r]["incompatible"].append(key)
            elif not compatible:
                detail = "; ".join(entry.get("reasons") or []) or "incompatible"
                why.append(f"rank {r} ({host}): {detail}")
                per_rank[r]["incompatible"].append(key)
            fingerprints[r] = _sidecar_fingerprint(entry, r)
        if len(set(fingerprints.values())) > 1:
            shown = ", ".join(f"rank {r}: {(fp or 'none')[:12]}" for r, fp in sorted(fingerprints.items()))
            why.append(f"launch sidecars differ across ranks ({shown})")
        reasons[key] = why
        (invalidate if why else usable).append(key)
        for r in range(tp):
            per_rank[r]["invalidate" if why else "usable"].append(key)
    return {"usable": usable, "invalidate": invalidate, "reasons": reasons, "per_rank": per_rank,
            "tp": tp, "problems": fleet_problems}


class FilterModule:
    """sparkfleet autotune filters."""

    def filters(self) -> dict:
        return {"autotune_plan": autotune_plan}
