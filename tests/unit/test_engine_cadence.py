"""testbed/engine/api.py: the decode cadence keeps the modelled GPU's pace whatever the host's load (issue 20).

A fake clock stands in for the host: every sleep that has to wait ends `late` seconds after its deadline (a
busy host wakes the scheduler late). The modelled GPU does not wait for the host, so N steps must span N step
times, not N x (step + lateness).
"""
from __future__ import annotations

import types

import pytest

from ansible.module_utils import prompt_catalog
from testbed.engine import api
from testbed.engine.model import SimConfig

STEP_S = 0.010  # one decode step of the fake model, wall seconds at time_scale 1


class FakeClock:
    def __init__(self, late: float):
        self.t = 1000.0
        self.late = late

    def monotonic(self) -> float:
        return self.t

    def sleep_until(self, deadline: float) -> None:
        if deadline > self.t:  # only a real wait wakes up late; a deadline already past returns at once
            self.t = deadline + self.late


def engine_on(clock: FakeClock, monkeypatch) -> tuple[api.Engine, api.SimRequest]:
    monkeypatch.setattr(api, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    engine = api.Engine(SimConfig(time_scale=1.0, log_interval_steps=10 ** 6), log=lambda line: None, ready=None)
    engine.model.step_ms = lambda batch, prompt_type: STEP_S * 1000.0
    engine._sleep_until = clock.sleep_until
    req = engine.new_request(prompt_catalog.CATALOG["prose"][0], max_tokens=10 ** 6, temperature=0.0,
                             ignore_eos=True, thinking=False)
    req.state = "decode"
    engine.running = [req]
    return engine, req


def run_steps(engine: api.Engine, req: api.SimRequest, steps: int) -> None:
    deadline = None
    for _ in range(steps):
        deadline = engine._decode([req], 0, deadline)


@pytest.mark.parametrize("late", [0.5 * STEP_S, 1.5 * STEP_S, 4 * STEP_S])
def test_steps_keep_the_modelled_pace_when_the_host_wakes_the_loop_late(monkeypatch, late):
    clock = FakeClock(late)
    engine, req = engine_on(clock, monkeypatch)
    run_steps(engine, req, 100)
    span = req.chunks[-1][0] - req.chunks[0][0]  # what a client's first/last token times see
    assert span == pytest.approx(99 * STEP_S, abs=late + 1e-9)  # reset on each late wake-up: 99 x (step + late)
    assert engine.counters["decode_steps_total"] == 100


def test_a_loop_far_behind_restarts_the_cadence_instead_of_bursting(monkeypatch):
    clock = FakeClock(0.0)
    engine, req = engine_on(clock, monkeypatch)
    deadline = engine._decode([req], 0, None)
    resumed = clock.t = deadline + api.MAX_CATCH_UP_S + 0.5  # the container was paused
    assert engine._decode([req], 0, deadline) == pytest.approx(resumed + STEP_S)


def test_next_deadline_chains_within_the_bound_and_restarts_after_idle_or_beyond_it():
    assert api.next_deadline(None, 5.0, 0.1) == pytest.approx(5.1)            # idle loop: from now
    assert api.next_deadline(4.7, 5.0, 0.1) == pytest.approx(4.8)             # 3 steps behind: catch up
    assert api.next_deadline(5.0 - api.MAX_CATCH_UP_S - 0.01, 5.0, 0.1) == pytest.approx(5.1)
