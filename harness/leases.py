"""A leader view with a fixed lock value, for components run directly (tests, benches)."""

from __future__ import annotations

import asyncio

from worker.core.ids import LockValue


class FixedLease:
    """A :class:`worker.core.views.LeaderView` with a fixed lock value: components under test
    "lead" with it; refusals reported through :meth:`lost` are recorded (``strict=True``: a
    refusal raises, for a benchmark that must not run on after one)."""

    def __init__(self, value: str | None, *, strict: bool = False) -> None:
        self.value = value
        self.strict = strict
        self.losses: list[str] = []

    @property
    def lock(self) -> LockValue | None:
        return LockValue.parse(self.value)

    @property
    def epoch(self) -> int | None:
        return self.lock.epoch if self.lock is not None else None

    def is_leading(self) -> bool:
        return self.lock is not None

    def lost(self, reason: str) -> None:
        self.losses.append(reason)
        if self.strict:
            raise RuntimeError(f"lease lost: {reason}")

    async def settled(self, stop: asyncio.Event) -> bool:
        return self.is_leading() and not stop.is_set()
