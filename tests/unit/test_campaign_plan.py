"""The campaign plan: validated against the catalog before any host is touched; rungs in dependency order."""
import copy
from pathlib import Path

import pytest

from ansible.module_utils.campaign_plan import (PlanError, check_plan, combined, layered, load_plan, rungs,
                                                validate_plan)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "integration" / "fixtures" / "campaigns"


def default():
    return load_plan(str(ROOT / "campaigns" / "default.yml"), str(ROOT / "experiments"))


def test_the_shipped_plan_is_valid_and_runs_stages_a_to_i_in_dependency_order():
    plan, catalog = default()
    assert check_plan(plan, catalog) == []
    steps = rungs(plan, catalog)
    names = [r["experiment"] for r in steps]
    kinds = [r["kind"] for r in steps]
    assert names[:2] == ["pack_engram", "quiesce"] and kinds[:3] == ["host", "host", "baseline"]
    order = [r["experiment"] for r in steps if r["kind"] in ("trial", "operator_call")]
    assert order.index("wo_a_w8") < order.index("wo_a_drop") and order.index("wo_a_w8") < order.index("wo_a_w8_mid")
    assert order.index("folded_sampling") < order.index("draft_tau")
    assert order.index("dspark_block_5") < order.index("verify_cap_conf01")
    stages = [catalog[n]["stage"] for n in order]
    assert stages == sorted(stages), "trials go stage by stage (B..I)"
    assert "clocks_unlocked" not in order and kinds[-1] == "curve"
    assert [r for r in steps if r["experiment"] == "slots_8"][0]["kind"] == "operator_call"
    # relocation is the operator's opt-in: off in the shipped plan
    assert steps[0]["needs_opt_in"] is True
    assert kinds.index("keep_best") < kinds.index("combination") < names.index("clocks_unlocked")
    assert [r["id"] for r in steps][:3] == ["01-pack_engram", "02-quiesce", "03-baseline"]


def test_the_testbed_plans_are_valid():
    for name in ("testbed-3.yml", "testbed-6.yml", "testbed-real-boots.yml", "testbed-real-default.yml"):
        plan, catalog = load_plan(str(FIXTURES / name), str(ROOT / "experiments"))
        assert check_plan(plan, catalog) == [], name


def test_the_overhead_measurement_plan_measures_the_default_plans_workloads():
    """benchmarks/campaign_real_boots.sh measures issue 23's overhead with the shipped plan's benchmark arms:
    the same rollout variables, and no override of the experiments' own workload types and concurrencies."""
    plan, catalog = load_plan(str(FIXTURES / "testbed-real-default.yml"), str(ROOT / "experiments"))
    shipped, _ = default()
    assert plan["rollout"] == shipped["rollout"]
    assert "rollout_types" not in shipped["rollout"] and "rollout_concurrency" not in shipped["rollout"]
    assert set(plan["experiments"]) <= set(shipped["experiments"])
    for name in plan["experiments"]:
        assert catalog[name]["workloads"]["types"] == ["prose", "code"], name


def test_an_unknown_experiment_is_named():
    plan, catalog = default()
    plan["experiments"].append("warp_drive")
    problems = check_plan(plan, catalog)
    assert any("unknown experiment 'warp_drive'" in p and "wo_a_w8" in p for p in problems), problems
    with pytest.raises(PlanError, match="warp_drive"):
        rungs(plan, catalog)


def test_a_prerequisite_cycle_is_refused_with_its_path():
    plan, catalog = default()
    catalog = copy.deepcopy(catalog)
    catalog["wo_a_w8"]["prerequisites"] = ["wo_a_drop"]
    problems = check_plan(plan, catalog)
    assert len(problems) == 1 and "prerequisite cycle" in problems[0], problems
    assert "wo_a_drop -> wo_a_w8 -> wo_a_drop" in problems[0] or "wo_a_w8 -> wo_a_drop -> wo_a_w8" in problems[0]


def test_order_after_can_make_a_cycle_too():
    plan, catalog = default()
    plan["order_after"]["dspark_block_5"] = ["verify_cap_conf01"]
    assert any("prerequisite cycle" in p for p in check_plan(plan, catalog))


def test_malformed_plans_name_every_problem():
    assert validate_plan([]) == ["the plan file must hold a mapping"]
    problems = validate_plan({"name": "x", "experiments": [], "rung_budget_s": 0, "restore_budget_s": 5,
                              "rollout": {"rollout_rep": 3}, "colour": "red"})
    text = " | ".join(problems)
    assert "unknown field 'colour'" in text and "non-empty list" in text and "rung_budget_s must be at least 1" in text
    assert "rollout has unknown variables ['rollout_rep']" in text
    plan, catalog = default()
    plan["operator_call"] = ["not_in_plan"]
    assert any("operator_call item 'not_in_plan'" in p for p in check_plan(plan, catalog))
    plan, catalog = default()
    plan["experiments"].append("quiesce")
    assert any("named twice: quiesce" in p for p in check_plan(plan, catalog))


def test_a_child_is_laid_over_its_parents_winners():
    _, catalog = default()
    drop = layered(catalog["wo_a_drop"], [catalog["wo_a_w8"]])
    assert drop["prerequisites"] == [] and drop["includes"] == ["wo_a_w8", "wo_a_drop"]
    assert drop["apply"]["env"] == {"DSV41_WO_A_W8": "1", "DSV41_WO_A_DROP": "1"}
    # wo_a_drop's file already sets W8: its ledger is the whole change (-688 MiB), not -688 + 688
    assert drop["memory"]["delta_mib_per_rank"] == -688
    mid = layered(catalog["wo_a_w8_mid"], [catalog["wo_a_w8"]])
    assert any("fp8 twins" in m for m in mid["markers_on"])
    tau = layered(catalog["draft_tau"], [catalog["folded_sampling"]])
    assert tau["apply"]["env"]["SGLANG_DSPARK_FOLDED_SAMPLING"] == "2"


def test_the_combination_lays_the_other_winners_over_the_best_single():
    _, catalog = default()
    combo = combined(catalog["verify_cap_conf01"], [catalog["draft_head_fp8"], catalog["folded_fence"]])
    assert combo["apply"]["env"]["DSV41_VERIFY_CAP"] == "conf:0.1" and combo["apply"]["env"]["DSV41_DRAFT_HEAD_FP8"] == "1"
    # the best single is the incumbent when the combination runs: only the others' memory counts
    assert combo["memory"]["delta_mib_per_rank"] == catalog["draft_head_fp8"]["memory"]["delta_mib_per_rank"]
    assert combo["includes"] == ["verify_cap_conf01", "draft_head_fp8", "folded_fence"]
    assert "[verify_cap] armed: conf:0.1" in combo["markers_on"]
    from ansible.module_utils.experiments import validate
    assert validate(combo, "campaign-combination") == []


def test_a_winner_laid_over_the_best_single_is_counted_from_the_best_single():
    """The 6-rung campaign on the real engine (2026-12-04): wo_a_w8 was the best single and wo_a_drop (laid over
    wo_a_w8 in its own rung) another winner. The combination's negative control expected no `[wo_a_w8]` line
    before the change, but the incumbent it starts from is wo_a_w8: every rank printed it and the combination
    failed. Its ledger counted wo_a_drop's whole change from the old incumbent (-688 MiB) and not from wo_a_w8
    (-1,376: the twins stay, the bf16 copy goes)."""
    _, catalog = default()
    drop = layered(catalog["wo_a_drop"], [catalog["wo_a_w8"]])
    combo = combined(catalog["wo_a_w8"], [drop, catalog["verify_cap_conf01"]])
    assert "[wo_a_w8]" not in combo["markers_off"], combo["markers_off"]
    assert "released the bf16 copy" in combo["markers_off"] and "[verify_cap]" in combo["markers_off"]
    assert combo["memory"]["delta_mib_per_rank"] == -688 - 688
    assert combo["includes"] == ["wo_a_w8", "wo_a_drop", "verify_cap_conf01"]
    assert any("fp8 twins" in m for m in combo["markers_on"]) and any("released the bf16" in m for m in combo["markers_on"])
