"""Is the running engine's boot still current? (a rollout's guard before any change, docs/rollouts.md)

A rollout compares the candidate's boot against the running boot: the memory ledger takes the running boot's
KV pool (`available_bytes` of its DSV4 memory calculation line) as its reference, and the incumbent arm is
measured on it. When the host changed after that boot in a way that changes what a new boot gets (the display
manager stopped or started: a running desktop holds GPU memory; the quiesce record rewritten: workloads paused,
stopped or resumed; a container started or stopped: on the Spark's unified memory every process's memory is GPU
memory), the candidate's boot sees the change and the running boot does not, and the ledger measures the host
change together with the experiment (the seed testbed's spark3: -328 MiB instead of wo_a_w8's -688 MiB). The
rollout then refuses before any change and names what changed and the command that boots the engine again.

Signals, all real ones the host prints: the engine container's State.StartedAt (docker inspect), every other
container's StartedAt / FinishedAt (docker inspect), the display manager's ActiveState and its
ActiveEnterTimestamp / InactiveEnterTimestamp (`systemctl show`, asked with TZ=UTC), the quiesce record's
modification time (stat). Not seen: a `docker pause` by hand (docker keeps no pause time) and a container
removed since the boot; a display manager whose systemctl prints no state-change time is reported as unknown.
"""
from __future__ import annotations

import calendar
import re
import time

RESTART = "ansible-playbook playbooks/engine.yml -e engine_state=restarted"
# The inventory's fleet_head_container and fleet_worker_container (group_vars/all/fleet.yml, the one source; the
# only copy of the names in module code, tests/unit/test_layout.py checks that it equals the inventories): the
# rollout's filter rollout_boot_changes passes no names yet. Pass engine_names and this default can go.
ENGINE_NAMES = frozenset({"dsv41-head", "dsv41-worker"})

_ISO = re.compile(r"^(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2}:\d{2})(?:\.(\d+))?(Z|[+-]\d{2}:?\d{2})?$")
_SYSTEMD = re.compile(r"^(?:[A-Za-z]{3} )?(\d{4}-\d{2}-\d{2}) (\d{2}:\d{2}:\d{2})(?:\.(\d+))? (UTC|GMT|Z)$")


def parse_time(text) -> float | None:
    """Epoch seconds from docker's RFC 3339 time, systemd's `Wed 2026-12-02 06:10:07 UTC` or `@EPOCH`; None for
    never (docker's 0001-01-01, systemd's empty value or n/a). A systemd time in another zone is an error: ask
    systemctl with TZ=UTC."""
    if text is None:
        return None
    text = str(text).strip()
    if not text or text == "n/a" or text.startswith("0001-01-01"):
        return None
    if text.startswith("@"):
        return float(text[1:])
    m = _ISO.match(text)
    if m:
        day, clock, frac, zone = m.groups()
        seconds = calendar.timegm(time.strptime(f"{day} {clock}", "%Y-%m-%d %H:%M:%S"))
        if zone and zone != "Z":
            sign = 1 if zone[0] == "+" else -1
            digits = zone[1:].replace(":", "")
            seconds -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
        return seconds + (float("0." + frac[:6]) if frac else 0.0)
    m = _SYSTEMD.match(text)
    if m:
        day, clock, frac, _ = m.groups()
        seconds = calendar.timegm(time.strptime(f"{day} {clock}", "%Y-%m-%d %H:%M:%S"))
        return seconds + (float("0." + frac[:6]) if frac else 0.0)
    raise ValueError(f"unknown time format {text!r} (docker RFC 3339, or systemd's in UTC)")


def utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(int(seconds)))


def _name(raw: dict) -> str:
    return str(raw.get("Name") or "").lstrip("/")


def changes_since_boot(engine: dict, containers, display: dict | None, quiesce: dict | None,
                       engine_names=ENGINE_NAMES) -> dict:
    """What changed on this host after its engine container started.

    ``engine``: the engine container's docker inspect; ``containers``: docker inspect of every container;
    ``display``: {unit, ActiveState, ActiveEnterTimestamp, InactiveEnterTimestamp} (systemctl show) or None when
    the host has no display manager; ``quiesce``: {path, exists, mtime} of the quiesce record or None.
    Returns {current, booted_at, changes: [{what, at, text}], unknown: [text]}."""
    state = (engine or {}).get("State") or {}
    booted = parse_time(state.get("StartedAt"))
    out = {"current": True, "booted_at": utc(booted) if booted is not None else None, "changes": [], "unknown": []}
    changes = out["changes"]
    if booted is None or not state.get("Running", False):
        changes.append({"what": "engine", "at": None,
                        "text": f"the engine container {_name(engine or {}) or '?'} is not running (no start time)"})
        out["current"] = False
        return out
    names = set(engine_names) | {_name(engine)}
    for raw in containers or []:
        name = _name(raw)
        if name in names:
            continue
        st = raw.get("State") or {}
        started, finished = parse_time(st.get("StartedAt")), parse_time(st.get("FinishedAt"))
        if st.get("Running") and started is not None and started > booted:
            changes.append({"what": "container", "at": started, "text": f"container {name} started at {utc(started)}"})
        elif not st.get("Running") and finished is not None and finished > booted:
            changes.append({"what": "container", "at": finished, "text": f"container {name} stopped at {utc(finished)}"})
    if display and display.get("error"):
        # systemctl failed: the display manager's state is not known, so the boot cannot be shown current
        changes.append({"what": "display", "at": None,
                        "text": f"the display manager's state could not be read ({display['error']})"})
    elif display:
        unit, active = display.get("unit") or "display-manager.service", str(display.get("ActiveState") or "")
        key, verb = ("ActiveEnterTimestamp", "started") if active == "active" else ("InactiveEnterTimestamp", "stopped")
        at = parse_time(display.get(key))
        if at is None:
            out["unknown"].append(f"display manager {unit} is {active or 'unknown'}; systemctl shows no {key}")
        elif at > booted:
            changes.append({"what": "display", "at": at, "text": f"display manager {unit} {verb} at {utc(at)}"})
    if quiesce and quiesce.get("exists") and quiesce.get("mtime") is not None and float(quiesce["mtime"]) > booted:
        at = float(quiesce["mtime"])
        changes.append({"what": "quiesce", "at": at,
                        "text": f"quiesce record {quiesce.get('path')} written at {utc(at)} (workloads paused, stopped "
                                "or resumed)"})
    changes.sort(key=lambda c: (c["at"] or 0, c["text"]))
    out["current"] = not changes
    return out


def host_reads(text: str, quiesce_path: str) -> tuple[dict | None, dict]:
    """The display manager and the quiesce record as the restore point's one shell call prints them (roles/rollout
    tasks/restore_point.yml, before its containers and log; three SSH turns a rank before, each its own task):
    `unit=<the display-manager.service link's target>` and `systemctl show` lines (`Key=value`, asked with
    TZ=UTC), or `error=<why>` when systemctl failed; `quiesce_mtime=<epoch seconds>` when the record exists.
    Returns (display for changes_since_boot, or None when the host has no display-manager link; quiesce)."""
    display: dict | None = None
    quiesce: dict = {"path": quiesce_path, "exists": False, "mtime": None}
    for line in str(text or "").splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "unit":
            display = {"unit": value}
        elif key == "quiesce_mtime":
            try:
                quiesce.update(exists=True, mtime=float(value))
            except ValueError:
                quiesce.update(exists=True, mtime=None, error=f"unreadable modification time {value!r}")
        elif display is not None and key in ("ActiveState", "ActiveEnterTimestamp", "InactiveEnterTimestamp", "error"):
            display[key] = value
    return display, quiesce


def split_restore_read(stdout: str, rc, host_marker: str, log_marker: str, quiesce_path: str) -> dict:
    """The restore point's one call a rank: host reads, host_marker, the containers' docker inspect JSON,
    log_marker, the engine's log. {display, quiesce, containers (JSON text), log}; a failed call (rc != 0: docker
    did not answer) gives no containers, which the serving check then names."""
    text = str(stdout or "")
    head, sep, rest = text.partition(host_marker + "\n")
    if not sep:
        head, rest = "", text
    display, quiesce = host_reads(head, quiesce_path)
    if rc != 0:
        return {"display": display, "quiesce": quiesce, "containers": "[]", "log": ""}
    containers, _, log = rest.partition("\n" + log_marker)
    return {"display": display, "quiesce": quiesce, "containers": containers or "[]", "log": log[1:]}


def refusal(host: str, rank, result: dict, restart: str = RESTART) -> str:
    """The rollout's refusal for one rank whose boot is not current: what changed and the command to run first."""
    listed = result.get("changes") or []
    shown = "; ".join(c["text"] for c in listed[:6]) + (f"; and {len(listed) - 6} more" if len(listed) > 6 else "")
    booted = result.get("booted_at")
    return (f"{host} (rank {rank}) changed after its engine booted{f' at {booted}' if booted else ''}: {shown}. "
            "The running boot's KV pool (the memory ledger's reference) and the incumbent arm no longer match what "
            f"a new boot gets. Boot the engine again first: {restart} (then run the rollout). Nothing was changed.")
