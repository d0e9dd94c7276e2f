"""The campaign's maintenance window: when it ends, and whether a rung still fits before it.

``window_end`` is a local time of day (``06:00``: its next occurrence), a local or zoned date-time
(``2026-12-03T06:00``, ``2026-12-03T06:00+01:00``) or a duration from the start (``90m``, ``2h``,
``1h30m``, ``45s``). A rung starts only if its estimated duration plus the time kept to restore the
incumbent ends before the window does (docs/reference.md section 9: every change is undone in its window).
"""
from __future__ import annotations

import datetime as dt
import re

DURATION = re.compile(r"^(?:(?P<h>\d+)h)?(?:(?P<m>\d+)m(?:in)?)?(?:(?P<s>\d+)s)?$")
TIME_OF_DAY = re.compile(r"^(?P<h>[01]?\d|2[0-3]):(?P<m>[0-5]\d)$")
# A time of day whose next occurrence is further away than this is taken for one that has passed.
MAX_WINDOW_H = 16


class WindowError(ValueError):
    """A window that cannot be used (malformed, or already over); the message says what to give instead."""


def deadline(window_end: str, now: dt.datetime, max_window_h: int = MAX_WINDOW_H) -> dt.datetime:
    """The end of the window as an aware datetime. ``now`` is aware (local time zone)."""
    if now.tzinfo is None:
        raise ValueError("now must carry its time zone")
    text = str(window_end or "").strip()
    if not text:
        raise WindowError("give -e window_end=HH:MM (local time), a date-time or a duration such as 2h30m")
    m = DURATION.match(text)
    if m and any(m.groupdict().values()):
        seconds = int(m["h"] or 0) * 3600 + int(m["m"] or 0) * 60 + int(m["s"] or 0)
        if seconds <= 0:
            raise WindowError(f"window_end={text} is already over (a duration of 0 s)")
        return now + dt.timedelta(seconds=seconds)
    m = TIME_OF_DAY.match(text)
    if m:
        end = now.replace(hour=int(m["h"]), minute=int(m["m"]), second=0, microsecond=0)
        if end <= now:
            end += dt.timedelta(days=1)
        if end - now > dt.timedelta(hours=max_window_h):
            passed = now - (end - dt.timedelta(days=1))
            raise WindowError(f"window_end={text} is already over: it passed {_hm(passed.total_seconds())} ago "
                              f"(local time now {now:%H:%M}); its next occurrence is more than {max_window_h} h away. "
                              "Give a later time, a date-time or a duration.")
        return end
    try:
        end = dt.datetime.fromisoformat(text)
    except ValueError:
        raise WindowError(f"window_end={text!r} is neither HH:MM, a date-time (2026-12-03T06:00) nor a duration "
                          "(2h30m)") from None
    if end.tzinfo is None:
        end = end.replace(tzinfo=now.tzinfo)
    if end <= now:
        raise WindowError(f"window_end={text} is already over ({_hm((now - end).total_seconds())} ago)")
    return end


def estimate(kind: str, measured: dict[str, list[float]], budget_s: int) -> float:
    """Seconds a rung of this kind should take: the mean of this campaign's finished rungs of the same kind,
    else of any finished rung, else the plan's per-rung budget."""
    same = [float(v) for v in measured.get(kind) or []]
    if same:
        return sum(same) / len(same)
    every = [float(v) for values in measured.values() for v in values]
    if every:
        return sum(every) / len(every)
    return float(budget_s)


def fits(now: dt.datetime, end: dt.datetime, needed_s: float, restore_s: float) -> dict:
    """{fits, left_s, needed_s, restore_s, reason}: does a rung of ``needed_s`` plus ``restore_s`` end before ``end``."""
    left = (end - now).total_seconds()
    ok = needed_s + restore_s <= left
    reason = "" if ok else (f"needs about {_hm(needed_s)} plus {_hm(restore_s)} to restore the incumbent; "
                            f"{_hm(max(left, 0))} left before the window ends at {end:%H:%M}")
    return {"fits": ok, "left_s": round(left, 1), "needed_s": round(needed_s, 1), "restore_s": restore_s,
            "reason": reason}


def _hm(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    h, rest = divmod(seconds, 3600)
    return f"{h} h {rest // 60:02d} min" if h else f"{rest // 60} min {rest % 60:02d} s"


hm = _hm


# Progress lines during a rung (issue 23 item 7: at least every 30 s). A progress step is one module call
# that waits for the rung's job and then answers; the playbook prints its line and calls again. The turn
# around the call (printing, include_tasks, starting the module) costs 3-25 s on a loaded controller, so
# the step does not wait a fixed time: it answers PROGRESS_INTERVAL_S after its previous answer, whatever
# the turn cost, and at once when the job ends.
PROGRESS_INTERVAL_S = 20.0
PROGRESS_FIRST_WAIT_S = 2.0  # the first line of a rung comes as soon as its nested run has started


def progress_wait(previous_answer: float | None, call_start: float, interval_s: float = PROGRESS_INTERVAL_S,
                  first_wait_s: float = PROGRESS_FIRST_WAIT_S) -> float:
    """Seconds a progress step may wait for the job before it answers: what is left of ``interval_s`` since
    the previous step answered (its wall-clock ``time.time()``), never less than 0 nor more than
    ``interval_s``; ``first_wait_s`` for the first step of a rung (no previous answer)."""
    if previous_answer is None:
        return max(0.0, min(first_wait_s, interval_s))
    left = previous_answer + interval_s - call_start
    return max(0.0, min(left, interval_s))
