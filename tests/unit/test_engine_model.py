"""testbed/engine/model.py: calibration to docs/reference.md section 10, effects that must show, neutrality, acceptance."""
from __future__ import annotations

import random
import statistics

import pytest

from ansible.module_utils import prompt_catalog
from testbed.engine.model import (ACCEPT_PROB, SimConfig, StepModel, classify_prompt, expected_accepted)


def step(**fields) -> float:
    return StepModel(SimConfig(**fields)).mean_step_ms(1)


def test_calibration_points():
    assert step() == pytest.approx(98.0)  # TP3 c1, all packed, b12x
    assert step(engram_packed=[True, False, True]) == pytest.approx(108.5)  # one unpacked rank is enough
    assert step(engram_packed=[False] * 3, flags={"b12x": False}) == pytest.approx(120.0)
    terms = StepModel(SimConfig()).terms()
    assert terms["wo_a_ms"] == 11.0 and terms["per_rank"][0]["engram_ms"] == 0.5


def test_wo_a_paths_follow_row_ranges():
    base = StepModel(SimConfig())
    w8 = StepModel(SimConfig(wo_a_path="w8"))
    mid = StepModel(SimConfig(wo_a_path="w8_mid"))
    assert base.mean_step_ms(1) - w8.mean_step_ms(1) == pytest.approx(11.0 - 3.5)  # 4 rows: small path
    assert w8.wo_a_path_for(4) == "einsum" and w8.mean_step_ms(4) == pytest.approx(base.mean_step_ms(4))
    assert mid.wo_a_path_for(4) == "fp8" and mid.mean_step_ms(4) < base.mean_step_ms(4)


def test_straggler_and_polling():
    model = StepModel(SimConfig(contention_ms=[0.0, 0.0, 6.0]))
    assert model.terms()["straggler_rank"] == 2
    assert model.mean_step_ms() == pytest.approx(104.0)
    assert step(gpu_poll_ms=[0, 2000, 0]) - 98.0 == pytest.approx(0.6)
    assert step(gpu_poll_ms=[0, 10000, 0]) - 98.0 == pytest.approx(0.12)
    # the slowest rank sets the pace: an unpacked rank hides a smaller contention elsewhere
    assert step(engram_packed=[True, False, True], contention_ms=[3.0, 0.0, 0.0]) == pytest.approx(108.5)


def test_concurrency_is_sublinear_and_aggregate_grows():
    model = StepModel(SimConfig(max_running_requests=16))
    steps = [model.mean_step_ms(b) for b in (1, 2, 4, 8, 16)]
    assert steps == sorted(steps)
    for batch, ms in zip((1, 2, 4, 8, 16), steps):
        assert ms < batch * steps[0] or batch == 1
    aggregate = [b / ms for b, ms in zip((1, 2, 4, 8, 16), steps)]
    assert aggregate == sorted(aggregate)


def test_prefetch_check_and_cap():
    assert step(engram_prefetch=True) == pytest.approx(98.0 - 2.2)
    assert step(engram_prefetch=True, prefetch_check=True) > 98.0
    plain = StepModel(SimConfig(dspark_block_size=5))
    capped = StepModel(SimConfig(dspark_block_size=5, verify_cap="conf:0.1"))
    gain = plain.mean_step_ms(1, "prose") / capped.mean_step_ms(1, "prose")
    assert 1.03 < gain < 1.08  # FLEET: 66.0 -> 69.7 tok/s (+5.6 %)


def mean_jittered(config: SimConfig, n: int = 400) -> list[float]:
    model = StepModel(config)
    return [model.step_ms(1, "prose") for _ in range(n)]


def test_packed_fleet_is_clearly_faster():
    packed = statistics.fmean(mean_jittered(SimConfig(seed=1)))
    unpacked = statistics.fmean(mean_jittered(SimConfig(seed=2, engram_packed=[True, False, False])))
    assert packed / unpacked < 0.93


def test_unknown_flag_is_neutral_but_noise_exists():
    base = mean_jittered(SimConfig(seed=5))
    flagged_cfg = SimConfig(seed=5, flags={"DSV41_SOMETHING_NEW": "1"})
    assert mean_jittered(flagged_cfg) == base  # same seed: the flag changes nothing at all
    other = mean_jittered(SimConfig(seed=6, flags={"DSV41_SOMETHING_NEW": "1"}))
    assert statistics.fmean(other) == pytest.approx(statistics.fmean(base), rel=0.005)
    assert 0.005 < statistics.stdev(base) / statistics.fmean(base) < 0.02
    assert StepModel(flagged_cfg).describe()["unmodelled_flags"] == ["DSV41_SOMETHING_NEW"]


@pytest.mark.parametrize("block, kind, target", [(5, "prose", 3.0), (5, "code", 5.7), (3, "prose", 2.57)])
def test_acceptance_means(block, kind, target):
    model = StepModel(SimConfig(dspark_block_size=block))
    rng = random.Random(0)
    draws = [model.accepted_tokens(kind, rng) for _ in range(20000)]
    assert min(draws) >= 1 and max(draws) <= block + 1
    assert statistics.fmean(draws) == pytest.approx(target, rel=0.03)
    assert model.expected_accepted(kind) == pytest.approx(expected_accepted(ACCEPT_PROB[kind], block))


def test_acceptance_scales_with_block_size_and_type():
    means = {k: StepModel(SimConfig(dspark_block_size=k)).expected_accepted("prose") for k in (2, 3, 5, 8)}
    assert list(means.values()) == sorted(means.values())
    model = StepModel(SimConfig())
    assert model.expected_accepted("code") > model.expected_accepted("json") > model.expected_accepted("prose")


def test_catalog_prompts_are_typed_as_their_type():
    for kind, prompts in prompt_catalog.CATALOG.items():
        assert {classify_prompt(p) for p in prompts} == {kind}
    assert classify_prompt("the the the the the the the the the the the the the the") == "repetitive"


@pytest.mark.parametrize("fields", [dict(engram_packed=[True, True]), dict(wo_a_path="fp4"),
                                    dict(dspark_block_size=0), dict(time_scale=0),
                                    dict(faults={"explode": 1}), dict(tp=0)])
def test_bad_configs(fields):
    with pytest.raises(ValueError):
        SimConfig(**fields)


def test_config_fills_ranks_and_hides_key():
    cfg = SimConfig(tp=4, api_key="secret")
    assert cfg.engram_packed == [True] * 4 and cfg.gpu_poll_ms == [0] * 4
    assert "secret" not in repr(cfg.public())
    described = StepModel(cfg).describe()
    assert set(described) >= {"terms", "step_ms_by_batch", "accepted_per_step", "tok_s_c1", "straggler_rank"}


def test_a_boot_takes_the_real_fleets_length_only_when_the_testbed_asks(monkeypatch):
    """SIM_BOOT_S (testbed/engine/sim.py boot_phases): unset, a boot is compressed by the time scale; set, it
    lasts that long (80 % weight load, 10 % graphs, 10 % warm-up), whatever the time scale (docs/reference.md
    section 10: 3-6 minutes, load ~200 s), so that the campaign's overhead can be timed with real boots."""
    import os
    import sys

    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(__file__), "..", "..", "testbed"))
    sys.modules.pop("engine.sim", None)
    from engine import sim

    assert sim.boot_phases({}, 0.25) == {"load": 0.075, "graphs": 0.05, "warmup": 0.0}
    assert sim.boot_phases({"SIM_BOOT_S": "0"}, 1.0) == {"load": 0.3, "graphs": 0.2, "warmup": 0.0}
    phases = sim.boot_phases({"SIM_BOOT_S": "240"}, 0.25)
    assert phases == {"load": 192.0, "graphs": 24.0, "warmup": 24.0} and sum(phases.values()) == 240
