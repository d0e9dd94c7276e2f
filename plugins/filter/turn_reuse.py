# -*- coding: utf-8 -*-
"""Filters that let a rung reuse what an earlier turn of the same run proved (logic in module_utils/).

    {{ names | bench_client_expected(module_utils_dir, launcher_text) }}  -> {name: digest} the role would ship
    {{ read.stdout | bench_client_current(expected) }}                    -> bool (module_utils/bench_client_state.py)
    {{ _engine_liveness | liveness_smoke_answer(prompt) }}                -> str or None (module_utils/liveness_smoke.py)
    {{ log_text | boot_log_parsed(markers) }}                              -> what boot_log_info returns for content=
                                                                             (module_utils/sglang_log.py parse_bytes)

boot_log_parsed parses a log the controller already holds (a file the engine role kept, the restore point's read)
where the rollout ran boot_log_info on every rank to parse text it sent from the controller: one Ansible turn on
every rank fewer, the same parser and result.
"""
from __future__ import annotations

import copy
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "module_utils"))
from bench_client_state import current, expected  # noqa: E402
from liveness_smoke import smoke_answer  # noqa: E402
from sglang_log import LogNotText, parse_bytes  # noqa: E402

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - the plugin is always loaded by Ansible; tests may import it bare
    class AnsibleFilterError(ValueError):  # type: ignore[no-redef]
        pass


def bench_client_expected(names, module_utils_dir, launcher_text):
    return expected(str(module_utils_dir), list(names), str(launcher_text))


_LAST: list = []   # (key, result) of the last parse: a task's vars may name the facts more than once


def boot_log_parsed(content, markers=(), max_errors=100):
    """boot_log_info's result (less `changed`) for a log's text; a clear error for a bad marker or a log that is not text."""
    if not isinstance(content, str):
        raise AnsibleFilterError(f"boot_log_parsed: the log must be text, got {type(content).__name__}")
    key = (str(content), tuple(str(m) for m in markers or []), int(max_errors))
    if _LAST and _LAST[0][0] == key:
        return copy.deepcopy(_LAST[0][1])
    try:
        result = parse_bytes(content.encode("utf-8", "surrogateescape"), markers=list(key[1]),
                             max_errors=key[2], where="content")
        _LAST[:] = [(key, result)]
        return copy.deepcopy(result)
    except LogNotText as exc:
        raise AnsibleFilterError(f"{exc} Give boot_log_parsed the plain-text log.") from exc
    except ValueError as exc:
        raise AnsibleFilterError(f"boot_log_parsed: bad markers option: {exc}.") from exc


class FilterModule:
    def filters(self):
        return {"bench_client_expected": bench_client_expected, "bench_client_current": current,
                "liveness_smoke_answer": smoke_answer, "boot_log_parsed": boot_log_parsed}
