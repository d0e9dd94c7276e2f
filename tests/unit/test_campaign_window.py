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
