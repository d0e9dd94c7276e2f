"""Issue 25 items 1 and 2: one home per kind of plugin, no symlinks, host-side code shipped from module_utils."""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def tracked() -> list[tuple[str, str]]:
    out = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return [(line.split()[0], line.split("\t", 1)[1]) for line in out.splitlines()]


def test_the_tree_holds_no_symlink():
    assert [path for mode, path in tracked() if mode == "120000"] == []
    untracked = subprocess.run(["git", "ls-files", "--others", "--exclude-standard"], cwd=ROOT, check=True,
                               capture_output=True, text=True).stdout.split()
    assert [p for p in untracked if (ROOT / p).is_symlink()] == []


def test_plugins_have_one_home_each():
    paths = [p for _, p in tracked()]
    assert [p for p in paths if p.startswith("roles/") and ("/library/" in p or "/filter_plugins/" in p
                                                             or "/module_utils/" in p)] == []


def test_host_side_code_is_copied_from_module_utils_and_no_role_keeps_a_copy():
    sources = {hashlib.sha256(p.read_bytes()).hexdigest(): p.name for p in (ROOT / "module_utils").glob("*.py")}
    copies = [str(p.relative_to(ROOT)) for p in ROOT.glob("roles/*/files/**/*")
              if p.is_file() and hashlib.sha256(p.read_bytes()).hexdigest() in sources]
    assert copies == []
    install = yaml.safe_load((ROOT / "roles/bench_client/tasks/install.yml").read_text())
    ship = next(t for t in install if t["name"] == "Ship the client from the controller")
    assert ship["ansible.builtin.copy"]["src"].endswith("/../../module_utils/{{ item }}")
    assert all((ROOT / "module_utils" / name).is_file() for name in ship["loop"])


# Issue 25 item 4: the engine container names have one source, the inventory (fleet_head_container and
# fleet_worker_container in group_vars/all/fleet.yml); modules get them as options from the roles and playbooks.
ENGINE_CONTAINER_NAMES = ("dsv41-head", "dsv41-worker")
# The one copy in module code, a default the rollout's filter still relies on; it must equal the inventories.
NAMES_CONSTANT = "module_utils/boot_currency.py"


def _without_return_block(path: str, text: str) -> str:
    """A module's RETURN samples show real output (a container's name as docker reports it); everything else of
    the file (code, option defaults, DOCUMENTATION, EXAMPLES) must not carry the names."""
    if path.startswith("library/") and 'RETURN = r"""' in text:
        head, rest = text.split('RETURN = r"""', 1)
        return head + rest.split('"""', 1)[1]
    return text


def test_no_module_role_or_playbook_carries_the_engine_container_names():
    homes = ("library/", "module_utils/", "plugins/", "roles/", "playbooks/")
    carriers = []
    for _, path in tracked():
        if path.startswith(homes) and path != NAMES_CONSTANT and path.endswith((".py", ".yml", ".yaml", ".j2")):
            text = _without_return_block(path, (ROOT / path).read_text())
            carriers += [f"{path}: {name}" for name in ENGINE_CONTAINER_NAMES if name in text]
    assert carriers == []


def test_the_one_copy_of_the_names_equals_every_inventory():
    from ansible.module_utils.boot_currency import ENGINE_NAMES
    for inventory in ("fleet", "testbed"):
        fleet = yaml.safe_load((ROOT / "inventory" / inventory / "group_vars/all/fleet.yml").read_text())
        assert {fleet["fleet_head_container"], fleet["fleet_worker_container"]} == set(ENGINE_NAMES), inventory
    assert (ROOT / NAMES_CONSTANT).read_text().count("dsv41-head") == 1


# Issue 25 item 4, the rest: one definition per role option, an option either required or defaulted, and no role
# setting another role's variables as facts (roles/rollout and its playbooks: tests/unit/test_rollout_role_params.py).
def test_a_role_option_is_written_once_across_its_entry_points():
    copies = []
    for spec in sorted(ROOT.glob("roles/*/meta/argument_specs.yml")):
        root = yaml.compose(spec.read_text())
        entries = dict((k.value, v) for k, v in root.value)["argument_specs"]
        nodes: dict = {}
        for _, entry in entries.value:
            for key, value in entry.value:
                if key.value == "options":
                    for option, definition in value.value:
                        nodes.setdefault(option.value, set()).add(id(definition))
        copies += [f"{spec.relative_to(ROOT)}: {name}" for name, ids in nodes.items() if len(ids) > 1]
    assert copies == [], "share one anchored options block (&name / *name) between entry points"


def _required_with_default(options: dict, where: str) -> list:
    found = []
    for name, option in (options or {}).items():
        if isinstance(option, dict):
            if option.get("required") and "default" in option:
                found.append(f"{where}.{name}")
            found += _required_with_default(option.get("options") or option.get("suboptions"), f"{where}.{name}")
    return found


def test_no_option_is_required_and_defaulted():
    import ast
    import re
    found = []
    for spec in sorted(ROOT.glob("roles/*/meta/argument_specs.yml")):
        for entry, body in (yaml.safe_load(spec.read_text()).get("argument_specs") or {}).items():
            found += _required_with_default(body.get("options"), f"{spec.relative_to(ROOT)}:{entry}")
    for path in sorted(ROOT.glob("library/*.py")) + sorted(ROOT.glob("plugins/doc_fragments/*.py")):
        doc = re.search(r'DOCUMENTATION = r"""(.*?)"""', path.read_text(), re.S)
        found += _required_with_default((yaml.safe_load(doc.group(1)) or {}).get("options"), str(path.relative_to(ROOT)))
    for path in sorted(ROOT.glob("library/*.py")) + sorted(ROOT.glob("module_utils/*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "dict":
                kw = {k.arg: k.value for k in node.keywords}
                if "default" in kw and isinstance(kw.get("required"), ast.Constant) and kw["required"].value is True:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_no_role_sets_another_roles_variables():
    from tests.unit.test_rollout_role_params import tasks_of
    roles = sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir())
    found = []
    for role in roles:
        others = tuple(f"{r}_" for r in roles if r != role and not f"{role}_".startswith(f"{r}_"))
        for path in sorted((ROOT / "roles" / role).glob("**/*.yml")):
            for task in tasks_of(yaml.safe_load(path.read_text())):
                facts = task.get("ansible.builtin.set_fact") or task.get("set_fact") or {}
                found += [f"{path.relative_to(ROOT)}: {key}" for key in facts if key.lstrip("_").startswith(others)]
    assert found == []
