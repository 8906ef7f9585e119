"""Redis outages: which errors mean "Redis cannot serve this now" (the one classification), and
how a framework call made inside a job rides one out.

An outage is Redis itself failing, not the code that called it: unreachable or timing out, a
primary failing over (``READONLY`` from a demoted one, ``MASTERDOWN``, ``TRYAGAIN`` /
``CLUSTERDOWN`` on a Cluster), loading its dataset (``LOADING``), busy in a script (``BUSY``),
or refusing writes until memory is freed (``OOM`` at ``maxmemory``), until it can persist
again (``MISCONF``: a failed RDB save or AOF write) or until enough replicas are back
(``NOREPLICAS``). Components treat one as a dependency outage (unready, never a crash loop:
:mod:`worker.core.component`); framework calls that are safe to send again ride it out
(:func:`ride_out`, used by ``ctx.poller(...)`` and the consumer's poll-item hook).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog
from redis.exceptions import (
    ClusterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker.core.clock import Clock

T = TypeVar("T")

log = structlog.get_logger("worker.outage")

#: redis-py's classes for an outage. ``ConnectionError`` covers ``BusyLoadingError``
#: (``LOADING``), ``MasterNotFoundError`` (no primary named by the Sentinels) and
#: :class:`~worker.core.errors.NotReplicated`; ``ClusterDownError`` covers ``MasterDownError``.
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    OutOfMemoryError,
    ReadOnlyError,
    ClusterDownError,
    TryAgainError,
)
#: Error codes (a reply's first word) of an outage, for replies redis-py leaves a plain
#: ``ResponseError``: writes refused for now, the server not ready or failing over.
OUTAGE_CODES = frozenset(
    {
        "OOM",  # maxmemory reached under noeviction
        "MISCONF",  # cannot persist (failed RDB save, AOF write error): writes refused
        "NOREPLICAS",  # min-replicas-to-write not met
        "READONLY",  # a replica (a demoted primary)
        "LOADING",  # loading the dataset after a restart
        "BUSY",  # a script or function running past its time limit
        "MASTERDOWN",  # a replica whose primary link is down (replica-serve-stale-data no)
        "TRYAGAIN",  # a Cluster slot being migrated (multi-key command)
        "CLUSTERDOWN",  # the Cluster cannot serve the slot
    }
)
#: redis-py's prefix on an error raised from a transaction (``MULTI``/``EXEC``) pipeline.
_PIPELINE_ERROR = " of pipeline caused error: "

#: How long a framework call made inside a job retries through an outage before it raises:
#: longer than a Sentinel failover at its default detection (``down-after-milliseconds``
#: 30 s, then the promotion) and than an operator freeing memory or disk takes to be noticed.
#: The job's own timeout still applies (the retries are cancelled with the job).
RIDE_OUT_S = 60.0
#: The first retry waits about this; each next one twice as long, up to :data:`RETRY_CAP_S`.
RETRY_FIRST_S = 0.05
RETRY_CAP_S = 1.0


def redis_outage(exc: BaseException) -> str | None:
    """What Redis outage ``exc`` reports (its class name, or the error code of a plain
    ``ResponseError`` such as ``MISCONF``), or ``None`` when it is not one (a bug, a wrong
    type, a script error, an ACL refusal: the caller's fault)."""
    if isinstance(exc, OUTAGE_ERRORS):
        return type(exc).__name__
    if isinstance(exc, ResponseError):
        text = str(exc)
        _, found, rest = text.partition(_PIPELINE_ERROR)
        code = (rest if found else text).split(" ", 1)[0]
        if code in OUTAGE_CODES:
            return code
    return None


async def ride_out(
    call: Callable[[], Awaitable[T]], clock: Clock, what: str, *, bound_s: float = RIDE_OUT_S
) -> T:
    """``await call()``, called again after a Redis outage (:func:`redis_outage`) with capped,
    jittered backoff until it succeeds; after ``bound_s`` the outage's error is raised. Any
    other error is raised at once. Only for calls that are safe to send again (a write that
    may have been applied before its reply was lost is applied once more)."""
    deadline = clock.monotonic() + bound_s
    delay = RETRY_FIRST_S
    logged = False
    while True:
        try:
            return await call()
        except Exception as exc:
            kind = redis_outage(exc)
            if kind is None or clock.monotonic() + delay > deadline:
                raise
            if not logged:
                logged = True
                log.info(
                    "Redis unavailable; retrying until it answers",
                    call=what,
                    error=kind,
                    bound_s=bound_s,
                )
        await clock.sleep(random.uniform(delay / 2, delay))
        delay = min(delay * 2, RETRY_CAP_S)
