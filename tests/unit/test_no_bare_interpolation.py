"""No value becomes code (issue 19 item 10): every shell/command/raw task string in playbooks/ and roles/ passes
each interpolated value through ``quote`` (or ``int``), or the task uses ``argv:``.

Each ``{{ ... }}`` is parsed with Jinja2 and followed to what it outputs: a constant (``{{ '{{' }}``, the two
names of ``'a' if x else 'b'``) is safe; a value under ``| quote`` or ``| int`` is safe; a variable defined in the
same play or task ``vars`` is followed into its definition; anything else is a bare interpolation. The only
exceptions are OPERATOR_COMMAND_LINES: variables that are, by their documented contract, a whole command line the
operator writes (e.g. node_updates_upgrade_command), never data.
"""
from __future__ import annotations

from pathlib import Path

import jinja2
import pytest
import yaml
from jinja2 import nodes

ROOT = Path(__file__).resolve().parents[2]
RUNNERS = {"shell", "command", "raw", "ansible.builtin.shell", "ansible.builtin.command", "ansible.builtin.raw",
           "ansible.legacy.shell", "ansible.legacy.command", "ansible.legacy.raw"}
SAFE_FILTERS = {"quote", "int"}
# Whole command lines the operator writes on purpose (playbooks/node_updates.yml header, docs/preflight.md).
OPERATOR_COMMAND_LINES = {"node_updates_upgrade_command", "node_updates_plan_command",
                          "node_updates_refresh_command", "node_updates_smoke_command"}
ENV = jinja2.Environment()


def _root_name(node) -> str:
    while isinstance(node, (nodes.Getattr, nodes.Getitem)):
        node = node.node
    return node.name if isinstance(node, nodes.Name) else type(node).__name__


def _flows(node, scope: dict, seen: frozenset) -> list:
    """The values that reach the output of `node` unquoted (names, or a description)."""
    if node is None or isinstance(node, (nodes.Const, nodes.TemplateData, nodes.Compare, nodes.Test, nodes.Not)):
        return []
    if isinstance(node, nodes.Filter):
        if node.name in SAFE_FILTERS:
            return []
        if node.name == "default":
            return _flows(node.node, scope, seen) + sum((_flows(a, scope, seen) for a in node.args), [])
        return [f"{_root_name(node.node)} | {node.name}"]
    if isinstance(node, nodes.CondExpr):
        return _flows(node.expr1, scope, seen) + _flows(node.expr2, scope, seen)
    if isinstance(node, nodes.Concat):
        return sum((_flows(n, scope, seen) for n in node.nodes), [])
    if isinstance(node, (nodes.And, nodes.Or)):
        return _flows(node.left, scope, seen) + _flows(node.right, scope, seen)
    if isinstance(node, nodes.Name):
        if node.name in OPERATOR_COMMAND_LINES:
            return []
        if node.name in scope and node.name not in seen:
            value = scope[node.name]
            if isinstance(value, str):
                return [f"{node.name} -> {bad}" for bad in _template_flows(value, scope, seen | {node.name})]
        return [node.name]
    return [_root_name(node)]


def _template_flows(text: str, scope: dict, seen: frozenset = frozenset()) -> list:
    bad = []
    for output in ENV.parse(text).find_all(nodes.Output):
        for child in output.nodes:
            bad += _flows(child, scope, seen)
    return bad


def _command_strings(task: dict) -> list:
    """The strings a shell/command/raw task hands to the shell or splits into argv."""
    for key in RUNNERS:
        if key in task:
            value = task[key]
            if isinstance(value, str):
                return [value]
            if isinstance(value, dict):
                return [v for k, v in value.items() if k in ("cmd", "_raw_params") and isinstance(v, str)]
            args = task.get("args") or {}
            return [args["cmd"]] if isinstance(args.get("cmd"), str) else []
    return []


def _tasks(items, scope: dict):
    for task in items or []:
        if not isinstance(task, dict):
            continue
        inner = {**scope, **(task.get("vars") or {})}
        yield task, inner
        for section in ("block", "rescue", "always"):
            yield from _tasks(task.get(section), inner)


def _files() -> list:
    return sorted(p for d in ("playbooks", "roles") for p in (ROOT / d).rglob("*.yml")
                  if "/meta/" not in str(p) and "/defaults/" not in str(p) and "/vars/" not in str(p))


def bare_interpolations(path: Path) -> list:
    """`file: task: what` for each bare interpolation in a shell/command task of one YAML file."""
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, list):
        return []
    found = []
    plays = [d for d in data if isinstance(d, dict) and ("hosts" in d or "import_playbook" in d)]
    groups = [(p.get("vars") or {}, p.get(s)) for p in plays
              for s in ("pre_tasks", "tasks", "post_tasks", "handlers")] if plays else [({}, data)]
    for scope, items in groups:
        for task, inner in _tasks(items, scope if isinstance(scope, dict) else {}):
            for text in _command_strings(task):
                for bad in _template_flows(text, inner):
                    found.append(f"{path.relative_to(ROOT)}: {task.get('name', '?')}: {bad}")
    return found


def test_no_shell_or_command_task_interpolates_a_bare_value():
    found = sum((bare_interpolations(p) for p in _files()), [])
    assert not found, "interpolated into a shell/command string without | quote (use argv: or | quote):\n" + \
        "\n".join(found)


@pytest.mark.parametrize("text, bad", [
    ("docker logs {{ name }}", ["name"]),
    ("docker logs {{ name | quote }} 2>&1", []),
    ("docker inspect -f '{{ '{{' }}.State{{ '}}' }}' {{ c | quote }}", []),
    ("docker logs {{ 'a' if role == 'head' else 'b' }}", []),
    ("run {{ item.path | basename }}", ["item | basename"]),
    ("x {{ hostvars[h].image }}", ["hostvars"]),
    ("for f in {{ d | quote }}/r{{ rank | int }}; do cat $f; done", []),
    ("{{ smoke }}", ["smoke -> image"]),
    ("{{ node_updates_smoke_command | default('run ' ~ (image | quote)) }}", []),
    ("{{ node_updates_smoke_command | default('run ' ~ image) }}", ["image"]),
])
def test_the_rule(text, bad):
    assert _template_flows(text, {"smoke": "run {{ image }} now"}) == bad


def test_argv_lists_are_allowed(tmp_path):
    play = tmp_path / "p.yml"
    play.write_text(yaml.safe_dump([{"hosts": "all", "tasks": [
        {"name": "argv", "ansible.builtin.command": {"argv": ["docker", "logs", "{{ name }}"]}},
        {"name": "bare", "ansible.builtin.shell": "docker logs {{ name }}"}]}]))
    found = [f.split(": ", 1)[1] for f in bare_interpolations_at(play)]
    assert found == ["bare: name"]


def bare_interpolations_at(path: Path) -> list:
    global ROOT
    old, ROOT = ROOT, path.parent
    try:
        return bare_interpolations(path)
    finally:
        ROOT = old
