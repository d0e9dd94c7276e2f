# -*- coding: utf-8 -*-
"""The body of the engram_status_info module (and of its deprecated alias engram_status): per-layer state of one
rank's packed shards on disk and the engine's packed= flags of the last boot."""
from __future__ import annotations

import os
import socket

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.module_alias import warn_if_deprecated
from ansible.module_utils.engram_format import (
    EngramFormatError, STATE_VALID, check_rank, inspect_shard, last_boot_packed)
from ansible.module_utils.engram_packer import PackError, load_sources


def status(dest, rank, tp, layers, checkpoint=None, log_text=None):
    """The module's result, without Ansible; raises EngramFormatError or PackError on bad input."""
    check_rank(rank, tp)
    rows = {}
    if checkpoint:
        rows = {layer: src.n for layer, src in load_sources(checkpoint, layers).items()}
    boots, lines = (0, {}) if log_text is None else last_boot_packed(log_text, rank, layers)
    entries = []
    for layer in layers:
        state = inspect_shard(dest, layer, rank, tp, rows.get(layer))
        entry = state.as_dict()
        line = lines.get(layer)
        entry["packed"] = None if line is None else line.packed
        entry["log_line"] = None if line is None else line.line
        entry["log_rows_match"] = (None if line is None or state.lo is None
                                   else (line.lo, line.hi) == (state.lo, state.hi))
        name = os.path.basename(state.path)
        text = "%s: %s" % (name, state.state)
        if state.state == STATE_VALID:
            text += " (%d rows)" % (state.hi - state.lo)
        elif state.reason:
            text += " (%s)" % state.reason
        if log_text is not None:
            text += ", engine packed=%s" % ("not reported in the last boot" if line is None else line.packed)
        entry["summary"] = text
        entries.append(entry)
    all_valid = all(e["state"] == STATE_VALID for e in entries)
    all_packed = all_valid and (log_text is None or all(e["packed"] is True for e in entries))
    return {"changed": False, "layers": entries, "all_valid": all_valid, "all_packed": all_packed,
            "log_given": log_text is not None, "log_boots": boots}




def run_module(name: str) -> None:
    """Report the shards the module's arguments name and exit with the result."""
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type="path", required=True),
            rank=dict(type="int", required=True),
            tp=dict(type="int", required=True),
            layers=dict(type="list", elements="int", default=[1, 14]),
            checkpoint=dict(type="path"),
            log_path=dict(type="path"),
            log_content=dict(type="str"),
        ),
        mutually_exclusive=[("log_path", "log_content")],
        supports_check_mode=True,
    )
    warn_if_deprecated(module, name)
    p = module.params
    host = socket.gethostname()
    if not os.path.isdir(p["dest"]):
        module.fail_json(msg="Engram directory %s does not exist on %s (or is not a directory): check dest."
                         % (p["dest"], host), dest=p["dest"])
    log_text = p["log_content"]
    if p["log_path"]:
        try:
            with open(p["log_path"], "r", errors="replace") as handle:
                log_text = handle.read()
        except OSError as exc:
            module.fail_json(msg="Cannot read the boot log %s on %s: %s. Save the engine's log there (docker logs) "
                                 "or pass log_content." % (p["log_path"], host, exc.strerror or exc),
                             log_path=p["log_path"])
    try:
        result = status(p["dest"], p["rank"], p["tp"], p["layers"], p["checkpoint"], log_text)
    except EngramFormatError as exc:
        module.fail_json(msg="Invalid rank/tp on %s: %s." % (host, exc))
    except PackError as exc:
        module.fail_json(msg=exc.msg)
    module.exit_json(**result)

