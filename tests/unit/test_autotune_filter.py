"""plugins/filter/autotune.py: autotune_plan, the all-ranks-together rule, as a table of cases."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

_spec = importlib.util.spec_from_file_location(
    "sparkfleet_filter_autotune", Path(__file__).resolve().parents[2] / "plugins" / "filter" / "autotune.py")
autotune_filter = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(autotune_filter)
autotune_plan = autotune_filter.autotune_plan

# Entries are trimmed autotune_cache results: only what the filter reads (key, ranks_present, compatible,
# reasons, sidecars). `want.reasons` lists, per key, the exact reasons in order.
CASES = yaml.safe_load(r"""
- name: every rank compatible, sidecars agree -> usable
  tp: 3
  ranks: {spark1: 0, spark2: 1, spark3: 2}
  results:
    spark1: {keys: [{key: 0.6.1/sm121/aaaaaaaaaaaaaaaa, ranks_present: [0], compatible: true, sidecars: [{rank: 0, content_sha256: f1}]}]}
    spark2: {keys: [{key: 0.6.1/sm121/aaaaaaaaaaaaaaaa, ranks_present: [1], compatible: true, sidecars: [{rank: 1, content_sha256: f1}]}]}
    spark3: {keys: [{key: 0.6.1/sm121/aaaaaaaaaaaaaaaa, ranks_present: [2], compatible: true, sidecars: [{rank: 2, content_sha256: f1}]}]}
  want:
    usable: [0.6.1/sm121/aaaaaaaaaaaaaaaa]
    invalidate: []
    reasons: {0.6.1/sm121/aaaaaaaaaaaaaaaa: []}

- name: one rank lacks the key -> invalidated on all ranks
  tp: 3
  ranks: {spark1: 0, spark2: 1, spark3: 2}
  results:
    spark1: {keys: [{key: 0.6.1/sm121/aaaaaaaaaaaaaaaa, ranks_present: [0], compatible: true}]}
    spark2: {keys: [{key: 0.6.1/sm121/aaaaaaaaaaaaaaaa, ranks_present: [1], compatible: true}]}
    spark3: {keys: []}
  want:
    usable: []
    invalidate: [0.6.1/sm121/aaaaaaaaaaaaaaaa]
    reasons: {0.6.1/sm121/aaaaaaaaaaaaaaaa: ["rank 2 (spark3) has no cache for this key"]}
    per_rank.2.missing: [0.6.1/sm121/aaaaaaaaaaaaaaaa]
    per_rank.0.invalidate: [0.6.1/sm121/aaaaaaaaaaaaaaaa]

- name: one rank incompatible (new image) -> invalidated on all ranks; the other key stays usable
  tp: 2
  ranks: {a: 0, b: 1}
  results:
    a: {keys: [{key: 0.6.1/sm121/aaaaaaaaaaaaaaaa, ranks_present: [0], compatible: true},
               {key: 0.6.1/sm121/bbbbbbbbbbbbbbbb, ranks_present: [0], compatible: true}]}
    b: {keys: [{key: 0.6.1/sm121/aaaaaaaaaaaaaaaa, ranks_present: [1], compatible: false,
                reasons: ["image_digest differs: cache 'sha256:old', about to run 'sha256:new'"]},
               {key: 0.6.1/sm121/bbbbbbbbbbbbbbbb, ranks_present: [1], compatible: true}]}
  want:
    usable: [0.6.1/sm121/bbbbbbbbbbbbbbbb]
    invalidate: [0.6.1/sm121/aaaaaaaaaaaaaaaa]
    reasons.0.6.1/sm121/aaaaaaaaaaaaaaaa: ["rank 1 (b): image_digest differs: cache 'sha256:old', about to run 'sha256:new'"]
    per_rank.1.incompatible: [0.6.1/sm121/aaaaaaaaaaaaaaaa]

- name: sidecars differ across ranks (launch env drifted) -> invalidated
  tp: 2
  ranks: {a: 0, b: 1}
  results:
    a: {keys: [{key: 0.6.1/sm121/aaaaaaaaaaaaaaaa, ranks_present: [0], compatible: true, sidecars: [{rank: 0, content_sha256: 1111111111111111aaaa}]}]}
    b: {keys: [{key: 0.6.1/sm121/aaaaaaaaaaaaaaaa, ranks_present: [1], compatible: true, sidecars: [{rank: 1, content_sha256: 2222222222222222bbbb}]}]}
  want:
    invalidate: [0.6.1/sm121/aaaaaaaaaaaaaaaa]
    reasons.0.6.1/sm121/aaaaaaaaaaaaaaaa: ["launch sidecars differ across ranks (rank 0: 111111111111, rank 1: 222222222222)"]

- name: a sidecar on one rank only also differs
  tp: 2
  ranks: {a: 0, b: 1}
  results:
    a: {keys: [{key: 0.6.1/sm121/aaaaaaaaaaaaaaaa, ranks_present: [0], compatible: true, sidecars: [{rank: 0, content_sha256: f1}]}]}
    b: {keys: [{key: 0.6.1/sm121/aaaaaaaaaaaaaaaa, ranks_present: [1], compatible: true, sidecars: []}]}
  want:
    invalidate: [0.6.1/sm121/aaaaaaaaaaaaaaaa]
    reasons.0.6.1/sm121/aaaaaaaaaaaaaaaa: ["launch sidecars differ across ranks (rank 0: f1, rank 1: none)"]

- name: no expected given (compatible null) is not proof of compatibility
  tp: 1
  ranks: {a: 0}
  results:
    a: {keys: [{key: 0.6.1/sm121/aaaaaaaaaaaaaaaa, ranks_present: [0], compatible: null}]}
  want:
    usable: []
    reasons.0.6.1/sm121/aaaaaaaaaaaaaaaa: ["rank 0 (a): compatibility unknown (autotune_cache ran without expected)"]

- name: a rank whose inventory failed makes every key unusable; a rank missing from ranks too
  tp: 3
  ranks: {a: 0, b: 1}
  results:
    a: {keys: [{key: 0.6.1/sm121/aaaaaaaaaaaaaaaa, ranks_present: [0], compatible: true}]}
    b: {failed: true, msg: "unreachable"}
  want:
    usable: []
    invalidate: [0.6.1/sm121/aaaaaaaaaaaaaaaa]
    problems: ["rank 1 (b) has no inventory (task missing, failed or skipped)",
               "rank 2 has no host in ranks, so its caches cannot be checked"]
    per_rank.2.host: null

- name: a key directory holding another rank's file only does not count as this rank's cache
  tp: 2
  ranks: {a: 0, b: 1}
  results:
    a: {keys: [{key: 0.6.1/sm121/aaaaaaaaaaaaaaaa, ranks_present: [0], compatible: true}]}
    b: {keys: [{key: 0.6.1/sm121/aaaaaaaaaaaaaaaa, ranks_present: [0], compatible: true}]}
  want:
    invalidate: [0.6.1/sm121/aaaaaaaaaaaaaaaa]
    reasons.0.6.1/sm121/aaaaaaaaaaaaaaaa: ["rank 1 (b) has no cache for this key"]

- name: nothing cached anywhere -> empty plan
  tp: 3
  ranks: {a: 0, b: 1, c: 2}
  results: {a: {keys: []}, b: {keys: []}, c: {keys: []}}
  want: {usable: [], invalidate: [], reasons: {}, problems: []}
""")


def _dig(node, dotted):
    parts = dotted.split(".")
    i = 0
    while i < len(parts):
        for j in range(len(parts), i, -1):
            key = ".".join(parts[i:j])
            for candidate in (key, int(key) if key.isdigit() else None):
                if isinstance(node, dict) and candidate in node:
                    node = node[candidate]
                    i = j
                    break
            else:
                continue
            break
        else:
            raise KeyError(dotted)
    return node


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_plan_table(case):
    plan = autotune_plan(case["results"], case["ranks"], case["tp"])
    for path, want in case["want"].items():
        assert _dig(plan, path) == want, path
    assert sorted(plan["usable"] + plan["invalidate"]) == sorted(plan["reasons"])


@pytest.mark.parametrize("results, ranks, tp, message", [
    ({}, {"a": 0, "b": 0}, 2, "rank 0 is claimed by both a and b"),
    ({}, {"a": 3}, 3, "a has rank 3, outside 0..2 for tp=3"),
    ({}, {"a": "x"}, 1, "rank of a is 'x', not an integer"),
    ({}, {}, 1, "ranks must be a dict of host -> rank"),
    ([], {"a": 0}, 1, "expects a dict of host -> autotune_cache result"),
    ({}, {"a": 0}, 0, "tp must be 1 or more"),
])
def test_bad_input_is_a_filter_error(results, ranks, tp, message):
    with pytest.raises(autotune_filter.AnsibleFilterError, match=message):
        autotune_plan(results, ranks, tp)


def test_registered_as_a_filter():
    assert autotune_filter.FilterModule().filters()["autotune_plan"] is autotune_plan


def test_string_ranks_and_tp_from_inventory_vars():
    results = {"a": {"keys": [{"key": "0.6.1/sm121/aaaaaaaaaaaaaaaa", "ranks_present": [0], "compatible": True}]}}
    assert autotune_plan(results, {"a": "0"}, "1")["usable"] == ["0.6.1/sm121/aaaaaaaaaaaaaaaa"]
