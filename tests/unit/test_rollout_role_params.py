"""Issue 25 item 4 (rollout role): roles/rollout and the playbooks that drive it never set_fact another role's
public variables (engine_image, engine_env_incumbent*, ...): a fact outlives the task and outranks the
inventory for the rest of the run. The configuration a boot uses goes to roles/engine_env and roles/engine as
explicit parameters (roles/rollout/tasks/boot.yml)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "roles" / "rollout" / "tasks").glob("*.yml")) + [
    ROOT / "playbooks" / n for n in ("rollout.yml", "rollback.yml", "ladder.yml", "node_updates.yml", "status.yml")]
OTHER_ROLES = [p.name + "_" for p in (ROOT / "roles").iterdir() if p.is_dir() and p.name != "rollout"]


def tasks_of(node):
    if isinstance(node, list):
        for item in node:
            yield from tasks_of(item)
    elif isinstance(node, dict):
        if "set_fact" in node or "ansible.builtin.set_fact" in node:
            yield node
        for key in ("tasks", "block", "rescue", "always", "pre_tasks", "post_tasks", "handlers"):
            if key in node:
                yield from tasks_of(node[key])


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_set_fact_of_another_roles_variables(path):
    data = yaml.safe_load(path.read_text())
    bad = []
    for task in tasks_of(data):
        facts = task.get("ansible.builtin.set_fact") or task.get("set_fact") or {}
        bad += [(task.get("name"), key) for key in facts if key.startswith(tuple(OTHER_ROLES))]
    assert not bad, f"{path.name} sets other roles' variables as facts: {bad}"
