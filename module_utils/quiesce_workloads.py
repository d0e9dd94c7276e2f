# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Quiesce a fleet host: pause or stop the containers and services an operator named as dispensable,
remember exactly what was done in a state file, and undo exactly that on restore.

Plain Python (standard library only). Commands go through an injected ``run(argv) -> (rc, out, err)``.
The plan is computed from the host's actual state and the record of earlier runs, so a second run
changes nothing and check mode reports exactly what a real run would do.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

Runner = Callable[[list], tuple]

KINDS = ("container", "service")
ACTIONS = ("pause", "stop")
RECORD_VERSION = 1
# What counts as quiet after each action (a stopped container also satisfies "pause").
QUIET_STATES = {("container", "pause"): {"paused", "exited", "created", "dead"},
                ("container", "stop"): {"exited", "created", "dead"},
                ("service", "stop"): {"inactive", "failed", "dead"}}


class QuiesceError(Exception):
    """Bad input or a command that failed; the message is meant for the operator."""


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str = "container"
    action: str = "pause"


@dataclass
class Action:
    name: str
    kind: str
    verb: str          # pause, unpause, stop, start
    before: str
    after: str

    def as_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "verb": self.verb, "from": self.before, "to": self.after}


@dataclass
class Plan:
    actions: list = field(default_factory=list)
    unknown: list = field(default_factory=list)
    record: dict | None = None          # the state file's content after the run (None: no file)
    listed: int = 0
    not_quiet: list = field(default_factory=list)


# ------------------------------------------------------------------ input

def normalize(raw_entries: list, default_action: str = "pause") -> list:
    """Entries given as a name (a container, paused) or a dict {name, kind, action}."""
    if default_action not in ACTIONS:
        raise QuiesceError(f"default_action must be one of {', '.join(ACTIONS)}, not {default_action!r}")
    entries, seen, problems = [], set(), []
    for index, raw in enumerate(raw_entries or []):
        if isinstance(raw, str):
            raw = {"name": raw}
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"].strip():
            problems.append(f"entry {index + 1} ({raw!r}) needs a name")
            continue
        extra = set(raw) - {"name", "kind", "action"}
        if extra:
            problems.append(f"{raw['name']}: unknown keys {', '.join(sorted(extra))} (allowed: name, kind, action)")
            continue
        kind = raw.get("kind") or "container"
        action = raw.get("action") or (default_action if kind == "container" else "stop")
        if kind not in KINDS:
            problems.append(f"{raw['name']}: kind must be container or service, not {kind!r}")
        elif action not in ACTIONS:
            problems.append(f"{raw['name']}: action must be pause or stop, not {action!r}")
        elif kind == "service" and action == "pause":
            problems.append(f"{raw['name']}: a service cannot be paused; use action: stop")
        elif (kind, raw["name"]) in seen:
            problems.append(f"{raw['name']}: listed twice")
        else:
            seen.add((kind, raw["name"]))
            entries.append(Entry(raw["name"].strip(), kind, action))
    if problems:
        raise QuiesceError("quiesce_dispensable is not valid: " + "; ".join(problems))
    return entries


def parse_record(text: str | None, path: str) -> dict | None:
    if text is None:
        return None
    try:
        record = json.loads(text)
    except ValueError as exc:
        raise QuiesceError(f"{path} is not JSON ({exc}); move it aside and re-run") from exc
    if not isinstance(record, dict) or not isinstance(record.get("actions"), list):
        raise QuiesceError(f"{path} has no 'actions' list; move it aside and re-run")
    return record


def render_record(record: dict | None) -> str:
    return "" if record is None else json.dumps(record, indent=2, sort_keys=True) + "\n"


# ------------------------------------------------------------------ inventory

def inventory_containers(run: Runner, owner_label: str = "owner") -> dict:
    """{name: {name, id, image, image_id, state, owner}} of every container on the host."""
    rc, out, err = run(["docker", "ps", "-a", "-q", "--no-trunc"])
    if rc != 0:
        raise QuiesceError(f"docker ps failed ({rc}): {(err or out).strip()[:300]}")
    ids = out.split()
    if not ids:
        return {}
    rc, out, err = run(["docker", "inspect", "--type", "container", *ids])
    if rc != 0:
        raise QuiesceError(f"docker inspect failed ({rc}): {(err or out).strip()[:300]}")
    containers = {}
    for raw in json.loads(out):
        cfg = raw.get("Config") or {}
        name = raw.get("Name", "").lstrip("/")
        containers[name] = {"name": name, "id": raw.get("Id", "")[:12], "image": cfg.get("Image"),
                            "image_id": raw.get("Image"), "state": (raw.get("State") or {}).get("Status"),
                            "owner": (cfg.get("Labels") or {}).get(owner_label)}
    return containers


def image_ids(run: Runner, refs: list) -> set:
    ids = set()
    for ref in refs:
        rc, out, _ = run(["docker", "image", "inspect", "--format", "{{.Id}}", ref])
        if rc == 0 and out.strip():
            ids.add(out.strip())
    return ids


def service_state(run: Runner, name: str) -> dict:
    _, active, _ = run(["systemctl", "is-active", name])
    _, enabled, err = run(["systemctl", "is-enabled", name])
    active, enabled = active.strip() or "unknown", enabled.strip()
    if not enabled:  # systemctl prints the state of every unit it knows; nothing means no such unit
        enabled = "not-found"
    return {"name": name, "active": active, "enabled": enabled, "exists": enabled != "not-found"}


def protected(entries: list, containers: dict, names: list, images: list, ids: set) -> list:
    """Reasons the listed entries include a serving container (never touched)."""
    reasons = []
    for entry in entries:
        if entry.kind != "container":
            continue
        row = containers.get(entry.name)
        if entry.name in names:
            reasons.append(f"{entry.name} (a serving container)")
        elif row and (row["image"] in images or row["image_id"] in ids):
            reasons.append(f"{entry.name} (runs the fleet image {row['image']})")
    return reasons


# ------------------------------------------------------------------ planning

def _state_of(kind: str, name: str, containers: dict, services: dict):
    if kind == "container":
        row = containers.get(name)
        return row["state"] if row else None
    row = services.get(name)
    return row["active"] if row and row["exists"] else None


def _undo(rec: dict, current: str | None) -> Action | None:
    """The action that undoes one recorded action, given the workload's current state."""
    kind, name, did = rec["kind"], rec["name"], rec["action"]
    if current is None:
        return None
    if kind == "container":
        if current == "paused":
            return Action(name, kind, "unpause", current, "running")
        if did == "stop" and current in ("exited", "created"):
            return Action(name, kind, "start", current, "running")
        return None
    if current in QUIET_STATES[("service", "stop")]:
        return Action(name, kind, "start", current, "active")
    return None


def plan(state: str, entries: list, record: dict | None, containers: dict, services: dict) -> Plan:
    recorded = {(r["kind"], r["name"]): r for r in (record or {}).get("actions", [])}
    result = Plan(listed=len(entries))
    kept = []
    if state == "quiet":
        listed_keys = set()
        for entry in entries:
            key = (entry.kind, entry.name)
            listed_keys.add(key)
            current = _state_of(entry.kind, entry.name, containers, services)
            if current is None:
                result.unknown.append(entry.name)
                continue
            quiet = current in QUIET_STATES[(entry.kind, entry.action)]
            rec = recorded.get(key)
            if not quiet:
                result.not_quiet.append(entry.name)
                verb = entry.action
                after = "paused" if verb == "pause" else ("exited" if entry.kind == "container" else "inactive")
                result.actions.append(Action(entry.name, entry.kind, verb, current, after))
                before = rec["from"] if rec else current
                kept.append({"name": entry.name, "kind": entry.kind, "action": entry.action, "from": before})
            elif rec:
                kept.append(rec)
        # Workloads quiesced earlier but no longer listed go back to how they were.
        for key, rec in recorded.items():
            if key in listed_keys:
                continue
            undo = _undo(rec, _state_of(rec["kind"], rec["name"], containers, services))
            if undo:
                result.actions.append(undo)
        result.record = ({"version": RECORD_VERSION, "state": "quiet",
                          "actions": sorted(kept, key=lambda r: (r["kind"], r["name"]))} if kept else None)
    elif state == "restored":
        for key, rec in recorded.items():
            current = _state_of(rec["kind"], rec["name"], containers, services)
            if current is None:
                result.unknown.append(rec["name"])
                continue
            undo = _undo(rec, current)
            if undo:
                result.not_quiet.append(rec["name"])
                result.actions.append(undo)
        result.record = None
    else:
        raise QuiesceError(f"state must be quiet or restored, not {state!r}")
    return result


# ------------------------------------------------------------------ applying

def command_for(action: Action) -> list:
    if action.kind == "container":
        return ["docker", action.verb, action.name]
    return ["systemctl", action.verb, action.name]


def apply(run: Runner, actions: list) -> tuple:
    """Run the actions in order; returns (done, error message or None) and stops at the first failure."""
    done = []
    for action in actions:
        argv = command_for(action)
        rc, out, err = run(argv)
        if rc != 0:
            return done, f"`{' '.join(argv)}` failed ({rc}): {(err or out).strip()[:300]}"
        done.append(action)
    return done, None


def partial_record(state: str, old: dict | None, planned: dict | None, done: list) -> dict | None:
    """After a failure: the record that describes what actually happened (done actions only)."""
    if state == "restored":
        undone = {(a.kind, a.name) for a in done}
        rest = [r for r in (old or {}).get("actions", []) if (r["kind"], r["name"]) not in undone]
        return {**(old or {}), "actions": rest} if rest else None
    done_keys = {(a.kind, a.name) for a in done if a.verb in ACTIONS}
    old_actions = {(r["kind"], r["name"]): r for r in (old or {}).get("actions", [])}
    keep = [r for r in (planned or {}).get("actions", [])
            if (r["kind"], r["name"]) in done_keys or (r["kind"], r["name"]) in old_actions]
    return {"version": RECORD_VERSION, "state": "quiet", "actions": keep} if keep else None


def describe(actions: list) -> tuple:
    """Before/after text of the workloads an action touches, for the diff."""
    before, after = [], []
    for action in sorted(actions, key=lambda a: (a.kind, a.name)):
        before.append(f"{action.kind} {action.name}: {action.before}\n")
        after.append(f"{action.kind} {action.name}: {action.after}\n")
    return "".join(before), "".join(after)
