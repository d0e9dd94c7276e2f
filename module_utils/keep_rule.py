"""The rollout keep rule (docs/reference.md section 9): keep a change only on a measured, repeatable gain.

Keep when the bootstrap 95% interval of median(candidate) / median(incumbent) (decode tok/s of the
experiment's primary workload) lies entirely above 1 + max(1%, 2 x the incumbent's coefficient of
variation), and no guard failed. A comparison is refused outright when it is not comparable (one arm
retuned autotune and the other reused it) or when the change invalidates timings.
"""
from __future__ import annotations

from typing import Sequence

try:
    from ansible.module_utils.bench_stats import bootstrap_ratio_ci, cv
except ImportError:  # plugins and tests import it directly
    from bench_stats import bootstrap_ratio_ci, cv  # type: ignore[no-redef]

MIN_GAIN = 0.01
# boot_log_facts' autotune outcome of one rank's boot: "tuned" (ran the autotune, also after a disagreement),
# "reused" (the keep adapter reused the cache), "mixed" (both in one boot), "none" (no autotune line).
RETUNED = frozenset({"tuned", "mixed"})


def arm_autotune(outcomes) -> str:
    """One arm's autotune state from its ranks' outcomes: "retuned" when any rank tuned (a mixed boot included),
    "reused" when ranks reused and none tuned, "none" when no rank said anything."""
    values = [outcomes] if isinstance(outcomes, str) else list(outcomes or [])
    values = [str(v) for v in values if v is not None]
    if any(v in RETUNED for v in values):
        return "retuned"
    if "reused" in values:
        return "reused"
    return "none"


def autotune_comparable(incumbent, candidate) -> dict:
    """{comparable, incumbent, candidate, reason}: a comparison where one arm retuned its autotune caches and the
    other reused them measures different tactics, not the change (docs/reference.md section 11); it is not comparable."""
    inc, cand = arm_autotune(incumbent), arm_autotune(candidate)
    comparable = {inc, cand} != {"retuned", "reused"}
    reason = "" if comparable else (f"not comparable: the incumbent {'retuned' if inc == 'retuned' else 'reused'} "
                                    f"its autotune caches and the candidate {'retuned' if cand == 'retuned' else 'reused'}"
                                    " them")
    return {"comparable": comparable, "incumbent": inc, "candidate": cand, "reason": reason}


def threshold(incumbent: Sequence[float]) -> float:
    spread = cv(list(incumbent)) if len(incumbent) > 1 else 0.0
    return 1.0 + max(MIN_GAIN, 2.0 * (spread or 0.0))


def decide(candidate: Sequence[float], incumbent: Sequence[float], guards: Sequence[str] = (),
           comparable: bool = True, timing_valid: bool = True, seed: int = 0) -> dict:
    """{'keep', 'ratio', 'ci', 'threshold', 'incumbent_cv', 'reasons'}: reasons say why not kept."""
    reasons = [f"guard: {g}" for g in guards]
    cand = [float(v) for v in candidate if v is not None]
    inc = [float(v) for v in incumbent if v is not None]
    result = {"keep": False, "ratio": None, "ci": None, "threshold": None, "incumbent_cv": None,
              "n_candidate": len(cand), "n_incumbent": len(inc), "reasons": reasons}
    if not timing_valid:
        reasons.append("the change invalidates timings: it is never kept on speed")
    if not comparable:
        reasons.append("not comparable: one arm retuned autotune and the other reused its caches")
    if len(cand) < 3 or len(inc) < 3:
        reasons.append(f"too few samples (candidate {len(cand)}, incumbent {len(inc)}; at least 3 each)")
        return result
    lo, hi, ratio = bootstrap_ratio_ci(cand, inc, seed=seed)
    bar = threshold(inc)
    result.update(ratio=ratio, ci=[lo, hi], threshold=bar, incumbent_cv=cv(inc))
    if lo <= bar:
        reasons.append(f"gain not shown: 95% interval of the ratio [{lo:.3f}, {hi:.3f}] does not lie above "
                       f"{bar:.3f} (1 + max(1%, 2 x incumbent CV {100 * (cv(inc) or 0):.1f}%))")
    result["keep"] = not reasons
    return result


# --- the whole rollout decision -------------------------------------------------------------------------

MIB = 1048576
# The engine prints the KV budget with a unit (docs/reference.md section 7: `available_bytes=8.84 GB`); the boot-log
# parser keeps the number and the unit apart (kv.units). The simulator prints bytes / 1e9 as GB.
# SGLang prints GPU memory as "GB" but computes it as free bytes / 2**30 (module_utils/sglang_log.py agrees):
# its GB and MB are binary units.
UNIT_BYTES = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40,
              "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def kv_available_bytes(kv) -> int | None:
    """The KV cache's available memory of one boot in bytes (an integer), from boot_log_facts' kv result.

    Prefers the parser's integer byte count (``available_bytes_bytes``), else
    converts the printed number with the unit the parser reports. None when the boot printed no KV line."""
    if not isinstance(kv, dict):
        return None
    for key in ("available_bytes_bytes", "available_bytes_int", "available_bytes_exact"):
        if isinstance(kv.get(key), int) and not isinstance(kv.get(key), bool):
            return kv[key]
    value = kv.get("available_bytes")
    if value is None or isinstance(value, bool):
        return None
    unit = (kv.get("units") or {}).get("available_bytes")
    if not unit:
        return int(value) if float(value) == int(float(value)) else None
    factor = UNIT_BYTES.get(str(unit))
    if factor is None:
        raise ValueError(f"the boot log's available_bytes has an unknown unit {unit!r}")
    return int(round(float(value) * factor))


def memory_ledger(expected_mib_per_rank: int, before_bytes: int | None, after_bytes: int | None,
                  tolerance_mib: int) -> dict:
    """One rank's ledger: the KV budget should grow by the memory the change frees (delta_mib_per_rank is the
    change's cost: +688 MiB leaves 688 MiB less for the KV cache). {ok, checked, change_bytes, expected_bytes}."""
    out = {"checked": False, "ok": True, "before_bytes": before_bytes, "after_bytes": after_bytes,
           "change_bytes": None, "expected_change_bytes": -int(expected_mib_per_rank) * MIB,
           "tolerance_bytes": int(tolerance_mib) * MIB}
    if before_bytes is None or after_bytes is None:
        return out
    change = int(after_bytes) - int(before_bytes)
    out.update(checked=True, change_bytes=change,
               ok=abs(change - out["expected_change_bytes"]) <= out["tolerance_bytes"])
    return out


def _conditions(bench) -> dict:
    return {f"{c.get('type')} c{c.get('concurrency')}": c for c in ((bench or {}).get("conditions") or [])}


def _mib(n: int) -> str:
    return f"{n / MIB:+.0f} MiB"


def judge(experiment: dict, ranks: Sequence[dict], incumbent=None, candidate=None, smoke_answer: str = "",
          kv_tolerance_mib: int = 64, apply_failures: Sequence[dict] = (), apply_failed: bool = False,
          seed: int = 0) -> dict:
    """The rollout's whole decision (docs/reference.md section 9): gates, guards, memory ledger and keep rule.

    ``ranks``: one dict per rank: host, rank, role ('head' or 'worker'), restore (the restore point: kv,
    markers_found, autotune) and candidate (the candidate boot's checks: failed, error, markers_missing,
    errors, kv, smoke, autotune; None when it never booted). ``incumbent``/``candidate``: the two bench
    results (None when the candidate was not measured). Returns {outcome: kept|reverted|failed, reasons,
    failed_reasons, guards, memory (per host), decision (the keep rule's, or None)}."""
    failed: list[str] = []
    for f in apply_failures:
        failed.append(f"applying the change failed on {f.get('host')} (rank {f.get('rank', '?')}): {f.get('msg')}")
    if apply_failed and not apply_failures:
        failed.append("applying the change failed (see apply/ in the run folder)")
    markers_off = list(experiment.get("markers_off") or [])
    memory = {}
    expected_mib = int((experiment.get("memory") or {}).get("delta_mib_per_rank") or 0)
    for r in ranks:
        who = f"rank {r.get('rank')} ({r.get('host')})"
        restore = r.get("restore") or {}
        for m in markers_off:
            if m in (restore.get("markers_found") or []):
                failed.append(f"negative control: {who} printed {m} before the change")
        c = r.get("candidate")
        if apply_failures or apply_failed:
            continue
        if not c:
            failed.append(f"{who} did not boot the candidate")
            continue
        if c.get("failed"):
            failed.append(f"{who} failed to boot the candidate: {' '.join(str(c.get('error') or 'failed').split())}")
            continue
        for m in c.get("markers_missing") or []:
            failed.append(f"{who} did not print the marker {m}")
        for e in c.get("errors") or []:
            failed.append(f"{who} logged an error: {e}")
        if r.get("role") == "head" and c.get("smoke") != smoke_answer:
            failed.append(f"smoke prompt answered {c.get('smoke')!r}, expected {smoke_answer!r}")
        memory[str(r.get("host"))] = memory_ledger(expected_mib, kv_available_bytes(restore.get("kv")),
                                                   kv_available_bytes(c.get("kv")), kv_tolerance_mib)
    result = {"outcome": "failed", "reasons": failed, "failed_reasons": list(failed), "guards": [],
              "memory": memory, "decision": None}
    if failed:
        return result
    if incumbent is None or candidate is None:
        result["reasons"] = ["the candidate was not measured"]
        return result

    guards: list[str] = []
    inc, cand = _conditions(incumbent), _conditions(candidate)
    for c in list(inc.values()) + list(cand.values()):
        if not c.get("valid", True):
            guards.append(f"{c.get('type')} c{c.get('concurrency')} invalid: {'; '.join(c.get('reasons') or [])}")
    if experiment.get("exact_outputs"):
        for key, c in cand.items():
            if key in inc and c.get("hashes") != inc[key].get("hashes"):
                guards.append(f"greedy outputs changed ({key}) although the experiment claims exactness")
    for r in ranks:
        led = memory.get(str(r.get("host")))
        if led and led["checked"] and not led["ok"]:
            guards.append(f"memory ledger: rank {r.get('rank')} ({r.get('host')}) KV memory changed by "
                          f"{_mib(led['change_bytes'])}, expected {_mib(led['expected_change_bytes'])} "
                          f"(tolerance {kv_tolerance_mib} MiB)")
    comparable = autotune_comparable([(r.get("restore") or {}).get("autotune") for r in ranks],
                                     [(r.get("candidate") or {}).get("autotune") for r in ranks])["comparable"]
    primary = (experiment.get("workloads") or {}).get("primary") or {}
    key = f"{primary.get('type')} c{primary.get('concurrency')}"

    def samples(cond):
        return list(((cond or {}).get("samples") or {}).get("decode_tok_s") or [])

    decision = decide(samples(cand.get(key)), samples(inc.get(key)), guards, comparable,
                      bool(experiment.get("timing_valid", True)), seed)
    result.update(guards=guards, decision=decision, reasons=decision["reasons"],
                  outcome="kept" if decision["keep"] else "reverted")
    return result


def attribute_failures(failures: Sequence[dict], ranks: dict | None = None) -> list[dict]:
    """[{host, rank, task, msg}] of a nested run's failures ({host, task, msg}, as module_utils/nested_play.py
    returns them): a refusal raised on the controller (localhost, run_once) that names one fleet host is
    attributed to that host and its rank, not to the controller."""
    import re

    out = []
    for f in failures or []:
        msg = " ".join(str(f.get("msg") or "failed").split())
        host = str(f.get("host"))
        if host not in (ranks or {}):
            named = [h for h in (ranks or {}) if re.search(rf"(?<![\w.-]){re.escape(h)}(?![\w.-])", msg)]
            if len(named) == 1:
                host = named[0]
        out.append({"host": host, "rank": (ranks or {}).get(host, "?"), "task": f.get("task") or "", "msg": msg[:400]})
    return out


def apply_failures(stdout: str, ranks: dict | None = None) -> list[dict]:
    """The failures an ansible-playbook run printed (`fatal: [host]: FAILED! => {json}`), as
    [{host, rank, task, msg}] with the message itself, not the escaped JSON around it."""
    import json
    import re

    raw, task = [], ""
    for line in (stdout or "").splitlines():
        t = re.match(r"TASK \[(.*)\]", line)
        if t:
            task = t.group(1)
        m = re.match(r"fatal: \[([^\]]+)\]: (?:FAILED|UNREACHABLE)! => (\{.*\})\s*$", line)
        if not m:
            continue
        try:
            body = json.loads(m.group(2))
        except ValueError:
            body = {"msg": m.group(2)}
        msg = body.get("msg") if isinstance(body, dict) else None
        if not isinstance(msg, str) or not msg:
            msg = (body.get("stderr") or body.get("stdout") or "failed") if isinstance(body, dict) else "failed"
        raw.append({"host": m.group(1), "task": task, "msg": msg})
    return attribute_failures(raw, ranks)


def summary(result: dict, run_dir: str) -> str:
    """The play's last words about a rollout: outcome, what failed where, what was restored, the evidence."""
    name, outcome = result.get("experiment", "?"), str(result.get("outcome", "?"))
    lines = [f"{name}: {outcome.upper()}{' (trial)' if result.get('trial') else ''}."]
    reasons = result.get("reasons") or []
    if outcome == "kept":
        lines.append("Kept on a measured gain" + (f": {'; '.join(reasons)}" if reasons else "."))
    else:
        lines += [f"- {r}" for r in reasons[:8]]
        if len(reasons) > 8:
            lines.append(f"- ... and {len(reasons) - 8} more (rollout.md)")
    restored = result.get("restored") or {}
    if restored:
        ok = sorted(h for h, r in restored.items() if r.get("ok"))
        bad = sorted(h for h, r in restored.items() if not r.get("ok"))
        lines.append(f"Restored to the restore point and proven: {', '.join(ok) or 'none'}"
                     + (f"; NOT restored: {', '.join(bad)}" if bad else "") + ".")
    for step, what in (result.get("host_change") or {}).items():
        lines.append(f"Host change {step}: {what}.")
    lines.append(f"Evidence: {run_dir} (rollout.md, rollout.json, restore-point.json, boot-logs/, apply/).")
    return "\n".join(lines)
