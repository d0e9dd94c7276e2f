"""Every `ansible-playbook ...` command in README.md and docs/*.md names a playbook, files and variables
that exist (issue 20): a doc that shows a command the project cannot run is a defect.

Variables exist when a role defines them (defaults/main.yml, meta/argument_specs.yml), a play sets them
(vars:), a playbook reads them (`name | default(...)`), or the inventory defines them. The same checks
apply to the fix commands that drift.yml and baseline.yml print."""
from __future__ import annotations

import functools
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def doc_commands() -> list[tuple[str, str]]:
    """(where, command) for each ansible-playbook command line; shell comments and pipes cut off."""
    out = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for found in re.finditer(r"ansible-playbook\s[^`]*", line):
                command = found.group(0)
                command = re.split(r"\s#\s|\s\|\s|\s&&\s|\s2>&1", command)[0].rstrip(" \\")
                out.append((f"{doc.relative_to(ROOT)}:{number}", command.strip()))
    return out


@functools.lru_cache(maxsize=1)
def known_variables() -> set[str]:
    names = set()
    for path in ROOT.glob("roles/*/defaults/main.yml"):
        names |= set((yaml.safe_load(path.read_text()) or {}).keys())
    for path in ROOT.glob("roles/*/meta/argument_specs.yml"):
        for entry in (yaml.safe_load(path.read_text()).get("argument_specs") or {}).values():
            names |= set((entry.get("options") or {}).keys())
    for path in ROOT.glob("playbooks/*.yml"):
        text = path.read_text()
        for play in yaml.safe_load(text) or []:
            names |= set((play.get("vars") or {}).keys())
        names |= set(re.findall(r"\b([a-z][a-z0-9_]*)\s*\|\s*default\(", text))
    for path in (ROOT / "inventory").rglob("*.yml"):
        data = yaml.safe_load(path.read_text())
        if isinstance(data, dict):
            names |= set(data.keys())
    return names


def problems(command: str, variables: set[str]) -> list[str]:
    """What in one command does not exist (empty when it can run)."""
    if re.search(r"<[^>]*>|\[", command):  # a placeholder (<run>, [--check]): check the concrete parts only
        command = re.sub(r"\[([^\]]*)\]", r"\1", command)
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        return [f"not a shell command line ({exc})"]
    found = []
    playbooks = [a for a in argv[1:] if a.endswith(".yml") and not a.startswith(("-", "@"))
                 and "=" not in a and "<" not in a]
    if not playbooks:
        found.append("names no playbook")
    for playbook in playbooks:
        if not (ROOT / playbook).is_file():
            found.append(f"playbook {playbook} does not exist")
    for i, arg in enumerate(argv):
        if arg not in ("-e", "--extra-vars") or i + 1 >= len(argv):
            continue
        value = argv[i + 1]
        if value.startswith("@"):
            if "<" not in value and not (ROOT / value[1:]).is_file():
                found.append(f"vars file {value[1:]} does not exist")
            continue
        if value.startswith("{"):
            try:
                keys = list(json.loads(value))
            except json.JSONDecodeError:
                found.append(f"extra vars {value!r} are not JSON")
                continue
        else:
            keys = [kv.split("=", 1)[0] for kv in value.split() if "=" in kv]
        found += [f"variable {k} is defined nowhere" for k in keys if k not in variables]
        for kv in value.split():
            k, _, v = kv.partition("=")
            if k in ("experiment",) and "<" not in v and not (ROOT / "experiments" / f"{v}.yml").is_file():
                found.append(f"experiment {v} does not exist (experiments/{v}.yml)")
            if k == "ladder" and "<" not in v and not (ROOT / v).is_file() and not (ROOT / "ladders" / v).is_file():
                found.append(f"ladder {v} does not exist")
    return found


@functools.lru_cache(maxsize=1)
def printed_fix_commands() -> list[tuple[str, str]]:
    out = []
    drift = yaml.safe_load((ROOT / "playbooks" / "drift.yml").read_text())
    fixes = next(p["vars"]["drift_fixes"] for p in drift if "drift_fixes" in (p.get("vars") or {}))
    for key, fix in fixes.items():
        out.append((f"drift.yml drift_fixes[{key}]", fix.split(" (")[0]))
    baseline = yaml.safe_load((ROOT / "playbooks" / "baseline.yml").read_text())
    text = " ".join(t["ansible.builtin.assert"]["fail_msg"] for p in baseline for t in p.get("tasks") or []
                    if "fail_msg" in t.get("ansible.builtin.assert", {}))
    for found in re.findall(r"ansible-playbook(?:\s+[^\s{]+)+", text):
        out.append(("baseline.yml refusal", re.sub(r"\s+", " ", found).rstrip(".")))
    return out


COMMANDS = doc_commands()


def test_docs_show_commands():
    assert len(COMMANDS) > 20
    assert any("engram_aside_restore" in c for _, c in COMMANDS), "the engram_aside restore is not documented"


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_doc_command_names_what_exists(where, command):
    assert problems(command, known_variables()) == [], f"{where}: {command}"


@pytest.mark.parametrize(("where", "command"), printed_fix_commands(), ids=[w for w, _ in printed_fix_commands()])
def test_printed_fix_command_names_what_exists(where, command):
    assert problems(command, known_variables()) == [], f"{where}: {command}"


def test_fix_hints_name_the_playbook_that_fixes():
    fixes = {w: c for w, c in printed_fix_commands() if w.startswith("drift.yml")}
    baseline = [c for w, c in printed_fix_commands() if w.startswith("baseline")]
    assert "playbooks/adapters.yml" in fixes["drift.yml drift_fixes[adapters]"]
    assert "headless_stop_display_now=true" in fixes["drift.yml drift_fixes[headless Stop the display manager now]"]
    assert any("headless_stop_display_now=true" in c for c in baseline)
    drift = yaml.safe_load((ROOT / "playbooks" / "drift.yml").read_text())
    roles = next(p["vars"]["drift_roles"] for p in drift if "drift_roles" in (p.get("vars") or {}))
    assert set(roles) <= set(f.split("[")[1].rstrip("]") for f in fixes if f.startswith("drift.yml"))


def test_problems_are_found():
    variables = known_variables()
    assert problems("ansible-playbook playbooks/nope.yml", variables) == ["playbook playbooks/nope.yml does not exist"]
    assert problems("ansible-playbook playbooks/drift.yml -e drift_fial=true", variables) == [
        "variable drift_fial is defined nowhere"]
    assert problems("ansible-playbook playbooks/rollout.yml -e experiment=nope", variables) == [
        "experiment nope does not exist (experiments/nope.yml)"]
    assert problems("ansible-playbook playbooks/drift.yml -e drift_fail=true", variables) == []
