"""Retry policies for ``@app.task(retry_on=..., retry_delay=...)``: how long to wait before the
next try, as a function of the try that just failed.

    from worker.core.retry import exponential

    @app.task(max_tries=8, retry_on=(TimeoutError, ConnectionError),
              retry_delay=exponential(base_s=1, cap_s=600))
    async def call_partner(ctx, order_id): ...

A task without ``retry_on`` keeps arq's semantics: an exception fails the job; raise
``arq.worker.Retry(defer=...)`` to try again. ``Retry()`` without ``defer`` uses the task's
``retry_delay`` when it has one.
"""

from __future__ import annotations

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
