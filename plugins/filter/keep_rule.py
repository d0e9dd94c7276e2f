"""Filters `keep_decision` and `autotune_comparable`: the rollout keep rule (module_utils/keep_rule.py) for playbooks."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "module_utils"))
from keep_rule import autotune_comparable, decide  # noqa: E402


def keep_decision(candidate, incumbent, guards=(), comparable=True, timing_valid=True, seed=0):
    return decide(candidate, incumbent, list(guards or []), bool(comparable), bool(timing_valid), int(seed))


def rollout_autotune_comparable(incumbent, candidate):
    """{comparable, incumbent, candidate, reason} from each arm's per-rank autotune outcomes."""
    return autotune_comparable(incumbent, candidate)


class FilterModule:
    def filters(self):
        return {"keep_decision": keep_decision, "autotune_comparable": rollout_autotune_comparable}
