"""The claim guard: holds every job step while this process may have lost its claims."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine, Generator
from types import CoroutineType
from typing import Any

from worker.core.clock import Clock


class ClaimGuard:
    """Holds job steps while this process may have lost its claims.

    The consumer confirms its claims with every successful Redis round trip (claim, finish,
    or the periodic check while jobs run). When none succeeded for ``doubt_s`` — the process
    was frozen (SIGSTOP, a stalled VM, a blocked loop) or cut off from Redis — the orphan
    reaper may have handed its jobs to another consumer. Then every job, at its next step,
    waits until the consumer has checked its claims; a job whose claim is gone is cancelled
    before it runs another line.
    """

    def __init__(self, clock: Clock, doubt_s: float) -> None:
        self.clock = clock
        self.doubt_s = doubt_s
        self.alive_at = clock.monotonic()
        self.lost: set[str] = set()
        self.wanted = asyncio.Event()  # a job is waiting for a check
        self._waiters: list[asyncio.Future[None]] = []

    def confirmed(self, since: float) -> None:
        """A round trip sent at ``since`` (monotonic) succeeded."""
        self.alive_at = max(self.alive_at, since)

    def in_doubt(self) -> bool:
        return self.clock.monotonic() - self.alive_at > self.doubt_s

    def wait(self) -> asyncio.Future[None]:
        """A future resolved at the next completed claim check."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self.wanted.set()
        return fut

    def checked(self, since: float, lost: set[str]) -> None:
        """The claims were checked (the check was sent at ``since``); ``lost`` are gone."""
        self.lost |= lost
        self.confirmed(since)
        waiters, self._waiters = self._waiters, []
        self.wanted.clear()
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def guard(self, aw: Awaitable[Any], job_id: str) -> Awaitable[Any]:
        # an async def's coroutine, told by its exact type first (the ABC check costs more)
        coro = aw if type(aw) is CoroutineType or isinstance(aw, Coroutine) else _await(aw)
        return _Guarded(coro, job_id, self)


def uncancel() -> None:
    """Withdraw every cancellation request of the current task (an abort may cancel a run more
    than once): the run handled it and ends normally."""
    task = asyncio.current_task()
    while task is not None and task.uncancel():
        pass


async def _await(aw: Awaitable[Any]) -> Any:
    return await aw


class _Guarded:
    """Runs a coroutine step by step; before each step taken in doubt, waits for the claim
    check and throws :class:`asyncio.CancelledError` into it when its claim is gone."""

    __slots__ = ("_coro", "_guard", "_job_id")

    def __init__(self, coro: Coroutine[Any, Any, Any], job_id: str, guard: ClaimGuard) -> None:
        self._coro = coro
        self._job_id = job_id
        self._guard = guard

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, guard = self._coro, self._guard
        value: Any = None
        error: BaseException | None = None
        while True:
            if guard.in_doubt() or self._job_id in guard.lost:
                try:
                    while guard.in_doubt() and self._job_id not in guard.lost:
                        yield from guard.wait().__await__()
                except BaseException as exc:  # cancelled while waiting: pass it on
                    error = exc
                if self._job_id in guard.lost and error is None:
                    error = asyncio.CancelledError("claim lost to another consumer")
            try:
                step = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as done:
                return done.value
            value, error = None, None
            try:
                value = yield step
            except BaseException as exc:
                error = exc
