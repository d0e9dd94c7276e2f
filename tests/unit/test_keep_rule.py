"""The keep rule: gains beyond noise are kept; noise, guards and incomparable arms are not."""
import random

from ansible.module_utils.keep_rule import autotune_comparable, decide, threshold


def sample(center, spread, n=8, seed=1):
    rng = random.Random(seed)
    return [center * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


def test_a_clear_gain_is_kept():
    d = decide(sample(110, 0.01), sample(100, 0.01, seed=2))
    assert d["keep"], d["reasons"]
    assert 1.08 < d["ratio"] < 1.12 and d["ci"][0] > d["threshold"]


def test_a_neutral_change_is_reverted():
    d = decide(sample(100.5, 0.01), sample(100, 0.01, seed=2))
    assert not d["keep"] and "gain not shown" in d["reasons"][0]


def test_noise_raises_the_bar():
    noisy = sample(100, 0.2, seed=3)
    assert threshold(noisy) > 1.1
    d = decide(sample(108, 0.01), noisy)
    assert not d["keep"]


def test_the_bar_is_at_least_one_percent():
    assert threshold([100.0] * 5) == 1.01


def test_guards_and_comparability_block_a_gain():
    fast, slow = sample(130, 0.01), sample(100, 0.01, seed=2)
    assert not decide(fast, slow, guards=["prose c1: foreign traffic"])["keep"]
    d = decide(fast, slow, comparable=False)
    assert not d["keep"] and any("not comparable" in r for r in d["reasons"])
    assert not decide(fast, slow, timing_valid=False)["keep"]


def test_too_few_samples():
    d = decide([1.0, 2.0], [1.0, 1.0, 1.0])
    assert not d["keep"] and d["ratio"] is None and "too few samples" in d["reasons"][0]


def test_an_arm_that_retuned_against_one_that_reused_is_not_comparable_and_not_kept():
    # The incumbent's boot reused its autotune caches on every rank; the candidate's boot retuned on every rank.
    fast, slow = sample(130, 0.01), sample(100, 0.01, seed=2)
    verdict = autotune_comparable(["reused", "reused", "reused"], ["tuned", "tuned", "tuned"])
    assert verdict["comparable"] is False and verdict["incumbent"] == "reused" and verdict["candidate"] == "retuned"
    d = decide(fast, slow, comparable=verdict["comparable"])
    assert not d["keep"] and any("not comparable" in r for r in d["reasons"]), d
    # A 30% gain is kept when both arms did the same with their caches.
    assert decide(fast, slow, comparable=autotune_comparable(["reused"] * 3, ["reused"] * 3)["comparable"])["keep"]


def test_autotune_comparability_either_way_and_mixed_boots():
    assert not autotune_comparable(["tuned"] * 3, ["reused"] * 3)["comparable"]      # the other way round
    assert not autotune_comparable(["reused"] * 3, ["reused", "mixed", "reused"])["comparable"]  # a mixed boot retuned
    assert autotune_comparable(["tuned"] * 3, ["tuned"] * 3)["comparable"]           # both retuned: same footing
    assert autotune_comparable(["none"] * 3, ["tuned"] * 3)["comparable"]            # no autotune line: nothing to say
    assert autotune_comparable("reused", ["reused", None, "reused"])["comparable"]
    assert "incumbent reused" in autotune_comparable(["reused"], ["tuned"])["reason"]


def test_the_filter_plugin_gives_the_same_verdict():
    from plugins.filter.keep_rule import FilterModule
    comparable = FilterModule().filters()["autotune_comparable"]
    assert comparable(["reused"] * 3, ["tuned"] * 3)["comparable"] is False
    assert comparable(["tuned"] * 3, ["tuned"] * 3)["comparable"] is True


# --- the whole decision: gates, guards, memory ledger, keep rule ---------------------------------------
from ansible.module_utils.keep_rule import MIB, apply_failures, attribute_failures, judge, kv_available_bytes, summary  # noqa: E402

GB_KV = 8.84  # docs/reference.md section 7: available_bytes=8.84 GB


def kv(gb):
    return {"available_bytes": round(gb, 2), "units": {"available_bytes": "GB"}}


def bench(center, spread, seed, hashes="h1"):
    return {"conditions": [{"type": "prose", "concurrency": 1, "valid": True, "hashes": [hashes],
                            "samples": {"decode_tok_s": sample(center, spread, seed=seed)}}]}


def exp(delta_mib=0, **kw):
    return {"name": "x", "markers_off": ["[x]"], "exact_outputs": True, "memory": {"delta_mib_per_rank": delta_mib},
            "workloads": {"primary": {"type": "prose", "concurrency": 1}}, **kw}


def fleet(after_gb, before_gb=GB_KV, smoke="4", **cand):
    out = []
    for i, host in enumerate(["spark1", "spark2", "spark3"]):
        c = {"failed": False, "error": "", "markers_missing": [], "errors": [], "kv": kv(after_gb),
             "smoke": smoke if i == 0 else None, "autotune": "none", **cand}
        out.append({"host": host, "rank": i, "role": "head" if i == 0 else "worker",
                    "restore": {"kv": kv(before_gb), "markers_found": [], "autotune": "none"}, "candidate": c})
    return out


def test_kv_bytes_carry_the_unit():
    # SGLang's "GB" is free bytes / 2**30 (docs/reference.md section 7a): 8.84 GB is 8.84 GiB.
    assert kv_available_bytes(kv(8.84)) == round(8.84 * (1 << 30))
    # The parser's integer bytes win over the printed number.
    assert kv_available_bytes({"available_bytes": 8.84, "units": {"available_bytes": "GB"},
                               "available_bytes_bytes": 9_491_864_125}) == 9_491_864_125
    assert kv_available_bytes({"available_bytes": 1.5, "units": {"available_bytes": "GiB"}}) == 3 << 29
    assert kv_available_bytes({"available_bytes": 8_840_000_000}) == 8_840_000_000
    assert kv_available_bytes({"available_bytes_int": 123, "available_bytes": 0.0}) == 123
    assert kv_available_bytes({}) is None and kv_available_bytes(None) is None


def test_a_memory_changing_experiment_is_kept_when_the_ledger_matches():
    # wo_a_w8 costs 688 MiB per rank: the KV budget shrinks by 688 MiB (0.72 GB), within the 64 MiB tolerance.
    after = GB_KV - 688 * MIB / 2 ** 30
    r = judge(exp(688), fleet(after), bench(100, 0.01, 2), bench(112, 0.01, 1), smoke_answer="4")
    assert r["outcome"] == "kept", r["reasons"]
    led = r["memory"]["spark2"]
    assert led["checked"] and led["ok"] and abs(led["change_bytes"] + 688 * MIB) < 6 * MIB


def test_a_memory_saving_experiment_is_kept_and_a_wrong_sign_is_not():
    grown = GB_KV + 688 * MIB / 2 ** 30
    assert judge(exp(-688), fleet(grown), bench(100, 0.01, 2), bench(112, 0.01, 1), "4")["outcome"] == "kept"
    r = judge(exp(688), fleet(grown), bench(100, 0.01, 2), bench(112, 0.01, 1), "4")
    assert r["outcome"] == "reverted" and any("memory ledger: rank 1" in g for g in r["guards"])


def test_a_zero_mib_experiment_with_a_real_memory_regression_is_reverted():
    r = judge(exp(0), fleet(GB_KV - 0.5), bench(100, 0.01, 2), bench(112, 0.01, 1), "4")
    assert r["outcome"] == "reverted"
    assert any("KV memory changed by -512 MiB, expected +0 MiB" in g for g in r["guards"]), r["guards"]


def test_failing_gates_make_a_failed_outcome():
    good = (bench(100, 0.01, 2), bench(112, 0.01, 1))
    assert judge(exp(), fleet(GB_KV, smoke="5"), *good, "4")["outcome"] == "failed"
    r = judge(exp(), fleet(GB_KV, markers_missing=["[x]"]), *good, "4")
    assert r["outcome"] == "failed" and "rank 0 (spark1) did not print the marker [x]" in r["reasons"]
    ranks = fleet(GB_KV)
    ranks[1]["candidate"] = {"failed": True, "error": "NV_ERR_NO_MEMORY"}
    r = judge(exp(), ranks, None, None, "4")
    assert r["outcome"] == "failed" and any("rank 1 (spark2) failed to boot" in x for x in r["reasons"])
    ranks = fleet(GB_KV)
    ranks[2]["restore"]["markers_found"] = ["[x]"]
    assert any("negative control" in x for x in judge(exp(), ranks, *good, "4")["reasons"])


def test_guards_block_a_gain():
    r = judge(exp(), fleet(GB_KV), bench(100, 0.01, 2), bench(112, 0.01, 1, hashes="other"), "4")
    assert r["outcome"] == "reverted" and any("greedy outputs changed" in g for g in r["guards"])
    inc = bench(100, 0.01, 2)
    inc["conditions"][0].update(valid=False, reasons=["foreign traffic"])
    assert judge(exp(), fleet(GB_KV), inc, bench(112, 0.01, 1), "4")["outcome"] == "reverted"


def test_noise_is_not_kept():
    r = judge(exp(), fleet(GB_KV), bench(100, 0.05, 2), bench(106, 0.05, 1), "4")
    assert r["outcome"] == "reverted" and r["decision"]["threshold"] > 1.05


def test_a_failed_apply_names_the_rank_and_the_message_not_escaped_json():
    out = ('TASK [Pack this rank]\n'
           'fatal: [spark2]: FAILED! => {"changed": false, "msg": "spark2: not enough space on /engram: 63 GiB needed"}\n')
    fails = apply_failures(out, {"spark2": 1})
    assert fails == [{"host": "spark2", "rank": 1, "task": "Pack this rank",
                      "msg": "spark2: not enough space on /engram: 63 GiB needed"}]
    r = judge(exp(), fleet(GB_KV), None, None, "4", apply_failures=fails, apply_failed=True)
    assert r["outcome"] == "failed" and r["reasons"] == [
        "applying the change failed on spark2 (rank 1): spark2: not enough space on /engram: 63 GiB needed"]
    text = summary({"experiment": "pack_engram", "outcome": "failed", "reasons": r["reasons"],
                    "restored": {"spark1": {"ok": True}, "spark2": {"ok": True}}}, "/runs/r1")
    assert text.splitlines()[0] == "pack_engram: FAILED."
    assert "on spark2 (rank 1)" in text and "Restored to the restore point and proven: spark1, spark2." in text
    assert "Evidence: /runs/r1" in text and '\\"' not in text and "{" not in text


def test_a_refusal_raised_on_the_controller_is_attributed_to_the_fleet_host_it_names():
    """A run_once refusal is printed as `fatal: [localhost]`; its message names the rank's host (seen failing:
    the summary said 'failed on localhost (rank ?)')."""
    out = ('TASK [Refuse before any write when a rank lacks space]\n'
           'fatal: [localhost]: FAILED! => {"changed": false, "msg": "spark2 rank 1: 63 GiB needed, 20 GiB free"}\n'
           'fatal: [localhost]: FAILED! => {"changed": false, "msg": "spark1 and spark12 both refused"}\n')
    fails = apply_failures(out, {"spark1": 0, "spark2": 1, "spark12": 11})
    assert [(f["host"], f["rank"]) for f in fails] == [("spark2", 1), ("localhost", "?")]


def test_a_nested_runs_failures_as_data_are_attributed_the_same_way():
    """Issue 25 item 6: nested_play returns the host change's failures as data ({host, task, msg}); the
    rollout_judge filter attributes them like the parsed output (a controller refusal naming one host)."""
    from plugins.filter.keep_rule import rollout_judge

    data = [{"host": "localhost", "task": "Refuse", "msg": "spark2 rank 1: 63 GiB needed,\n 20 GiB free"},
            {"host": "spark3", "task": "Pack", "msg": "disk full"}]
    fails = attribute_failures(data, {"spark2": 1, "spark3": 2})
    assert fails == [{"host": "spark2", "rank": 1, "task": "Refuse", "msg": "spark2 rank 1: 63 GiB needed, 20 GiB free"},
                     {"host": "spark3", "rank": 2, "task": "Pack", "msg": "disk full"}]
    r = rollout_judge(exp(), ["spark2", "spark3"], [1, 2], ["worker", "worker"], [{}, {}], [{}, {}],
                      smoke_answer="42", apply_failed=True, apply_failures=data)
    assert r["outcome"] == "failed" and r["reasons"][0] == ("applying the change failed on spark2 (rank 1): "
                                                            "spark2 rank 1: 63 GiB needed, 20 GiB free")
