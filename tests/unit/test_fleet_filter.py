"""Inventory validation (plugins/filter/fleet.py): every bad shape is named, good ones pass."""
import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("fleet_filter", Path(__file__).parents[2] / "plugins/filter/fleet.py")
fleet = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fleet)


def hv(*hosts):
    return {name: {"fleet_rank": rank, "fleet_role": role} for name, rank, role in hosts}


GOOD3 = [("spark1", 0, "head"), ("spark2", 1, "worker"), ("spark3", 2, "worker")]


@pytest.mark.parametrize("hosts,tp,expected", [
    (GOOD3, 3, []),
    ([("a", 0, "head"), ("b", 1, "worker")], 2, []),
    (GOOD3[:2], 3, ["the fleet has 2 hosts (spark1, spark2) but fleet_tp_size is 3"]),
    ([("spark1", 0, "head"), ("spark2", 1, "worker"), ("spark3", 1, "worker")], 3,
     ["rank 1 is given to several hosts: spark2, spark3", "no host has rank(s) 2"]),
    ([("spark1", 1, "head"), ("spark2", 0, "worker"), ("spark3", 2, "worker")], 3,
     ["host spark1 has rank 1 and fleet_role head", "host spark2 has rank 0 and fleet_role worker"]),
    ([("spark1", 0, "head"), ("spark2", None, "worker"), ("spark3", 2, "worker")], 3,
     ["host spark2 has no valid fleet_rank"]),
    ([("spark1", 0, "head"), ("spark2", 1, "worker"), ("spark3", 5, "worker")], 3,
     ["host spark3 has rank 5, outside 0..2"]),
    (GOOD3, "three", ["fleet_tp_size must be an integer"]),
])
def test_problems_name_the_hosts(hosts, tp, expected):
    problems = fleet.fleet_problems(hv(*hosts), [h[0] for h in hosts], tp)
    for text in expected:
        assert any(text in p for p in problems), (text, problems)
    if not expected:
        assert problems == []


def test_empty_fleet():
    assert fleet.fleet_problems({}, [], 3) == ["the inventory has no hosts in group 'fleet'"]


def test_workers_first_order():
    hosts = hv(("b", 1, "worker"), ("a", 0, "head"), ("c", 2, "worker"))
    assert fleet.fleet_ranked(hosts, ["c", "a", "b"]) == ["a", "b", "c"]
    assert fleet.fleet_workers_first(hosts, ["c", "a", "b"]) == ["b", "c", "a"]
