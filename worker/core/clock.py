"""Injectable time: wall time for schedules, monotonic time for deadlines, and waiting.

Every component reads *and waits* through a :class:`Clock`, so timing logic (lease renewals,
backoff, heartbeats) is tested on a :class:`FakeClock` that only moves when a test advances it,
without sleeping and without wall-clock assertions (asynq's ``SimulatedClock`` idea).

A worker process and a :class:`~worker.client.Client` read wall time from a
:class:`RedisClock`: the Redis server's clock (``TIME``), carried between reads by this host's
monotonic clock. Every time two processes must agree on (a tick's instant, a job's due time, a
poll item's) is then on one clock, whatever the hosts' clocks say.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Clock(Protocol):
    """What components read time from and wait on. Tests pass a :class:`FakeClock`."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch (schedules, ticks, timestamps in Redis)."""

    def monotonic(self) -> float:
        """Monotonic seconds (deadlines, lease ages, backoff): never jumps with NTP."""

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``."""

    async def wait(self, events: asyncio.Event | Iterable[asyncio.Event], seconds: float) -> bool:
        """Wait up to ``seconds`` for any of ``events``; ``True`` if one is set."""

    async def wait_for(self, aw: Awaitable[T], seconds: float) -> T:
        """Await ``aw`` for at most ``seconds``; raise :class:`TimeoutError` after that."""


def _as_list(events: asyncio.Event | Iterable[asyncio.Event]) -> list[asyncio.Event]:
    return [events] if isinstance(events, asyncio.Event) else list(events)


async def _wait_events(events: list[asyncio.Event], timer: Callable[[], Awaitable[Any]]) -> bool:
    """Wait until any event is set or ``timer()`` completes; ``True`` if an event won."""
    if any(e.is_set() for e in events):
        return True
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    timer_task = asyncio.ensure_future(timer())
    try:
        await asyncio.wait([*waiters, timer_task], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in (*waiters, timer_task):
            w.cancel()
        await asyncio.gather(*waiters, timer_task, return_exceptions=True)
    return any(e.is_set() for e in events)


class SystemClock:
    """The real clock (its reads are the C functions themselves: a consumer reads the clock
    several times per job)."""

    monotonic = staticmethod(time.monotonic)
    time = staticmethod(time.time)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def wait(self, events: asyncio.Event | Iterable[asyncio.Event], seconds: float) -> bool:
        evs = _as_list(events)
        if len(evs) == 1:  # the common case, without helper tasks
            if evs[0].is_set():
                return True
            try:
                await asyncio.wait_for(evs[0].wait(), max(0.0, seconds))
            except TimeoutError:
                return False
            return True
        return await _wait_events(evs, lambda: asyncio.sleep(max(0.0, seconds)))

    async def wait_for(self, aw: Awaitable[T], seconds: float) -> T:
        return await asyncio.wait_for(aw, max(0.0, seconds))


class FakeClock:
    """A clock that only moves when told to; sleepers wake when it passes their deadline.

    ``advance(s)`` is synchronous: it moves both clocks and resolves every timer that is due;
    the woken coroutines run at the test's next ``await``. :meth:`run_for` advances in steps and
    yields to the event loop between them, which is what most tests want.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._wall = start
        self._mono = 1000.0
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def time(self) -> float:
        return self._wall

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._wall += seconds
        self._mono += seconds
        while self._timers and self._timers[0][0] <= self._mono:
            _, _, fut = heapq.heappop(self._timers)
            if not fut.done():
                fut.set_result(None)

    async def run_for(self, seconds: float, step: float = 0.01) -> None:
        """Advance ``seconds`` in ``step``s, letting woken coroutines run after each step."""
        end = self._mono + seconds
        while self._mono < end - 1e-9:
            self.advance(min(step, end - self._mono))
            for _ in range(5):
                await asyncio.sleep(0)

    def _timer(self, seconds: float) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if seconds <= 0:
            fut.set_result(None)
        else:
            heapq.heappush(self._timers, (self._mono + seconds, next(self._seq), fut))
        return fut

    async def sleep(self, seconds: float) -> None:
        await self._timer(seconds)

    async def wait(self, events: asyncio.Event | Iterable[asyncio.Event], seconds: float) -> bool:
        return await _wait_events(_as_list(events), lambda: self._timer(seconds))

    async def wait_for(self, aw: Awaitable[T], seconds: float) -> T:
        task = asyncio.ensure_future(aw)
        timer = self._timer(seconds)
        both: list[asyncio.Future[Any]] = [task, timer]
        try:
            await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise TimeoutError


class RedisClock:
    """The Redis server's clock, read on this host: the server's ``TIME`` from the last sync,
    plus the monotonic time elapsed since the reply came back.

    That is a lower bound of the server's clock (``TIME`` was read before the reply arrived),
    late by at most the sync's round trip and never early, so a job or tick due by the server's
    clock is never seen due before its instant. A host's wall clock (skewed, stepped by NTP,
    faked) plays no part; its monotonic clock only measures the seconds since the last sync
    (:meth:`observe` is fed on every heartbeat; :meth:`ensure` syncs when that is older than
    ``max_age_s``). Until a first sync it reads the host's clock. Waiting and monotonic time
    are the host's (``base``).
    """

    #: A sample with a round trip this many times the current one's is ignored while the
    #: current one is younger than ``KEEP_S`` (a slow reply would make the clock later).
    SLOW_FACTOR = 4.0
    KEEP_S = 30.0
    #: A new sample that puts the clock back by less than this is held until the clock
    #: catches up (round-trip noise: a due job seen due stays due); a larger step is another
    #: server's clock (a failover) and is taken.
    STEP_BACK_S = 1.0

    def __init__(self, base: Clock | None = None) -> None:
        self.base: Clock = base or SystemClock()
        #: server seconds minus host monotonic seconds, at the reply of the kept sample
        self._offset: float | None = None
        self._rtt_s = 0.0
        self._synced_at = float("-inf")  # host monotonic time of the kept sample's reply
        self._floor = float("-inf")  # the latest time read: the clock does not step back

    @property
    def synced(self) -> bool:
        return self._offset is not None

    def sample_age_s(self) -> float:
        """Seconds since the kept sample's reply (infinite before the first sync)."""
        return self.base.monotonic() - self._synced_at

    @property
    def rtt_s(self) -> float:
        """Round trip of the kept sample: how late :meth:`time` may be, at most."""
        return self._rtt_s

    def time(self) -> float:
        if self._offset is None:
            return self.base.time()
        now = self.base.monotonic() + self._offset
        if self._floor - self.STEP_BACK_S < now < self._floor:
            # a new sample with a slower round trip put the clock a few ms back: hold it (the
            # value read before stays a lower bound of the server's clock, which only went on)
            return self._floor
        self._floor = now
        return now

    def monotonic(self) -> float:
        return self.base.monotonic()

    async def sleep(self, seconds: float) -> None:
        await self.base.sleep(seconds)

    async def wait(self, events: asyncio.Event | Iterable[asyncio.Event], seconds: float) -> bool:
        return await self.base.wait(events, seconds)

    async def wait_for(self, aw: Awaitable[T], seconds: float) -> T:
        return await self.base.wait_for(aw, seconds)

    def observe(self, server_ms: float, sent: float, received: float) -> None:
        """A ``TIME`` reply: ``server_ms`` read between host monotonic ``sent`` and
        ``received`` (seconds)."""
        rtt = max(0.0, received - sent)
        fresh = received - self._synced_at < self.KEEP_S
        if self._offset is not None and fresh and rtt > self._rtt_s * self.SLOW_FACTOR + 0.001:
            return
        # half a millisecond under: rounded to ms (:func:`ms`), it stays a lower bound
        self._offset = server_ms / 1000 - received - 0.0005
        self._rtt_s = rtt
        self._synced_at = received

    async def sync(self, read_server_ms: Callable[[], Awaitable[float]]) -> None:
        """Read the server's clock now (``read_server_ms``: ``TIME`` in ms)."""
        sent = self.base.monotonic()
        server_ms = await read_server_ms()
        self.observe(server_ms, sent, self.base.monotonic())

    async def ensure(
        self, read_server_ms: Callable[[], Awaitable[float]], max_age_s: float = 60.0
    ) -> None:
        """:meth:`sync` unless a sample younger than ``max_age_s`` is kept."""
        if self.base.monotonic() - self._synced_at >= max_age_s:
            await self.sync(read_server_ms)


async def on_server_time(clock: Clock, read_server_ms: Callable[[], Awaitable[float]]) -> None:
    """Before reading ``clock`` for a time another process compares: a :class:`RedisClock`
    syncs when its last sample is old (a client has no heartbeat feeding it); other clocks
    (:class:`FakeClock`, :class:`SystemClock`) are left alone."""
    if isinstance(clock, RedisClock):
        await clock.ensure(read_server_ms)


def host_clock(clock: Clock) -> Clock:
    """The host's own clock under ``clock`` (a :class:`RedisClock`'s base, else itself)."""
    return clock.base if isinstance(clock, RedisClock) else clock


def ms(seconds: float) -> int:
    """Seconds to integer milliseconds."""
    return round(seconds * 1000)
