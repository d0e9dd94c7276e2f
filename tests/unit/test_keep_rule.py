"""The keep rule: gains beyond noise are kept; noise, guards and incomparable arms are not."""
import random

from ansible.module_utils.keep_rule import decide, threshold


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
