"""Every public boolean accepts the strings an operator types (-e x=true is the string "true"): each
conditional that reads one applies `| bool` (issue 20 item 6).

Public booleans: options of type bool in roles/*/meta/argument_specs.yml, boolean role defaults, and the
playbook variables read as `name | default(true|false) | bool`. Conditionals: the values of when, that,
until, failed_when and changed_when, and the condition of every inline Jinja `if`."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
TASK_FILES = sorted([*ROOT.glob("roles/*/tasks/*.yml"), *ROOT.glob("roles/*/handlers/*.yml"),
                     *ROOT.glob("playbooks/*.yml")])
CONDITION_KEYS = ("when", "that", "until", "failed_when", "changed_when")


def public_booleans() -> set[str]:
    names = set()
    for spec in ROOT.glob("roles/*/meta/argument_specs.yml"):
        for entry in (yaml.safe_load(spec.read_text()).get("argument_specs") or {}).values():
            names |= {k for k, v in (entry.get("options") or {}).items() if v.get("type") == "bool"}
    for defaults in ROOT.glob("roles/*/defaults/main.yml"):
        names |= {k for k, v in (yaml.safe_load(defaults.read_text()) or {}).items() if isinstance(v, bool)}
    for playbook in ROOT.glob("playbooks/*.yml"):
        for play in yaml.safe_load(playbook.read_text()) or []:
            names |= {k for k, v in (play.get("vars") or {}).items() if isinstance(v, bool)}
        names |= set(re.findall(r"\b([a-z][a-z0-9_]*) \| default\((?:true|false)\) \| bool", playbook.read_text()))
    return {n for n in names if not n.startswith("_")}


def conditions(node):
    """(text) of every conditional in a parsed task file: condition keys and inline Jinja ifs."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in CONDITION_KEYS:
                for item in value if isinstance(value, list) else [value]:
                    if isinstance(item, str):
                        yield item
            else:
                yield from conditions(value)
    elif isinstance(node, list):
        for item in node:
            yield from conditions(item)
    elif isinstance(node, str):
        # `{% if COND %}` and `X if COND else Y`: the condition runs to %} or else.
        yield from re.findall(r"\{%-?\s*(?:el)?if\s+(.*?)-?%\}", node, re.S)
        yield from re.findall(r"\bif\s+(.*?)\s+else\b", node, re.S)


def bare_uses(text: str, names: set[str]) -> list[str]:
    out = []
    for name in names:
        for m in re.finditer(rf"(?<![\w.'\"]){name}\b(?!\s*[:=])", text):
            if not re.match(r"\s*(\|\s*default\([^)]*\)\s*)?\|\s*bool\b", text[m.end():]):
                out.append(name)
    return out


def test_public_booleans_are_found():
    names = public_booleans()
    for expected in ("headless_stop_display_now", "headless_allow_reboot", "engram_restart_engine",
                     "adapters_dockerfile_block", "drift_fail", "engram_aside_purge_confirm"):
        assert expected in names


def test_every_conditional_on_a_public_boolean_applies_bool():
    names = public_booleans()
    offenders = []
    for path in TASK_FILES:
        for text in conditions(yaml.safe_load(path.read_text())):
            offenders += [f"{path.relative_to(ROOT)}: {n} in {text.strip()[:100]!r}" for n in bare_uses(text, names)]
    assert offenders == [], "conditionals on a public boolean without | bool:\n" + "\n".join(sorted(set(offenders)))


def test_bare_use_is_detected():
    assert bare_uses("headless_stop_display_now", {"headless_stop_display_now"}) == ["headless_stop_display_now"]
    assert bare_uses("x and headless_stop_display_now | default(false) | bool", {"headless_stop_display_now"}) == []
