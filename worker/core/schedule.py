"""Periodic schedules as pure functions of time: cron expressions and fixed intervals.

A *tick* is the scheduled instant of one run, in epoch milliseconds. Schedules answer "which
ticks fall in (after, until]?" so the enqueuer can catch up missed ticks after a failover
without holding any state in memory.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from worker.core.errors import ConfigError


class Schedule(Protocol):
    """When a periodic job is due."""

    def ticks(self, after_ms: int, until_ms: int, limit: int) -> list[int]:
        """Ticks ``t`` with ``after_ms < t <= until_ms``, ascending; only the last ``limit``."""

    def latest(self, until_ms: int) -> int:
        """The last tick at or before ``until_ms``."""

    def next(self, after_ms: int) -> int:
        """The first tick strictly after ``after_ms``."""

    def describe(self) -> str: ...


@dataclass(frozen=True)
class Every:
    """Every ``period_ms``, aligned to the epoch plus ``offset_ms`` (so every replica agrees)."""

    period_ms: int
    offset_ms: int = 0

    def __post_init__(self) -> None:
        if self.period_ms < 1000:
            raise ConfigError(f"schedule every={self.period_ms / 1000}s: must be at least 1 s")

    def latest(self, until_ms: int) -> int:
        return until_ms - ((until_ms - self.offset_ms) % self.period_ms)

    def next(self, after_ms: int) -> int:
        return self.latest(after_ms) + self.period_ms

    def ticks(self, after_ms: int, until_ms: int, limit: int) -> list[int]:
        if limit <= 0 or until_ms <= after_ms:
            return []
        last = self.latest(until_ms)
        first = max(self.next(after_ms), last - (limit - 1) * self.period_ms)
        return list(range(first, last + 1, self.period_ms)) if first <= last else []

    def describe(self) -> str:
        return f"every {self.period_ms / 1000:g}s"


#: Answers a :class:`Cron` remembers (then forgets them all: bounded memory).
MEMO = 1024


class Cron:
    """A five-field cron expression evaluated in a time zone (DST-aware, via croniter)."""

    def __init__(self, expr: str, tz: str = "UTC", *, seconds: str | None = None) -> None:
        """``seconds``: a cron field for the second (``"0,30"``, ``"*/10"``; default the
        minute's first second), for schedules finer than a minute (arq's ``cron(second=…)``,
        :mod:`worker.arqcompat`)."""
        if seconds is not None and not croniter.is_valid(f"{expr} {seconds}"):
            raise ConfigError(f"schedule seconds={seconds!r}: not a valid cron seconds field")
        if not croniter.is_valid(expr) or len(expr.split()) != 5:
            raise ConfigError(
                f"schedule cron={expr!r}: not a valid 5-field cron expression "
                "(minute hour day-of-month month day-of-week)"
            )
        try:
            self.tz = ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise ConfigError(f"schedule tz={tz!r}: unknown time zone") from None
        self.expr = expr
        self.tz_name = tz
        self.seconds = seconds
        self._croniter = expr if seconds is None else f"{expr} {seconds}"
        # Like cron(8): a job at a fixed hour and minute runs once when a DST fall-back repeats
        # its wall-clock time; one with a wildcard minute or hour keeps running in real time.
        minute, hour = expr.split()[:2]
        self._wildcard = minute.startswith("*") or hour.startswith("*")
        # recent answers: many schedules share one cron and zone, and ask of the same instant
        self._memo: dict[tuple[str, int], int] = {}
        self._ticks_memo: dict[tuple[int, int, int], list[int]] = {}

    def _at(self, ms: int) -> dt.datetime:
        return dt.datetime.fromtimestamp(ms / 1000, tz=self.tz)

    def _repeat(self, ms: int) -> bool:
        """True for the second pass through a wall-clock time a DST fall-back repeats."""
        if self._wildcard:
            return False
        t = self._at(ms)
        return t.fold == 1 and t.replace(fold=0).utcoffset() != t.utcoffset()

    def _remember(self, key: tuple[str, int], value: int) -> int:
        if len(self._memo) >= MEMO:
            self._memo.clear()
        self._memo[key] = value
        return value

    def latest(self, until_ms: int) -> int:
        hit = self._memo.get(("latest", until_ms))
        return (
            hit if hit is not None else self._remember(("latest", until_ms), self._latest(until_ms))
        )

    def next(self, after_ms: int) -> int:
        hit = self._memo.get(("next", after_ms))
        return hit if hit is not None else self._remember(("next", after_ms), self._next(after_ms))

    def _latest(self, until_ms: int) -> int:
        # croniter's get_prev is strict: step 1 ms past `until` so a tick exactly on it counts.
        it = croniter(self._croniter, self._at(until_ms + 1))
        t = int(it.get_prev(float) * 1000)
        while self._repeat(t):
            t = int(it.get_prev(float) * 1000)
        return t

    def _next(self, after_ms: int) -> int:
        it = croniter(self._croniter, self._at(after_ms))
        t = int(it.get_next(float) * 1000)
        while self._repeat(t):
            t = int(it.get_next(float) * 1000)
        return t

    def ticks(self, after_ms: int, until_ms: int, limit: int) -> list[int]:
        key = (after_ms, until_ms, limit)
        hit = self._ticks_memo.get(key)
        if hit is None:
            if len(self._ticks_memo) >= MEMO:
                self._ticks_memo.clear()
            hit = self._ticks_memo[key] = self._ticks(after_ms, until_ms, limit)
        return list(hit)

    def _ticks(self, after_ms: int, until_ms: int, limit: int) -> list[int]:
        if limit <= 0 or until_ms <= after_ms:
            return []
        it = croniter(self._croniter, self._at(until_ms + 1))
        out: list[int] = []
        while len(out) < limit:
            t = int(it.get_prev(float) * 1000)
            if t <= after_ms:
                break
            if not self._repeat(t):
                out.append(t)
        out.reverse()
        return out

    def describe(self) -> str:
        at = "" if self.seconds is None else f" second {self.seconds}"
        return f"cron {self.expr!r}{at} {self.tz_name}"


def make_schedule(
    cron: str | None, every: float | dt.timedelta | None, tz: str = "UTC"
) -> Schedule:
    """Build a schedule from exactly one of ``cron`` and ``every`` (seconds or timedelta)."""
    if (cron is None) == (every is None):
        raise ConfigError("schedule: give exactly one of cron=... or every=...")
    if cron is not None:
        return Cron(cron, tz)
    seconds = every.total_seconds() if isinstance(every, dt.timedelta) else float(every or 0)
    return Every(round(seconds * 1000))
