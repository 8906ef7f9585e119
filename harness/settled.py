"""A fake clock that never outruns Redis: fake time moves only while no command is in flight.

A test drives :class:`worker.core.clock.FakeClock` in small steps and lets real I/O (a Redis
round trip) run in between. On a loaded box a round trip can take longer than a step's real
time, and fake time then passes *during* the request: a renew that took 5 ms of real time
"took" 0.6 s of fake time and missed its deadline. :class:`SettledClock` counts the commands in
flight on every asyncio Redis client (:func:`counting`) and waits for none before each step,
so a round trip costs no fake time however slow the box is. A command in flight for longer
than ``max_wait_s`` of real time (a blocking read) lets the step go ahead.

Not used by the processes the tests spawn (they run on real time).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

from redis.asyncio.client import Redis

from worker.core.clock import FakeClock

#: commands sent on an asyncio Redis client whose reply has not come back (inside counting())
_in_flight = 0


def _counted(execute: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(execute)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        global _in_flight
        _in_flight += 1
        try:
            return await execute(self, *args, **kwargs)
        finally:
            _in_flight -= 1

    return wrapper


@contextlib.contextmanager
def counting() -> Iterator[None]:
    """Count the commands in flight (``Redis.execute_command``; a pipeline's ``execute``
    calls it not) while the block runs."""
    original = Redis.execute_command
    Redis.execute_command = _counted(original)  # type: ignore[method-assign]
    try:
        yield
    finally:
        Redis.execute_command = original  # type: ignore[method-assign]


class SettledClock(FakeClock):
    """:class:`FakeClock` whose :meth:`run_for` steps only once no Redis command is in flight
    (inside :func:`counting`)."""

    def __init__(self, *args: Any, max_wait_s: float = 10.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_wait_s = max_wait_s

    async def settle(self) -> None:
        """Let woken coroutines run, then wait (real time) for their commands' replies."""
        deadline = time.monotonic() + self.max_wait_s
        while True:
            for _ in range(5):
                await asyncio.sleep(0)
            if _in_flight == 0 or time.monotonic() > deadline:
                return
            await asyncio.sleep(0.001)

    async def run_for(self, seconds: float, step: float = 0.01) -> None:
        end = self.monotonic() + seconds
        while self.monotonic() < end - 1e-9:
            await self.settle()
            self.advance(min(step, end - self.monotonic()))
        await self.settle()
