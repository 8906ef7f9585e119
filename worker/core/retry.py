"""Retry policies for ``@app.task(retry_on=..., retry_delay=...)``: how long to wait before the
next try, as a function of the try that just failed.

    from worker.core.retry import exponential

    @app.task(max_tries=8, retry_on=(TimeoutError, ConnectionError),
              retry_delay=exponential(base_s=1, cap_s=600))
    async def call_partner(ctx, order_id): ...

A task without ``retry_on`` keeps arq's semantics: an exception fails the job; raise
:class:`Retry` (``worker.Retry(defer=...)``) to try again. ``Retry()`` without ``defer`` uses
the task's ``retry_delay`` when it has one. arq's own ``arq.worker.Retry`` and ``RetryJob``
count too (an arq app moved in unchanged raises them): they are recognised by class, without
importing arq.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable

#: Seconds to wait after try ``n`` (1-based) failed.
RetryDelay = Callable[[int], float]


def fixed(seconds: float) -> RetryDelay:
    """The same wait after every failed try."""
    if seconds < 0:
        raise ValueError("retry delay must not be negative")
    return lambda _try: seconds


def exponential(base_s: float = 1.0, cap_s: float = 300.0, *, jitter: bool = True) -> RetryDelay:
    """``base_s * 2**(n - 1)`` after try ``n``, at most ``cap_s``; with ``jitter`` a uniform
    draw from the upper half, so many jobs failing together do not retry together."""
    if base_s <= 0 or cap_s < base_s:
        raise ValueError("exponential retry needs 0 < base_s <= cap_s")

    def delay(n: int) -> float:
        ceiling = min(cap_s, base_s * 2 ** max(0, n - 1))
        return random.uniform(ceiling / 2, ceiling) if jitter else ceiling

    return delay


def as_delay(value: float | RetryDelay | None) -> RetryDelay | None:
    """A number becomes :func:`fixed`; a callable is used as it is."""
    if value is None or callable(value):
        return value
    return fixed(float(value))


# -- retry requests: what a task raises to run again --------------------------------------

#: arq's classes, by module and name (recognised without importing arq).
_ARQ = {("arq.worker", "Retry"), ("arq.worker", "RetryJob")}


def _to_ms(defer: float | dt.timedelta | None) -> int | None:
    if defer is None:
        return None
    seconds = defer.total_seconds() if isinstance(defer, dt.timedelta) else defer
    return round(seconds * 1000)


class Retry(RuntimeError):
    """Run the job again (while ``max_tries`` allows): after ``defer`` (seconds or a
    ``timedelta``), else after the task's ``retry_delay``, else at once. Behaves as arq's
    ``arq.worker.Retry``."""

    def __init__(self, defer: float | dt.timedelta | None = None) -> None:
        self.defer_score: int | None = _to_ms(defer)

    def __repr__(self) -> str:
        return f"<Retry defer {(self.defer_score or 0) / 1000:0.2f}s>"

    def __str__(self) -> str:
        return repr(self)


class RetryJob(RuntimeError):
    """Run the job again at its original due time (as arq's ``arq.worker.RetryJob``)."""


def _arq_kind(exc: BaseException) -> str | None:
    for cls in type(exc).__mro__:
        if (cls.__module__, cls.__name__) in _ARQ:
            return cls.__name__
    return None


def is_retry(exc: BaseException) -> bool:
    """``exc`` asks for another try: a :class:`Retry` or :class:`RetryJob`, ours or arq's."""
    return isinstance(exc, Retry | RetryJob) or _arq_kind(exc) is not None


def retry_defer_ms(exc: BaseException) -> int | None:
    """The delay a retry request asked for, in ms (``None``: none asked)."""
    if isinstance(exc, Retry) or _arq_kind(exc) == "Retry":
        defer = getattr(exc, "defer_score", None)
        return defer if isinstance(defer, int) else None
    return None
