"""Filter `experiment_playbook_argv`: the nested ansible-playbook command of an experiment's apply or
revert step (module_utils/experiments.py), for playbooks/rollout.yml.

    {{ _rollout_exp.apply | experiment_playbook_argv(ansible_playbook, playbook_dir, inventory, '@vars.json') }}
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "module_utils"))
from experiments import playbook_argv  # noqa: E402

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


class FilterModule:
    def filters(self):
        return {"experiment_playbook_argv": experiment_playbook_argv}
