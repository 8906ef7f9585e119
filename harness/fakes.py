"""Small stand-ins the tests and benches share."""

from __future__ import annotations

import datetime as dt
from typing import Any

from worker.core.component import Backoff


class RecordingBackoff(Backoff):
    """A real Backoff that records every delay and ceiling it hands out."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.delays: list[float] = []
        self.ceilings: list[float] = []

    def next_delay(self) -> float:
        self.ceilings.append(min(self.cap_s, self.base_s * 2**self.attempt))
        d = super().next_delay()
        self.delays.append(d)
        return d


def utc_ms(*args: int) -> int:
    """``utc_ms(2026, 3, 1, 12)``: that UTC instant in epoch milliseconds."""
    return int(dt.datetime(*args, tzinfo=dt.UTC).timestamp() * 1000)  # type: ignore[misc]
