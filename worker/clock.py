"""Injectable clock: wall time for schedules, monotonic time for deadlines."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """What components read time from. Tests pass a :class:`FakeClock`."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch (schedules, ticks, timestamps in Redis)."""

    def monotonic(self) -> float:
        """Monotonic seconds (deadlines, lease ages, backoff): never jumps with NTP."""


class SystemClock:
    """The real clock."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._wall = start
        self._mono = 1000.0

    def time(self) -> float:
        return self._wall

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._wall += seconds
        self._mono += seconds

    def set_time(self, wall: float) -> None:
        self._wall = wall


def ms(seconds: float) -> int:
    """Seconds to integer milliseconds."""
    return round(seconds * 1000)
