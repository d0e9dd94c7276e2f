# -*- coding: utf-8 -*-
# Copyright: (c) sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Drift rows that compare ranks with each other, not a rank with its role's desired state (issue 25 item 5).

A role's check-mode result says whether one host is as the role wants it; some drift is only visible across
hosts: a rank whose engine env differs from rank 0's in a key that is not per-rank, NCCL GID keys set on some
ranks only (a rank without them picks GID index 0, another type than its peers), two adapters images serving.
Each comparison is data (``drift_across_ranks`` in playbooks/drift.yml), read from the results the
drift_collect callback kept (module_utils/drift.py ROW_BUILDERS actions):

    {item, action, value: "<dotted path in the result>", compare: same_as_reference | set_on_all | one_value,
     reference: <node>, keys: [...] (only these), except: [...] (not these), desired: "<text>", fix: "<command>"}

- ``same_as_reference``: each other node's value against the reference node's (a dict: the keys that differ,
  with both values); one row per node but the reference; a node without the value is not comparable (drift).
- ``set_on_all``: a dict's ``keys`` are set on every node that has the value, or on none; one row per node.
- ``one_value``: one value on every node that has it (nodes without it, e.g. no container, take no part).
A node without a kept result of ``action`` takes no part (its role was not in drift_roles); the row's fix is the
comparison's own ``fix``, which names the playbook and variable that fix it (issue 20 item 7).
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional

_MISSING = object()


def value_at(result: Any, path: str) -> Any:
    """The value under a dotted path of a module result (None where a step is absent or null)."""
    for step in str(path).split("."):
        if not isinstance(result, dict):
            return None
        result = result.get(step)
    return result


def _shown(value: Any) -> str:
    text = str(value)
    return text[7:19] if text.startswith("sha256:") else text


def _kept(records: List[dict], action: str) -> Any:
    """The result of the first kept, successful record of this action, or _MISSING."""
    for record in records:
        if record.get("action") == action and record.get("status") == "ok" and isinstance(record.get("result"), dict):
            return record["result"]
    return _MISSING


def _select(value: Any, comparison: dict) -> Any:
    if not isinstance(value, dict):
        return value
    keys, skip = comparison.get("keys"), set(comparison.get("except") or [])
    return {k: v for k, v in value.items() if (keys is None or k in keys) and k not in skip}


def _same_as_reference(values: Dict[str, Any], comparison: dict) -> Dict[str, dict]:
    ref = comparison.get("reference") or next(iter(values))
    want = values.get(ref)
    rows = {}
    for node, have in values.items():
        if node == ref:
            continue
        if want is None or have is None:
            absent = ref if want is None else node
            rows[node] = {"actual": f"not comparable (no container on {absent})", "drifted": True}
            continue
        if isinstance(want, dict) and isinstance(have, dict):
            diff = [f"{k}={have.get(k, '(absent)')} (rank 0: {want.get(k, '(absent)')})"
                    for k in sorted(set(want) | set(have)) if want.get(k, _MISSING) != have.get(k, _MISSING)]
        else:
            diff = [] if want == have else [f"{_shown(have)} (rank 0: {_shown(want)})"]
        rows[node] = {"actual": "differs: " + ", ".join(diff) if diff else "same", "drifted": bool(diff)}
    return rows


def _set_on_all(values: Dict[str, Any], comparison: dict) -> Dict[str, dict]:
    keys = list(comparison.get("keys") or [])
    present = {n: v for n, v in values.items() if isinstance(v, dict)}
    if not present:
        return {}
    mixed = any(len({k in v for v in present.values()}) > 1 for k in keys)
    if mixed:
        actual = "differ: " + ", ".join(
            f"{n} " + " ".join(f"{k}={v.get(k, '(unset)')}" for k in keys) for n, v in present.items())
    else:
        actual = ("set on " if keys and keys[0] in next(iter(present.values())) else "unset on ") + \
            f"{len(present)} rank(s)"
    return {n: {"actual": actual, "drifted": mixed} for n in present}


def _one_value(values: Dict[str, Any], comparison: dict) -> Dict[str, dict]:
    present = {n: v for n, v in values.items() if v is not None}
    if not present:
        return {}
    distinct = {repr(v) for v in present.values()}
    if len(distinct) == 1:
        actual = f"same on {len(present)} rank(s): {_shown(next(iter(present.values())))}"
    else:
        actual = "differ: " + ", ".join(f"{n} {_shown(v)}" for n, v in present.items())
    return {n: {"actual": actual, "drifted": len(distinct) > 1} for n in values}


COMPARES = {"same_as_reference": _same_as_reference, "set_on_all": _set_on_all, "one_value": _one_value}


def across_rank_rows(records: Dict[str, List[dict]], nodes: Iterable[str],
                     comparisons: Optional[List[dict]]) -> Dict[str, List[dict]]:
    """Per node its cross-rank rows {item, desired, actual, drifted, fix}, in comparison order."""
    out: Dict[str, List[dict]] = {}
    nodes = list(nodes)
    for comparison in comparisons or []:
        compare = COMPARES.get(str(comparison.get("compare")))
        if compare is None:
            raise ValueError(f"drift_across_ranks {comparison.get('item')!r}: compare must be one of "
                             f"{', '.join(COMPARES)}, not {comparison.get('compare')!r}")
        values = {}
        for node in nodes:
            result = _kept(records.get(node) or [], str(comparison.get("action")))
            if result is not _MISSING:
                value = value_at(result, str(comparison.get("value")))
                values[node] = None if value is None else _select(value, comparison)
        if not values:
            continue
        for node, row in compare(values, comparison).items():
            out.setdefault(node, []).append({
                "item": comparison.get("item"), "desired": comparison.get("desired") or "the same on every rank",
                "actual": row["actual"], "drifted": row["drifted"], "fix": comparison.get("fix") or ""})
    return out
