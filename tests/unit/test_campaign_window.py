"""The campaign's window: local time, date-time or duration; a rung starts only if it fits with time to restore."""
import datetime as dt

import pytest

from ansible.module_utils.campaign_window import WindowError, deadline, estimate, fits

TZ = dt.timezone(dt.timedelta(hours=1))
NOW = dt.datetime(2026, 12, 2, 23, 30, tzinfo=TZ)


def test_a_time_of_day_is_its_next_occurrence():
    assert deadline("06:00", NOW) == dt.datetime(2026, 12, 3, 6, 0, tzinfo=TZ)
    assert deadline("23:45", NOW) == dt.datetime(2026, 12, 2, 23, 45, tzinfo=TZ)


def test_durations_and_date_times():
    assert deadline("90m", NOW) - NOW == dt.timedelta(minutes=90)
    assert deadline("1h30m", NOW) - NOW == dt.timedelta(minutes=90)
    assert deadline("45s", NOW) - NOW == dt.timedelta(seconds=45)
    assert deadline("2026-12-03T06:00", NOW) == dt.datetime(2026, 12, 3, 6, 0, tzinfo=TZ)
    assert deadline("2026-12-03T05:00+00:00", NOW) == dt.datetime(2026, 12, 3, 6, 0, tzinfo=TZ)


@pytest.mark.parametrize("text, words", [
    ("23:00", "already over: it passed 30 min 00 s ago"),
    ("2026-12-02T22:00", "already over"),
    ("0m", "already over"),
    ("tomorrow", "neither HH:MM"),
    ("", "give -e window_end"),
])
def test_a_window_that_is_over_or_malformed_is_refused(text, words):
    with pytest.raises(WindowError, match=words):
        deadline(text, NOW)


def test_a_rung_fits_only_with_time_left_to_restore():
    end = NOW + dt.timedelta(minutes=20)
    assert fits(NOW, end, 15 * 60, 5 * 60)["fits"]
    late = fits(NOW, end, 15 * 60, 6 * 60)
    assert not late["fits"] and "15 min 00 s plus 6 min 00 s" in late["reason"] and "20 min 00 s left" in late["reason"]


def test_the_estimate_learns_from_measured_rungs():
    assert estimate("trial", {}, 900) == 900
    assert estimate("trial", {"trial": [200, 300]}, 900) == 250
    assert estimate("keep_best", {"trial": [200, 300]}, 900) == 250


def test_a_progress_step_answers_an_interval_after_the_previous_one_whatever_the_turn_cost():
    from ansible.module_utils.campaign_window import progress_wait

    # a quick turn (3 s between the previous answer and this call): wait what is left of the 20 s
    assert progress_wait(1000.0, 1003.0, interval_s=20) == 17.0
    # a slow turn on a loaded controller (19 s): 1 s left, so the next line still comes ~20 s after the last
    assert progress_wait(1000.0, 1019.0, interval_s=20) == 1.0
    # a turn longer than the interval: answer at once (the fixed 18 s wait made 39-46 s gaps here)
    assert progress_wait(1000.0, 1031.0, interval_s=20) == 0.0
    # the first step of a rung, a previous answer from a dead controller's run, a clock that went back
    assert progress_wait(None, 1000.0, interval_s=20, first_wait_s=10) == 10.0
    assert progress_wait(1000.0, 9000.0, interval_s=20) == 0.0
    assert progress_wait(1000.0, 900.0, interval_s=20) == 20.0


def test_the_gap_between_progress_lines_stays_under_30_s_for_any_turn_up_to_the_interval():
    """Simulated steps (no clock): the turn before each call costs 3-19 s; each answer comes interval_s after
    the previous one, so the gap between lines is the interval, or the turn when it exceeds the interval."""
    from ansible.module_utils.campaign_window import progress_wait

    answer, gaps = 0.0, []
    for turn in (3, 19, 7, 12, 19, 4, 25, 2):
        start = answer + turn
        nxt = start + progress_wait(answer, start, interval_s=20)
        gaps.append(nxt - answer)
        answer = nxt
    assert gaps == [20, 20, 20, 20, 20, 20, 25, 20]
