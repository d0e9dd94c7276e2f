"""Filter `experiment_playbook_argv`: the nested ansible-playbook command of an experiment's apply or
revert step (module_utils/experiments.py), for playbooks/rollout.yml; `to_data_yaml`: a variables file
whose strings are data (every one tagged !unsafe), for the incumbent file the rollout writes.

    {{ _rollout_exp.apply | experiment_playbook_argv(ansible_playbook, playbook_dir, inventory, '@vars.json') }}
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "module_utils"))
from experiments import data_yaml, playbook_argv, trial_phase  # noqa: E402

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - the plugin is always loaded by Ansible; tests may import it bare
    class AnsibleFilterError(ValueError):  # type: ignore[no-redef]
        pass


def experiment_playbook_argv(step, ansible_playbook, playbook_dir, inventory, extra_vars):
    try:
        return playbook_argv(step, str(ansible_playbook), str(playbook_dir), str(inventory), str(extra_vars))
    except ValueError as exc:
        raise AnsibleFilterError(f"experiment_playbook_argv: {exc}") from None


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
        return {"experiment_playbook_argv": experiment_playbook_argv, "to_data_yaml": to_data_yaml,
                "rollout_trial_phase": lambda folder: trial_phase(str(folder))}
