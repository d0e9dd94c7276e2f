"""Filters of the experiment catalog (module_utils/experiments.py): `to_data_yaml`, a variables file whose
strings are data (every one tagged !unsafe), for the incumbent file the rollout writes; `rollout_trial_phase`,
how far a trial rollout's run folder got.

    {{ _rollout_incumbent | to_data_yaml('written by playbooks/rollout.yml') }}
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "module_utils"))
from experiments import data_yaml, trial_phase  # noqa: E402


def _plain(value):
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value) if isinstance(value, str) else value


def to_data_yaml(data, comment=""):
    """YAML for a variables file whose strings are all !unsafe (never templated when loaded)."""
    return data_yaml(_plain(data), str(comment))


class FilterModule:
    def filters(self):
        return {"to_data_yaml": to_data_yaml,
                "rollout_trial_phase": lambda folder: trial_phase(str(folder))}
