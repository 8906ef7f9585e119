"""The loop watchdog: notices, from a thread of its own, an event loop blocked by a synchronous
call, and acts while it is still blocked.

A task that calls ``time.sleep`` (the classic mistake in async code), runs a long CPU-bound
loop or uses a blocking client stops every task of the process: no heartbeat, no lease renew,
no record of the jobs that just ended. Seen from Redis the process is dead: the leader's orphan
reaper hands its jobs to another consumer and a standby takes the lease. Both are right for the
job that blocks (it runs again, the documented at-least-once), but a run that had *finished*
before the block must not run again because its end was still waiting in memory for the next
batched ``FINISH``. So:

- the loop beats every ``interval``; ``worker_event_loop_lag_seconds`` (a histogram) measures
  how late each beat came;
- a thread watches the beat. Late by ``threshold_s`` (:func:`blocked_threshold_s`: before the
  renew deadline and well before the orphan bound), the loop is blocked: one WARNING naming
  where the loop thread is (its innermost frames), ``worker_event_loop_blocks`` counts it, and
  while the block lasts, at every beat it misses, every component with a
  ``loop_blocked(store, lag_s)`` coroutine (:class:`BlockedAware`) runs it in the thread's own
  event loop, on a Redis connection of its own, in the order given: the consumer records the
  ends it holds; the elector, once its renew deadline has passed, drops its lock (a standby
  takes over before the lease expires);
- when the loop runs again, one WARNING says for how long it was blocked.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol, runtime_checkable

import structlog

from worker.core.clock import Clock, SystemClock
from worker.core.component import Component
from worker.core.metrics import Metrics
from worker.storage import Store

log = structlog.get_logger("worker.watchdog")

NAME = "loop-watchdog"
#: Longest an action may take in the watchdog's thread (a Redis that does not answer).
ACTION_TIMEOUT_S = 5.0
#: Frames named in the "blocked" warning, innermost first.
WHERE_FRAMES = 3


@runtime_checkable
class BlockedAware(Protocol):
    """A component that acts while the event loop is blocked: called in the watchdog's thread,
    with a :class:`~worker.storage.Store` on the thread's own connection, at every beat the loop
    misses (so each call decides whether there is anything to do yet)."""

    async def loop_blocked(self, store: Store, lag_s: float) -> None: ...


def blocked_threshold_s(
    setting_s: float, *, renew_deadline_s: float, orphan_stale_s: float, heartbeat_s: float
) -> float:
    """Lag at which the loop counts as blocked: ``WORKER_LOOP_BLOCKED_S``, at most half the
    renew deadline (the lease is given up before the process doubts it) and half of what the
    orphan bound leaves after a heartbeat interval (ends are recorded before the reaper can
    judge the process dead)."""
    return min(setting_s, renew_deadline_s / 2, max(orphan_stale_s - heartbeat_s, 0.1) / 2)


class LoopWatchdog(Component):
    """Beats in the loop, watches the beat from a thread (see module docstring).

    ``actions()`` lists the components to call while blocked (read when a block starts);
    ``store()`` makes the thread's Store (called in the thread, once, when first needed).
    """

    def __init__(
        self,
        actions: Callable[[], Iterable[object]],
        store: Callable[[], Store],
        *,
        metrics: Metrics | None = None,
        threshold_s: float = 2.0,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(NAME, clock or SystemClock(), sla_s=None)
        self.actions = actions
        self.make_store = store
        self.metrics = metrics
        self.threshold_s = threshold_s
        self.interval_s = min(0.5, max(0.05, threshold_s / 4))
        self._beat = time.monotonic()
        self._loop_thread: int | None = None
        self._blocked_since: float | None = None  # set by the thread, cleared by the loop
        self._halt = threading.Event()

    # -- the loop side ------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        self._loop_thread = threading.get_ident()
        self._beat = time.monotonic()
        self._halt.clear()
        thread = threading.Thread(target=self._watch, name="worker-loop-watchdog", daemon=True)
        thread.start()
        try:
            while not stop.is_set():
                before = time.monotonic()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.interval_s)
                self._beat_once(before)
        finally:
            self._halt.set()
            await asyncio.to_thread(thread.join, ACTION_TIMEOUT_S + 1)

    def _beat_once(self, before: float) -> None:
        now = time.monotonic()
        self._beat = now
        lag = max(0.0, now - before - self.interval_s)
        if self.metrics is not None:
            self.metrics.loop_lag.observe(lag)
        self.health.ok(now)
        self.health.extra["lag_s"] = round(lag, 3)
        since = self._blocked_since
        if since is not None:
            self._blocked_since = None
            log.warning("event loop ran again after a block", blocked_s=round(now - since, 3))

    # -- the thread side ----------------------------------------------------------------------
    def _watch(self) -> None:
        loop = asyncio.new_event_loop()
        store: Store | None = None
        try:
            actions: list[BlockedAware] = []
            failing: set[str] = set()
            while not self._halt.wait(self.interval_s):
                beat = self._beat
                lag = time.monotonic() - beat - self.interval_s
                if lag < self.threshold_s:
                    continue
                if self._blocked_since is None:
                    self._blocked_since = beat
                    actions = [c for c in self.actions() if isinstance(c, BlockedAware)]
                    failing = set()
                    log.warning(
                        "event loop blocked",
                        lag_s=round(lag, 3),
                        threshold_s=self.threshold_s,
                        where=self._where(),
                        acting=[_name(c) for c in actions],
                    )
                    if self.metrics is not None:
                        self.metrics.loop_blocks.inc()
                if not actions:
                    continue
                try:
                    store = store or self.make_store()
                except Exception as exc:
                    log.error("loop watchdog cannot connect", error=f"{type(exc).__name__}: {exc}")
                    actions = []
                    continue
                loop.run_until_complete(self._act(actions, store, lag, failing))
        finally:
            if store is not None:
                with contextlib.suppress(Exception):
                    loop.run_until_complete(store.redis.aclose(close_connection_pool=True))
            loop.close()

    async def _act(
        self, actions: list[BlockedAware], store: Store, lag: float, failing: set[str]
    ) -> None:
        """Run each action in order; a failure is logged once per block (tried again at the
        next missed beat)."""
        for action in actions:
            try:
                await asyncio.wait_for(action.loop_blocked(store, lag), ACTION_TIMEOUT_S)
            except Exception as exc:
                if _name(action) not in failing:
                    failing.add(_name(action))
                    log.error(
                        "could not act on the blocked loop; trying again",
                        component=_name(action),
                        error=f"{type(exc).__name__}: {exc}",
                    )

    def _where(self) -> str:
        """The loop thread's innermost Python frames, innermost first."""
        frame = sys._current_frames().get(self._loop_thread or -1)
        if frame is None:
            return "?"
        stack = traceback.extract_stack(frame, limit=WHERE_FRAMES)
        return " < ".join(
            f"{'/'.join(Path(f.filename).parts[-2:])}:{f.lineno} {f.name}" for f in reversed(stack)
        )


def _name(component: object) -> str:
    return str(getattr(component, "name", type(component).__name__))
