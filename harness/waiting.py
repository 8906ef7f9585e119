"""Waiting for a condition: :func:`eventually` in async tests, :func:`wait_until` in sync ones.

Both poll until the predicate returns something truthy and return it; on timeout they fail the
test with ``what``. Bounds are generous on purpose: the box running the suite is shared and
loaded, and a wait ends as soon as its condition holds, so a long bound costs nothing when all
is well.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any, Protocol


class _FakeClock(Protocol):
    def monotonic(self) -> float: ...

    async def run_for(self, seconds: float, *, step: float) -> None: ...


async def eventually(
    pred: Callable[[], Any],
    what: str = "",
    *,
    within: float = 10.0,
    interval: float = 0.01,
    clock: _FakeClock | None = None,
) -> Any:
    """Poll ``pred`` (sync, or returning an awaitable) until truthy; return its value.

    With ``clock`` (a fake clock), ``within`` is fake time and each poll advances the clock by
    ``interval``, letting real I/O (a Redis round trip) complete in between.
    """
    loop = asyncio.get_running_loop()
    now: Callable[[], float] = loop.time if clock is None else clock.monotonic
    deadline = now() + within
    while True:
        value = pred()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if now() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what or pred}")
        if clock is None:
            await asyncio.sleep(interval)
        else:
            await clock.run_for(interval, step=interval)
            await asyncio.sleep(0.001)


def wait_until(
    predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.1, what: str = ""
) -> Any:
    """Poll ``predicate`` until truthy; fail the test with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def settle(predicate: Callable[[], Any], timeout: float, interval: float = 0.1) -> bool:
    """Poll ``predicate`` until truthy or ``timeout``; ``False`` then (the test measures what
    happened instead of failing on the wait)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
