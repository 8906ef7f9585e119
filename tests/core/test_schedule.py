"""Schedules as pure functions of time: Every (epoch-aligned) and Cron (time-zone aware)."""

from __future__ import annotations

import datetime as dt
import itertools
import random
from collections import Counter
from zoneinfo import ZoneInfo

import pytest

from harness.fakes import utc_ms
from worker.core.errors import ConfigError
from worker.core.schedule import Cron, Every, make_schedule

MIN = 60_000
HOUR = 60 * MIN
DAY = 24 * HOUR


def local(ms: int, tz: str) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, ZoneInfo(tz))


def walk_next(s: Cron | Every, after: int, until: int) -> list[int]:
    out = []
    t = s.next(after)
    while t <= until:
        out.append(t)
        t = s.next(t)
    return out


# ---------------------------------------------------------------------------------------------
# Every
# ---------------------------------------------------------------------------------------------


def test_every_aligns_to_epoch() -> None:
    e = Every(MIN)
    assert e.latest(125_000) == 120_000
    assert e.latest(120_000) == 120_000  # a tick exactly at `until` counts
    assert e.latest(119_999) == 60_000
    assert e.next(120_000) == 180_000  # strictly after
    assert e.next(119_999) == 120_000
    # two replicas with different clocks-in-hand agree on the grid
    assert {e.latest(t) for t in range(120_000, 180_000, 7_777)} == {120_000}


def test_every_with_offset() -> None:
    e = Every(MIN, offset_ms=5_000)
    assert e.latest(125_000) == 125_000
    assert e.latest(124_999) == 65_000
    assert e.next(125_000) == 185_000


def test_every_ticks_window_is_half_open() -> None:
    e = Every(MIN)
    assert e.ticks(0, 300_000, 10) == [60_000, 120_000, 180_000, 240_000, 300_000]
    assert e.ticks(60_000, 180_000, 10) == [120_000, 180_000]
    assert e.ticks(59_999, 60_000, 10) == [60_000]
    assert e.ticks(60_000, 60_000, 10) == []
    assert e.ticks(60_000, 119_999, 10) == []
    assert e.ticks(200_000, 100_000, 10) == []


def test_every_ticks_limit_keeps_most_recent() -> None:
    e = Every(MIN)
    assert e.ticks(0, 300_000, 2) == [240_000, 300_000]
    assert e.ticks(0, 300_000, 1) == [300_000]
    assert e.ticks(0, 300_000, 0) == []


def test_every_ticks_match_brute_force() -> None:
    rng = random.Random(1234)
    for _ in range(300):
        period = rng.choice([1000, 1500, 7000])
        offset = rng.randrange(0, period)
        e = Every(period, offset)
        after = rng.randrange(0, 50_000)
        until = after + rng.randrange(-2_000, 40_000)
        limit = rng.randrange(1, 8)
        expected = [t for t in range(after + 1, until + 1) if (t - offset) % period == 0]
        assert e.ticks(after, until, limit) == expected[-limit:], (period, offset, after, until)
        assert e.ticks(after, until, 10_000) == walk_next(e, after, until)


def test_every_rejects_sub_second_period() -> None:
    with pytest.raises(ConfigError, match="at least 1 s"):
        Every(999)


# ---------------------------------------------------------------------------------------------
# Cron
# ---------------------------------------------------------------------------------------------


def test_cron_in_asia_shanghai() -> None:
    c = Cron("0 9 * * *", "Asia/Shanghai")  # 09:00 in Shanghai = 01:00 UTC (no DST)
    tick = utc_ms(2024, 1, 2, 1, 0)
    assert c.latest(tick) == tick  # exactly at `until`
    assert c.latest(tick - 1) == tick - DAY
    assert c.latest(tick + HOUR) == tick
    assert c.next(tick) == tick + DAY
    assert c.next(tick - 1) == tick
    assert local(tick, "Asia/Shanghai").hour == 9

    # a tick exactly at `until` is included; one exactly at `after` is not
    assert c.ticks(tick - DAY, tick, 10) == [tick]
    assert c.ticks(tick - 3 * DAY - 1, tick, 10) == [
        tick - 3 * DAY,
        tick - 2 * DAY,
        tick - DAY,
        tick,
    ]
    assert c.ticks(tick, tick + DAY - 1, 10) == []
    assert c.ticks(tick - 10 * DAY, tick, 2) == [tick - DAY, tick]  # most recent kept
    assert c.ticks(tick - 10 * DAY, tick, 0) == []


def test_cron_every_minute_matches_every() -> None:
    c, e = Cron("* * * * *"), Every(MIN)
    start = utc_ms(2024, 5, 1)
    for after in range(start, start + 10 * MIN, 13_001):
        assert c.ticks(after, after + 7 * MIN, 5) == e.ticks(after, after + 7 * MIN, 5)
        assert c.latest(after) == e.latest(after)
        assert c.next(after) == e.next(after)


FALL_BACK = (utc_ms(2024, 11, 2, 12), utc_ms(2024, 11, 4, 12))  # NY: 02:00 EDT -> 01:00 EST
SPRING_FORWARD = (utc_ms(2024, 3, 9, 12), utc_ms(2024, 3, 11, 12))  # NY: 02:00 EST -> 03:00 EDT


@pytest.mark.parametrize("window", [FALL_BACK, SPRING_FORWARD], ids=["fall-back", "spring"])
@pytest.mark.parametrize("expr", ["30 1 * * *", "30 2 * * *", "0 1 * * *", "15 1,2 * * *"])
def test_cron_fixed_time_runs_once_per_local_day_across_dst(
    window: tuple[int, int], expr: str
) -> None:
    c = Cron(expr, "America/New_York")
    after, until = window
    ticks = c.ticks(after, until, 1000)
    assert ticks == sorted(set(ticks))  # strictly ascending, no duplicates
    assert ticks == walk_next(c, after, until)  # next() agrees with ticks()
    assert all(c.latest(t) == t for t in ticks)
    per_day = Counter(
        (local(t, "America/New_York").date(), local(t, "America/New_York").strftime("%H:%M"))
        for t in ticks
    )
    # a wall-clock time repeated by the fall-back hour must not run the job twice that day
    assert max(per_day.values()) == 1, per_day
    days = {d for d, _ in per_day}
    per_expr_hours = len(expr.split()[1].split(","))
    assert len(ticks) == len(days) * per_expr_hours


@pytest.mark.parametrize("window", [FALL_BACK, SPRING_FORWARD], ids=["fall-back", "spring"])
@pytest.mark.parametrize(("expr", "step"), [("0 * * * *", HOUR), ("*/15 * * * *", 15 * MIN)])
def test_cron_wildcard_hours_follow_real_time_across_dst(
    window: tuple[int, int], expr: str, step: int
) -> None:
    c = Cron(expr, "America/New_York")
    after, until = window
    ticks = c.ticks(after, until, 10_000)
    assert ticks == walk_next(c, after, until)
    assert len(set(ticks)) == len(ticks)
    # hourly/quarter-hourly jobs keep their real-time rhythm through the transition
    assert {b - a for a, b in itertools.pairwise(ticks)} == {step}


def test_cron_latest_inside_repeated_hour_is_not_a_second_run() -> None:
    c = Cron("30 1 * * *", "America/New_York")
    first = utc_ms(2024, 11, 3, 5, 30)  # 01:30 EDT
    second = utc_ms(2024, 11, 3, 6, 30)  # 01:30 EST, the same wall-clock time again
    assert c.latest(second + 1) == first
    assert c.next(first) == utc_ms(2024, 11, 4, 6, 30)


@pytest.mark.parametrize(
    "expr",
    ["61 * * * *", "* * * *", "* * * * * *", "nonsense", "", "0 25 * * *", "@every 5s"],
)
def test_invalid_cron(expr: str) -> None:
    with pytest.raises(ConfigError, match="cron") as info:
        Cron(expr)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("tz", ["Mars/Olympus_Mons", "", "../../etc/passwd", "UTC+8"])
def test_invalid_tz(tz: str) -> None:
    with pytest.raises(ConfigError, match="tz"):
        Cron("* * * * *", tz)


def test_describe() -> None:
    assert Every(90_000).describe() == "every 90s"
    assert Cron("0 9 * * *", "Asia/Shanghai").describe() == "cron '0 9 * * *' Asia/Shanghai"


# ---------------------------------------------------------------------------------------------
# make_schedule
# ---------------------------------------------------------------------------------------------


def test_make_schedule_requires_exactly_one() -> None:
    with pytest.raises(ConfigError, match="exactly one"):
        make_schedule(None, None)
    with pytest.raises(ConfigError, match="exactly one"):
        make_schedule("* * * * *", 60)


def test_make_schedule_builds_each_kind() -> None:
    assert make_schedule(None, 60) == Every(MIN)
    assert make_schedule(None, 1.5) == Every(1500)
    assert make_schedule(None, dt.timedelta(minutes=2)) == Every(2 * MIN)
    c = make_schedule("0 9 * * *", None, "Asia/Shanghai")
    assert isinstance(c, Cron) and c.tz == ZoneInfo("Asia/Shanghai")
    with pytest.raises(ConfigError):
        make_schedule(None, 0.5)
    with pytest.raises(ConfigError):
        make_schedule(None, 0)
