"""Filters for the rollout decision (module_utils/keep_rule.py) in playbooks: `keep_decision`,
`autotune_comparable`, `rollout_judge` (gates, guards, memory ledger and keep rule in one call),
`rollout_apply_failures`, `rollout_summary`, and the guard before a rollout (module_utils/boot_currency.py):
`rollout_boot_changes`, `rollout_boot_refusal`, `rollout_restore_read`."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "module_utils"))
from boot_currency import changes_since_boot, refusal, split_restore_read  # noqa: E402
from keep_rule import apply_failures as _parse_failures, attribute_failures, autotune_comparable, decide, judge, summary  # noqa: E402


def keep_decision(candidate, incumbent, guards=(), comparable=True, timing_valid=True, seed=0):
    return decide(candidate, incumbent, list(guards or []), bool(comparable), bool(timing_valid), int(seed))


def rollout_autotune_comparable(incumbent, candidate):
    """{comparable, incumbent, candidate, reason} from each arm's per-rank autotune outcomes."""
    return autotune_comparable(incumbent, candidate)


def _plain(value):
    """Ansible's lazy containers and tagged strings as plain Python data."""
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return str(value)
    return value


def rollout_judge(experiment, hosts, ranks, roles, restore, checks, incumbent=None, candidate=None,
                  smoke_answer="", kv_tolerance_mib=64, apply_failed=False, apply_stdout="", apply_failures=None):
    """The rollout's decision from the lists playbooks/rollout.yml gathers (one entry per rank of groups['fleet']);
    ``checks``: each rank's _rollout_checks ({} when it never booted; its 'candidate' entry is used)."""
    candidate_checks = [(c or {}).get("candidate") if hasattr(c or {}, "get") else None for c in checks]
    rows = [{"host": h, "rank": r, "role": role, "restore": _plain(rp or {}), "candidate": _plain(c) if c else None}
            for h, r, role, rp, c in zip(hosts, ranks, roles, restore, candidate_checks)]
    # The host change's nested run (nested_play) returns its failures as data; older callers pass its stdout.
    if not apply_failed:
        fails = []
    elif apply_failures is not None:
        fails = attribute_failures(_plain(apply_failures), dict(zip(hosts, ranks)))
    else:
        fails = _parse_failures(str(apply_stdout or ""), dict(zip(hosts, ranks)))
    return judge(_plain(experiment), rows, _plain(incumbent) if incumbent else None,
                 _plain(candidate) if candidate else None, str(smoke_answer), int(kv_tolerance_mib),
                 fails, bool(apply_failed))


def rollout_apply_failures(stdout, ranks=None):
    return _parse_failures(str(stdout or ""), _plain(ranks or {}))


def rollout_summary(result, run_dir):
    return summary(_plain(result), str(run_dir))


def rollout_boot_changes(engine, containers, display=None, quiesce=None):
    """What changed on a rank after its engine container started (module_utils/boot_currency.py)."""
    return changes_since_boot(_plain(engine), _plain(containers or []), _plain(display) if display else None,
                              _plain(quiesce) if quiesce else None)


def rollout_restore_read(result, host_marker, log_marker, quiesce_path):
    """The restore point's one shell call of a rank, split (module_utils/boot_currency.py split_restore_read)."""
    result = _plain(result or {})
    return split_restore_read(str(result.get("stdout") or ""), result.get("rc", 1), str(host_marker), str(log_marker),
                              str(quiesce_path))


def rollout_boot_refusal(result, host, rank):
    return refusal(str(host), rank, _plain(result))


class FilterModule:
    def filters(self):
        return {"keep_decision": keep_decision, "autotune_comparable": rollout_autotune_comparable,
                "rollout_judge": rollout_judge, "rollout_apply_failures": rollout_apply_failures,
                "rollout_summary": rollout_summary, "rollout_boot_changes": rollout_boot_changes,
                "rollout_boot_refusal": rollout_boot_refusal, "rollout_restore_read": rollout_restore_read}
