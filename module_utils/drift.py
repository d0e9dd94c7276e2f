# -*- coding: utf-8 -*-
# Copyright: (c) sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drift table, built from the roles' own check-mode results (issue 25 item 5).

playbooks/drift.yml runs each role of drift_roles with its normal tasks in check mode and diff mode; the
drift_collect callback (plugins/callback/drift_collect.py) keeps one record per task result and host; the
drift_report_info module hands the records to build_report() here. A role's tasks are so the only statement
of what it wants: a row is a task that manages something, and it drifted when that task would change the host
(or failed). Nothing here knows what a role wants; it only reads what the task reported.

A record (one task result on one host, what drift_collect writes):
    {role, task, action, status: ok|failed|skipped|unreachable, changed, handler, planner, delegated,
     item, msg, diff, result}
``state``: the task's own state option (a read when it is in READ_STATES). ``planner``: the task sets ``check_mode: true`` itself (a read-only comparison the role makes before it acts;
only a module with a row builder below turns it into rows). ``result``: the module's return, kept only for the
actions in ROW_BUILDERS.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional

# Actions that read, decide or report: their results are no row (a failure still is one).
READ_ONLY_ACTIONS = frozenset({
    "set_fact", "debug", "assert", "fail", "meta", "include_tasks", "import_tasks", "include_role", "import_role",
    "include_vars", "set_stats", "ping", "stat", "slurp", "find", "wait_for", "pause", "fetch", "setup",
    "gather_facts", "uri", "getent", "package_facts", "service_facts", "validate_argument_spec",
    "adapter_bundle", "engram_relocate",
})
# A module's state option that only reads (adapter_release state=query).
READ_STATES = frozenset({"query"})
# Actions that run a command: a row only when the task says it would change something.
COMMAND_ACTIONS = frozenset({"command", "shell", "raw", "script"})
MAX_LINES = 2          # lines of a text diff shown per side
MAX_TEXT = 160         # characters per desired/actual cell


def short_action(action: str) -> str:
    return (action or "").rsplit(".", 1)[-1]


def manages(action: str) -> bool:
    """Whether a task of this action states desired state (so its result is a row)."""
    name = short_action(action)
    return not (name in READ_ONLY_ACTIONS or name.endswith("_info") or name.endswith("_facts"))


def _clip(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 3] + "..."


def _lines(value: Any) -> List[str]:
    """The lines of a text that say something (blank and comment lines dropped)."""
    if value is None:
        return []
    return [line.rstrip() for line in str(value).splitlines() if line.strip() and not line.lstrip().startswith(("#", ";"))]


def _side(lines: List[str]) -> str:
    shown = " / ".join(lines[:MAX_LINES])
    return shown + (f" (+{len(lines) - MAX_LINES} more lines)" if len(lines) > MAX_LINES else "")


def summarize_diff(diff: Any) -> Optional[Dict[str, str]]:
    """{desired, actual} from a module's diff (one dict or a list of them; text or dict before/after), or None
    when there is no diff. Text: the lines only one side has; dicts: the keys whose values differ."""
    parts = diff if isinstance(diff, list) else [diff]
    desired: List[str] = []
    actual: List[str] = []
    seen = False
    for part in parts:
        if not isinstance(part, dict) or ("before" not in part and "after" not in part):
            continue
        seen = True
        before, after = part.get("before"), part.get("after")
        if isinstance(before, dict) or isinstance(after, dict):
            b, a = before if isinstance(before, dict) else {}, after if isinstance(after, dict) else {}
            for key in sorted(set(b) | set(a), key=str):
                if b.get(key) != a.get(key):
                    actual.append(f"{key}={b[key]}" if key in b else f"{key} (absent)")
                    desired.append(f"{key}={a[key]}" if key in a else f"{key} (absent)")
            continue
        b_lines, a_lines = _lines(before), _lines(after)
        b_set, a_set = set(b_lines), set(a_lines)
        actual.extend(line for line in b_lines if line not in a_set)
        desired.extend(line for line in a_lines if line not in b_set)
        if not b_lines and a_lines:
            actual.append("absent")
        if b_lines and not a_lines:
            desired.append("absent")
    if not seen:
        return None
    return {"desired": _clip(_side(desired) or "as the task states"), "actual": _clip(_side(actual) or "same")}


def _item(record: dict) -> str:
    name = " ".join(str(record.get("task") or record.get("action") or "task").split())
    label = record.get("item")
    return f"{record.get('role')} {name}" + (f" [{label}]" if label not in (None, "") else "")


def _shown(diff: Any, changed: bool) -> Dict[str, str]:
    """Desired and actual of a row: from the diff of a change, else what the task states and whether it changes."""
    shown = summarize_diff(diff) if changed and diff else None
    return shown or {"desired": "as the task states", "actual": "would change" if changed else "same"}


def generic_row(record: dict) -> Optional[dict]:
    """The row of one task result, or None when it is no row (skipped, reads, a handler, a planner)."""
    status = record.get("status")
    if status in ("skipped", "unreachable") or record.get("handler") or record.get("delegated"):
        return None
    if status == "failed":
        msg = (str(record.get("msg") or "failed").strip().splitlines() or ["failed"])[0]
        return {"item": _item(record), "desired": "the task succeeds", "actual": _clip("failed: " + msg),
                "drifted": True}
    if record.get("planner") or not manages(record.get("action", "")) or record.get("state") in READ_STATES:
        return None
    changed = bool(record.get("changed"))
    if short_action(record.get("action", "")) in COMMAND_ACTIONS and not changed:
        return None
    shown = _shown(record.get("diff"), changed)
    return {"item": _item(record), "desired": shown["desired"], "actual": shown["actual"], "drifted": changed}


def engine_container_rows(record: dict) -> List[dict]:
    """The engine_container comparison (its planner, docker inspect the truth): state, image, env and mounts. The
    env and mount rows name every key that differs (never cut: the one an operator looks for may be the last)."""
    res = record.get("result") or {}
    args = (res.get("invocation") or {}).get("module_args") or {}
    c = res.get("container") or None
    name = args.get("name") or (c or {}).get("name") or "engine"
    want_running = args.get("state", "started") != "stopped"
    env_diff, mount_diff = [], []
    for d in res.get("differences") or []:
        if d.get("what") == "env":
            env_diff.append(f"{d.get('key')}={d.get('actual') if d.get('actual') is not None else '(absent)'}")
        elif d.get("what") == "mount":
            mount_diff.append(str(d.get("key")))
    running = bool(c and c.get("running"))
    want_id = str(res.get("image_id") or "")
    return [
        {"item": f"engine {name} state", "desired": "running" if want_running else "stopped",
         "actual": c.get("status", "unknown") if c else "absent",
         "drifted": running != want_running if c else want_running},
        {"item": f"engine {name} image", "desired": _clip(f"{args.get('image', '?')} {want_id[7:19]}"),
         "actual": _clip(f"{c.get('image')} {str(c.get('image_id') or '')[7:19]}") if c else "absent",
         "drifted": bool(want_running) and (not c or c.get("image_id") != res.get("image_id"))},
        {"item": f"engine {name} env (docker inspect)", "desired": f"{len(args.get('env') or {})} keys as engine_env",
         "actual": "absent" if not c else ("same" if not env_diff else "differs: " + ", ".join(env_diff)),
         "drifted": bool(want_running) and (not c or bool(env_diff))},
        {"item": f"engine {name} mounts", "desired": f"{len(args.get('mounts') or [])} mounts",
         "actual": "absent" if not c else ("same" if not mount_diff else "differs: " + ", ".join(mount_diff)),
         "drifted": bool(want_running) and (not c or bool(mount_diff))},
    ]


def docker_container_rows(record: dict) -> List[dict]:
    """roles/engine's option-by-option comparison (community.docker.docker_container, its planner). Its result is
    never shown (no_log: it holds the container's env), so the row says whether it sees a difference the project's
    own comparison (the engine_container rows) does not: a run flag such as --shm-size, --ulimit, --gpus or --device."""
    if "Compare every option" not in str(record.get("task") or ""):
        return []
    changed = bool(record.get("changed"))
    return [{"item": "engine container options (community.docker)", "desired": "as engine_run_args",
             "actual": "differs (playbooks/engine.yml --check names the options)" if changed else "same",
             "drifted": changed}]


def engram_pack_rows(record: dict) -> List[dict]:
    """The engram role's pack plan (its planner): one row per layer, the shard valid on disk."""
    res = record.get("result") or {}
    args = (res.get("invocation") or {}).get("module_args") or {}
    rank, tp = args.get("rank", "?"), args.get("tp", "?")
    rows = []
    for shard in res.get("shards") or []:
        state, reason = shard.get("state_before", "unknown"), shard.get("reason_before") or ""
        rows.append({"item": f"engram l{shard.get('layer')} r{rank}of{tp} shard", "desired": "valid",
                     "actual": _clip(state + (f" ({reason})" if reason else "")), "drifted": state != "valid"})
    if res.get("failed"):
        rows.append({"item": "engram shards", "desired": "readable", "actual": _clip(res.get("msg") or "failed"),
                     "drifted": True})
    return rows


def engram_loaded_rows(record: dict) -> List[dict]:
    """The engram role's `loaded` check: packed=True in the running engine's last boot, per layer. No rows when
    no engine log was read (no engine on this rank)."""
    res = record.get("result") or {}
    layers = res.get("layers") or []
    if not any(layer.get("packed") is not None for layer in layers):
        return []
    return [{"item": f"engram l{layer.get('layer')} loaded", "desired": "packed=True",
             "actual": f"packed={layer.get('packed')}", "drifted": layer.get("packed") is not True} for layer in layers]


def env_files_rows(record: dict) -> List[dict]:
    """roles/engine_env's env files (library/env_files.py writes both of a rank in one run): one row a file, as a
    loop of one module a file would show them (the file's text lines that differ; secrets masked by the module)."""
    res = record.get("result") or {}
    diffs = res.get("diff") or []
    diffs = diffs if isinstance(diffs, list) else [diffs]
    rows = []
    for f in res.get("files") or []:
        path = str(f.get("path"))
        changed = bool(f.get("changed"))
        headers = (path, f"{path} (owner, group, mode)")  # library/env_files.py: the text's diff, the attributes'
        mine = [d for d in diffs if isinstance(d, dict) and d.get("before_header") in headers]
        shown = _shown(mine, changed)
        rows.append({"item": _item(dict(record, item=path)), "desired": shown["desired"], "actual": shown["actual"],
                     "drifted": changed})
    return rows


# Modules whose own comparison says more than changed + diff: their results are kept and turned into rows here.
ROW_BUILDERS: Dict[str, Callable[[dict], List[dict]]] = {
    "engine_container": engine_container_rows,
    "docker_container": docker_container_rows,
    "engram_pack": engram_pack_rows,
    "engram_status_info": engram_loaded_rows,
    "env_files": env_files_rows,
}
# Of those, modules that change the host themselves (not a planner): their builder makes the rows of every run.
MANAGING_ROW_BUILDERS = frozenset({"env_files"})


def rows_for(record: dict) -> List[dict]:
    action = short_action(record.get("action", ""))
    builder = ROW_BUILDERS.get(action)
    if builder and record.get("status") == "ok" and not record.get("handler") and not record.get("delegated") \
            and (record.get("planner") or not manages(action) or action in MANAGING_ROW_BUILDERS):
        return builder(record)
    row = generic_row(record)
    return [row] if row else []


def fix_for(item: str, fixes: Dict[str, str]) -> str:
    """The command that fixes a drifted row: the one for the item itself, else the one for its role."""
    return fixes.get(item) or fixes.get(item.split(" ")[0]) or f"see the role of {item}"


def build_report(records: Dict[str, List[dict]], nodes: Iterable[str], unread: Iterable[str],
                 fixes: Dict[str, str], across: Optional[List[dict]] = None) -> dict:
    """rows per node (None for a node not read), the drifted rows, the table lines and the failure message.
    ``across``: the comparisons between ranks (module_utils/drift_ranks.py), rows after the node's own."""
    # Imported here: the drift_collect callback loads this file from module_utils/ by path, without the package.
    from ansible.module_utils.drift_ranks import across_rank_rows

    nodes, unread = list(nodes), set(unread)
    read = {node: records.get(node, []) for node in nodes if node not in unread}
    across_rows = across_rank_rows(read, nodes, across)
    items: Dict[str, Optional[List[dict]]] = {}
    for node in nodes:
        if node in unread:
            items[node] = None
            continue
        rows: List[dict] = []
        for record in records.get(node, []):
            for row in rows_for(record):
                if row["drifted"]:
                    row["fix"] = fix_for(row["item"], fixes)
                rows.append(row)
        for row in across_rows.get(node, []):
            fix = row.pop("fix")
            if row["drifted"]:
                row["fix"] = fix or fix_for(row["item"], fixes)
            rows.append(row)
        items[node] = rows
    every = [r for rows in items.values() if rows for r in rows]
    width = max([24] + [len(r["item"]) for r in every])
    dwidth = max([8] + [len(str(r["desired"])) for r in every])
    table: List[str] = []
    for node in nodes:
        if items[node] is None:
            table.append(f"== {node}: not read (unreachable or failed)")
            continue
        table.append(f"== {node}")
        table.append("%-*s  %-*s  %s  %s" % (width, "ITEM", dwidth, "DESIRED", "DRIFT", "ACTUAL"))
        for r in items[node]:
            line = "%-*s  %-*s  %-5s  %s" % (width, r["item"], dwidth, r["desired"], "YES" if r["drifted"] else "no",
                                             r["actual"])
            table.append(line + (f"  (fix: {r['fix']})" if r["drifted"] else ""))
    found = [(node, r) for node in nodes for r in (items[node] or []) if r["drifted"]]
    not_read = [n for n in nodes if items[n] is None]
    msg = f"Drift in {len(found)} item(s): " + "".join(
        f"{node} {r['item']}: {r['actual']} (desired: {r['desired']}; fix: {r['fix']}); " for node, r in found)
    if not_read:
        msg += " not read: " + ", ".join(not_read)
    msg += " Add --check --diff to a fix command first to see the changes."
    return {"items": items, "table": table, "drifted": len(found), "unread": not_read, "failure_msg": msg}
