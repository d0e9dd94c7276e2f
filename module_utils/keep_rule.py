"""The rollout keep rule (FLEET.md section 9): keep a change only on a measured, repeatable gain.

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
    other reused them measures different tactics, not the change (FLEET.md section 11); it is not comparable."""
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
