"""A run's progress (``await ctx.progress(fraction, message)``): validated, throttled to one
write per :data:`EVERY_S` per run, the latest value always written, never failing the job."""

from __future__ import annotations

import asyncio
import contextlib
import math

import structlog

from worker.core.clock import Clock, ms
from worker.storage import Store

log = structlog.get_logger("worker.consumer")

#: At most one progress write per run this often (s); a call in between is kept and written
#: when the interval has passed (or when the run ends).
EVERY_S = 0.5
#: Longest progress message kept (characters).
MESSAGE_CHARS = 1024
#: How long one write may take before it is given up (a Redis that is away).
WRITE_TIMEOUT_S = 2.0


def checked(fraction: float, message: str | None) -> tuple[float, str | None]:
    """``(fraction, message)`` when ``0 <= fraction <= 1``, else ``ValueError``; a message
    that is not ``None`` is text, cut at :data:`MESSAGE_CHARS`."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise ValueError(f"progress fraction must be a number from 0 to 1, not {fraction!r}")
    if not (math.isfinite(fraction) and 0.0 <= fraction <= 1.0):
        raise ValueError(f"progress fraction must be from 0 to 1, not {fraction!r}")
    if message is not None:
        message = str(message)[:MESSAGE_CHARS]
    return float(fraction), message


class Progress:
    """The throttled progress writer of one run (``<prefix>progress:<id>``, PX ``ttl_ms``)."""

    def __init__(self, store: Store | None, job_id: str, ttl_ms: int, clock: Clock) -> None:
        self.store = store
        self.job_id = job_id
        self.ttl_ms = ttl_ms
        self.clock = clock
        self._pending: tuple[float, str | None, int] | None = None
        self._last = -math.inf
        self._later: asyncio.Task[None] | None = None
        self._lock: asyncio.Lock | None = None  # made at the first report (most runs: none)
        self._warned = False

    @property
    def pending(self) -> bool:
        """A value waits to be written (:meth:`flush` writes it)."""
        return self._pending is not None or self._later is not None

    async def report(self, fraction: float, message: str | None = None) -> None:
        """Record ``fraction`` (0..1) and ``message``: written now, or within
        :data:`EVERY_S` of the last write (a call meanwhile returns at once)."""
        fraction, message = checked(fraction, message)
        self._pending = (fraction, message, ms(self.clock.time()))
        wait = self._last + EVERY_S - self.clock.monotonic()
        if self._lock is None:
            self._lock = asyncio.Lock()
        if wait <= 0 and not self._lock.locked():
            await self._write()
        elif self._later is None:
            self._later = asyncio.create_task(self._trailing(max(wait, 0.0)))

    async def flush(self) -> None:
        """Write the value not written yet (the run ends); never raises."""
        later, self._later = self._later, None
        if later is not None:
            later.cancel()
            with contextlib.suppress(BaseException):
                await later
        with contextlib.suppress(Exception):
            await self._write()

    async def _trailing(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self._later = None
        await self._write()

    async def _write(self) -> None:
        if self._lock is None:
            return  # nothing was ever reported
        async with self._lock:
            pending, self._pending = self._pending, None
            if pending is None or self.store is None:
                return
            self._last = self.clock.monotonic()
            fraction, message, at_ms = pending
            try:
                async with asyncio.timeout(WRITE_TIMEOUT_S):
                    await self.store.set_progress(
                        self.job_id, fraction, message, at_ms, self.ttl_ms
                    )
            except Exception as exc:
                if not self._warned:  # once per run: a job is never failed by its progress
                    self._warned = True
                    log.warning(
                        "job progress not recorded",
                        job_id=self.job_id,
                        error=f"{type(exc).__name__}: {exc}",
                    )
