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
