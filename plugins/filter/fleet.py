"""Filters about the fleet's shape: inventory validation and rank lookups (used by every entry playbook)."""
from __future__ import annotations

from typing import Any

ROLES = ("head", "worker")


def fleet_problems(hostvars: Any, hosts: list[str], tp_size: Any) -> list[str]:
    """Every reason the inventory cannot describe a TP fleet; empty when it can.

    One rank per node: ranks 0..tp-1 each exactly once, as many hosts as the tensor-parallel size,
    rank 0 is the head and every other rank a worker.
    """
    problems: list[str] = []
    if not hosts:
        return ["the inventory has no hosts in group 'fleet'"]
    try:
        tp = int(tp_size)
    except (TypeError, ValueError):
        return [f"fleet_tp_size must be an integer, not {tp_size!r}"]
    if tp < 1:
        problems.append(f"fleet_tp_size must be at least 1, not {tp}")
    if len(hosts) != tp:
        problems.append(f"the fleet has {len(hosts)} hosts ({', '.join(hosts)}) but fleet_tp_size is {tp}: "
                        "one rank per node needs exactly one host per rank")
    by_rank: dict[int, list[str]] = {}
    for host in hosts:
        hv = hostvars[host]
        rank = hv.get("fleet_rank")
        if rank is None or isinstance(rank, bool) or not str(rank).isdigit():
            problems.append(f"host {host} has no valid fleet_rank (got {rank!r})")
            continue
        by_rank.setdefault(int(rank), []).append(host)
        role = hv.get("fleet_role")
        if role not in ROLES:
            problems.append(f"host {host} has fleet_role {role!r}; expected one of {', '.join(ROLES)}")
        elif (int(rank) == 0) != (role == "head"):
            problems.append(f"host {host} has rank {rank} and fleet_role {role}: rank 0 must be the head "
                            "and every other rank a worker")
    for rank, owners in sorted(by_rank.items()):
        if len(owners) > 1:
            problems.append(f"rank {rank} is given to several hosts: {', '.join(owners)}")
        if tp >= 1 and rank >= tp:
            problems.append(f"host {owners[0]} has rank {rank}, outside 0..{tp - 1}")
    missing = [r for r in range(max(tp, 0)) if r not in by_rank]
    if missing and len(hosts) == tp:
        problems.append(f"no host has rank(s) {', '.join(map(str, missing))}")
    return problems


def fleet_ranked(hostvars: Any, hosts: list[str]) -> list[str]:
    """Hosts ordered by rank (head first)."""
    return sorted(hosts, key=lambda h: int(hostvars[h]["fleet_rank"]))


def fleet_workers_first(hostvars: Any, hosts: list[str]) -> list[str]:
    """Hosts in the order the recipe starts them: every worker, then the head."""
    ranked = fleet_ranked(hostvars, hosts)
    return ranked[1:] + ranked[:1]


class FilterModule:
    def filters(self):
        return {"fleet_problems": fleet_problems, "fleet_ranked": fleet_ranked,
                "fleet_workers_first": fleet_workers_first}
