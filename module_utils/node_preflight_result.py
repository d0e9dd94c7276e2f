# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One node's preflight summary as the preflight role keeps it (the host fact ``preflight_result``): verdict, ok,
error, failed and warned checks, lines, checks, parity, packages and ``gid`` (the RoCE v2 GID resolved per HCA,
``{hca: {port, index, gid, ndev}}``), plus the caller's labels (host, rank).

node_preflight_info returns no ansible_facts: the role builds the fact from its registered result with the filter
``preflight_node_result`` (plugins/filter/preflight.py); the deprecated alias node_preflight still returns it as
ansible_facts itself (options fact_name/fact_labels). Both go through ``summary`` here. Standard library only.
"""
from __future__ import annotations

NO_ANSWER = "node_preflight_info gave no answer"


def summary(result, error: str, labels) -> dict:
    """The node's summary from the module's result (None when it failed) and the failure message."""
    result = result or {}
    checks = result.get("checks") or []
    gid = next((c.get("facts", {}).get("hcas") for c in checks if c.get("name") == "gid"), None) or {}
    out = dict(labels or {})
    out.update(verdict=result.get("verdict", "not read"), ok=bool(result.get("ok", False)), error=error,
               failed_checks=result.get("failed_checks", []), warned_checks=result.get("warned_checks", []),
               lines=result.get("lines", []), checks=checks, parity=result.get("parity", {}),
               packages=result.get("packages", {}), gid=gid)
    return out


def from_registered(registered, labels) -> dict:
    """The summary from a registered node_preflight_info result: its verdicts when it answered, else its failure
    message (bad input, or a module that crashed) as ``error``."""
    registered = registered if isinstance(registered, dict) else {}
    if registered.get("failed") or "verdict" not in registered:
        return summary(None, str(registered.get("msg") or NO_ANSWER), labels)
    return summary(registered, "", labels)
