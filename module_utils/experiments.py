"""The experiment catalog (experiments/*.yml, docs/reference.md section 9): schema, validation, prerequisites.

Plain data checked by plain Python, so a malformed file fails before any host is touched with a
message that names the file and the field.
"""
from __future__ import annotations

import re
from typing import Any

STAGES = ("A", "B", "C", "D", "E", "F", "G", "H", "I")
TYPES = ("prose", "code", "structured", "json")
ENV_KEY = re.compile(r"^[A-Z_][A-Z0-9_]*$")
# field: (required, python types, description)
FIELDS: dict[str, tuple[bool, tuple, str]] = {
    "name": (True, (str,), "the experiment's name, equal to its file name"),
    "stage": (True, (str,), "the plan's stage, A..I"),
    "description": (True, (str,), "one line"),
    "apply": (True, (dict,), "what changes: env (set), unset (keys), playbook (+ vars, tags)"),
    "revert": (False, (dict, type(None)), "how a playbook change is undone (env changes revert by themselves)"),
    "prerequisites": (True, (list,), "experiments that must be kept first"),
    "markers_on": (True, (list,), "lines that must appear on every rank when on (re: for a regex)"),
    "markers_off": (True, (list,), "lines that must be absent when off (negative control)"),
    "memory": (True, (dict,), "the ledger: delta_mib_per_rank (+ note)"),
    "exact_outputs": (True, (bool,), "greedy hashes must stay identical"),
    "workloads": (True, (dict,), "types, concurrency and the primary workload of the keep rule"),
    "timing_valid": (False, (bool,), "false when the change invalidates timings (never kept on speed)"),
    "repeat_boot": (False, (bool,), "measure a matched repeat boot too"),
    "notes": (False, (str,), "free text"),
    "includes": (False, (list,), "experiments a combination stands for (ladder.yml writes it)"),
}


def _markers_problems(name: str, value: list) -> list[str]:
    out = []
    for marker in value:
        if not isinstance(marker, str) or not marker:
            out.append(f"{name}: every marker must be a non-empty string, not {marker!r}")
        elif marker.startswith("re:"):
            try:
                re.compile(marker[3:])
            except re.error as exc:
                out.append(f"{name}: bad regex {marker!r}: {exc}")
    return out


def validate(doc: Any, file_name: str | None = None) -> list[str]:
    """Every problem of one experiment document; empty when it is valid."""
    if not isinstance(doc, dict):
        return ["the file must hold a mapping"]
    problems = [f"unknown field {k!r} (known: {', '.join(FIELDS)})" for k in doc if k not in FIELDS]
    for key, (required, types, desc) in FIELDS.items():
        if key not in doc:
            if required:
                problems.append(f"missing field {key!r} ({desc})")
            continue
        if not isinstance(doc[key], types):
            problems.append(f"{key!r} must be {' or '.join(t.__name__ for t in types)}, not {type(doc[key]).__name__}")
    if problems:
        return problems
    if file_name and doc["name"] != file_name:
        problems.append(f"name {doc['name']!r} differs from the file name {file_name!r}")
    if doc["stage"] not in STAGES:
        problems.append(f"stage {doc['stage']!r} is not one of {', '.join(STAGES)}")
    apply = doc["apply"]
    extra = set(apply) - {"env", "unset", "playbook", "vars", "tags", "image"}
    if extra:
        problems.append(f"apply has unknown keys {sorted(extra)}")
    if not any(apply.get(k) for k in ("env", "unset", "playbook", "image")):
        problems.append("apply changes nothing: give env, unset, playbook or image")
    for key, value in (apply.get("env") or {}).items():
        if not ENV_KEY.match(str(key)):
            problems.append(f"apply.env key {key!r} is not an environment variable name")
        if not isinstance(value, str):
            problems.append(f"apply.env.{key} must be a string (env values are text), not {value!r}")
        elif "\n" in value:
            problems.append(f"apply.env.{key} contains a newline")
    if apply.get("playbook") and not str(apply["playbook"]).endswith(".yml"):
        problems.append("apply.playbook must name a playbook file in playbooks/")
    if apply.get("playbook") and not doc.get("revert"):
        problems.append("a playbook change needs a revert (revert.playbook)")
    revert = doc.get("revert")
    if isinstance(revert, dict) and not str(revert.get("playbook") or "").endswith(".yml"):
        problems.append("revert must name a playbook file in playbooks/ (revert.playbook)")
    for step_name, step in (("apply", apply), ("revert", revert if isinstance(revert, dict) else {})):
        tags = step.get("tags")
        if tags is not None and (not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags)):
            problems.append(f"{step_name}.tags must be a list of tag names, not {tags!r}")
    for name in doc["prerequisites"]:
        if not isinstance(name, str):
            problems.append(f"prerequisites must be names, not {name!r}")
    problems += _markers_problems("markers_on", doc["markers_on"])
    problems += _markers_problems("markers_off", doc["markers_off"])
    if not isinstance(doc["memory"].get("delta_mib_per_rank"), int):
        problems.append("memory.delta_mib_per_rank must be an integer (MiB per rank, negative saves)")
    wl = doc["workloads"]
    types, conc = wl.get("types"), wl.get("concurrency")
    if not types or not isinstance(types, list) or any(t not in TYPES for t in types):
        problems.append(f"workloads.types must be a non-empty list of {', '.join(TYPES)}")
    if not conc or not isinstance(conc, list) or any(not isinstance(c, int) or c < 1 for c in conc):
        problems.append("workloads.concurrency must be a non-empty list of integers >= 1")
    primary = wl.get("primary") or {}
    if types and conc and (primary.get("type") not in (types or []) or primary.get("concurrency") not in (conc or [])):
        problems.append("workloads.primary must name one of the workload types and concurrencies")
    return problems


def missing_prerequisites(doc: dict, kept: list[str], catalog: dict[str, dict]) -> list[str]:
    """Prerequisites not kept in the incumbent (unknown names count as missing and say so)."""
    out = []
    for name in doc.get("prerequisites", []):
        if name not in catalog:
            out.append(f"{name} (not in the catalog)")
        elif name not in kept:
            out.append(name)
    return out


def marker_matches(marker: str, line: str) -> bool:
    if marker.startswith("re:"):
        return re.search(marker[3:], line) is not None
    return marker in line



def load_data_yaml(stream: Any) -> Any:
    """Read YAML as data: plain YAML (the catalog's files) or what data_yaml wrote (its ``!unsafe`` strings read
    back as plain strings, never templated: the reader is Python). The campaign writes a combination's or a
    layered child's experiment file with data_yaml; experiment_load_info and the campaign read it back here."""
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    _Loader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))
    return yaml.load(stream, Loader=_Loader)


def data_yaml(data: Any, comment: str = "") -> str:
    """YAML text for a variables file that stays data: every string value is tagged ``!unsafe``, so Ansible
    never templates it when it loads the file (issue 19: an experiment's env value such as
    ``{{ lookup('pipe', ...) }}`` written into group_vars/ would otherwise run on the controller), except a
    string YAML would read as another type ('20', '0.25', 'true'), which cannot hold a template: it is written
    quoted without the tag, because ansible-core reads ``!unsafe '20'`` back as the int 20. Numbers and
    booleans of ansible-core's own types are written as plain ones. Mapping keys stay plain (they are validated
    names). ``comment`` lines head the file."""
    import yaml

    class _Unsafe(str):
        pass

    def wrap(value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): wrap(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [wrap(v) for v in value]
        if isinstance(value, str):
            return _Unsafe(value)
        # ansible-core's tagged numbers and booleans (an older incumbent file's `!unsafe '7'` reads back as one)
        for kind in (bool, int, float):
            if isinstance(value, kind):
                return kind(value)
        return value

    class _Dumper(yaml.SafeDumper):
        pass

    def _represent(dumper, value):
        # A string YAML would read as another type ('20', '0.25', 'true') cannot hold a template: it is written
        # quoted and untagged, so it comes back a string (ansible-core reads `!unsafe '20'` back as the int 20).
        text = str(value)
        if dumper.resolve(yaml.ScalarNode, text, (True, False)) != "tag:yaml.org,2002:str":
            return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="'")
        return dumper.represent_scalar("!unsafe", text, style="'")

    _Dumper.add_representer(_Unsafe, _represent)
    head = "".join(f"# {line}\n" for line in comment.splitlines())
    return head + yaml.dump(wrap(data), Dumper=_Dumper, default_flow_style=False, sort_keys=True,
                            allow_unicode=True, width=1000)


def trial_phase(folder: str) -> str:
    """Where a rollout run in ``folder`` stands, from the evidence it has written so far (for progress lines
    of long trials): restore point, incumbent arm, candidate boot, candidate arm, deciding and restoring, done."""
    import os

    def has(*parts: str) -> bool:
        return os.path.exists(os.path.join(folder, *parts))

    if has("rollout.json"):
        return "done"
    if has("bench-candidate.json"):
        return "deciding and restoring"
    if has("boot-logs", "candidate"):
        return "candidate arm (booted, measuring)"
    if has("bench-incumbent.json"):
        return "applying and booting the candidate"
    if has("restore-point.json"):
        return "incumbent arm (measuring)"
    return "recording the restore point"
