# -*- coding: utf-8 -*-
"""Filters of the preflight role: the fleet parity table across ranks and the report of every node.

    {{ hostvars | preflight_parity(hosts, keys, required, per_node) }}
        -> {hosts, keys, rows, differences, notes, table, required}
    {{ hostvars | preflight_report(parity) }}                  -> [str]  (every node's checks, then the table)
    {{ registered | preflight_node_result(labels) }}           -> the node's summary, kept as preflight_result
                                                                  (module_utils/node_preflight_result.py)

Each host's ``preflight_result.parity`` (node_preflight_info's ``parity``) holds one string per key. Per key the
reference value is the most common one, a tie going to the lowest rank's; every host with another value is
a difference, reported on that host. Keys in ``per_node`` (the GID index: each rank's engine uses the index of its
own node) are expected to differ: their differences are ``notes``, shown but never a failure. Pure Python;
unit-tested without Ansible.
"""
from __future__ import annotations

import os
import sys
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "module_utils"))
from node_preflight_result import from_registered  # noqa: E402

NOT_READ = "not read"


def _rank(hostvars: Any, host: str) -> int:
    try:
        return int(hostvars[host].get("fleet_rank", 1 << 30))
    except (TypeError, ValueError):
        return 1 << 30


def preflight_parity(hostvars: Any, hosts: list, keys: list, required: bool = False, per_node: Any = ()) -> dict:
    ranked = sorted(hosts, key=lambda h: (_rank(hostvars, h), h))
    values = {}
    for host in ranked:
        result = hostvars[host].get("preflight_result") or {}
        parity = result.get("parity") or {}
        values[host] = {key: (NOT_READ if not parity else
                              ("unknown" if parity.get(key) is None else str(parity.get(key)))) for key in keys}
    rows, differences, notes = [], [], []
    per_node = set(per_node or ())
    for key in keys:
        column = {host: values[host][key] for host in ranked}
        counts = Counter(v for v in column.values() if v != NOT_READ)
        if not counts:
            rows.append({"key": key, "values": column, "reference": None, "differs": []})
            continue
        first = next((column[h] for h in ranked if column[h] != NOT_READ), None)
        reference = max(counts, key=lambda v: (counts[v], v == first))
        differs = [h for h in ranked if column[h] not in (reference, NOT_READ)]
        rows.append({"key": key, "values": column, "reference": reference, "differs": differs})
        if differs:
            same = [h for h in ranked if column[h] == reference]
            (notes if key in per_node else differences).append({
                "key": key, "reference": reference, "hosts": {h: column[h] for h in differs},
                "text": f"{key} differs on {', '.join(f'{h} ({column[h]})' for h in differs)} from "
                        f"{reference} on {', '.join(same)}"})
    return {"hosts": ranked, "keys": list(keys), "rows": rows, "differences": differences, "notes": notes,
            "per_node": sorted(per_node), "required": bool(required), "table": parity_table(ranked, rows)}


def parity_table(hosts: list, rows: list) -> list:
    """Fixed-width text: one line per key, a '*' after every value that differs from the reference."""
    cells = [["ITEM"] + hosts]
    for row in rows:
        cells.append([row["key"]] + [row["values"][h] + (" *" if h in row["differs"] else "") for h in hosts])
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]


def preflight_report(hostvars: Any, parity: dict) -> list:
    lines = []
    for host in parity["hosts"]:
        result = hostvars[host].get("preflight_result") or {}
        if result.get("error"):
            lines.append(f"== {host}: PREFLIGHT ERROR: {result['error']}")
            continue
        lines.append(f"== {host}: {str(result.get('verdict', NOT_READ)).upper()}")
        lines += [f"   {line}" for line in result.get("lines") or []]
    lines.append("== fleet parity" + (" (required)" if parity.get("required") else " (reported)"))
    lines += [f"   {line}" for line in parity["table"]]
    lines += [f"   DIFFERENCE: {d['text']}" for d in parity["differences"]]
    lines += [f"   PER NODE (expected, not a difference): {d['text']}" for d in parity.get("notes") or []]
    return lines


class FilterModule:
    def filters(self):
        return {"preflight_parity": preflight_parity, "preflight_report": preflight_report,
                "preflight_node_result": from_registered}
