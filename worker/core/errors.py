"""Exceptions the framework raises and the CLI maps to exit codes."""

from __future__ import annotations

from redis.exceptions import ConnectionError as RedisConnectionError


class WorkerError(Exception):
    """Base class for the framework's own errors."""


class ConfigError(WorkerError):
    """Bad configuration or start-up input. The message is one line; the CLI exits with 2."""


class UnknownTask(WorkerError, ValueError):
    """An enqueue named a function the client's app does not declare (a misspelling would
    otherwise be dead-lettered later as an unknown function). Nothing was enqueued."""

    def __init__(self, function: str, app: str, known: list[str]) -> None:
        import difflib

        close = difflib.get_close_matches(function, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        shown = ", ".join(repr(n) for n in known[:20]) + (" …" if len(known) > 20 else "")
        super().__init__(
            f"unknown task {function!r}: app {app!r} declares {shown or 'no tasks'}{hint}"
        )
        self.function = function
        self.known = known


class InvalidId(WorkerError, ValueError):
    """An enqueue gave a job id or unique key holding a control, format or separator
    character (see :func:`worker.core.ids.check_id`). Nothing was enqueued."""


class PayloadTooLarge(WorkerError, ValueError):
    """An enqueue whose job record is larger than ``WORKER_MAX_PAYLOAD_BYTES``: every consumer
    would set it aside (dead letter ``oversized``) at its first claim, so it is refused here and
    nothing was enqueued."""

    def __init__(self, function: str, size: int, limit: int) -> None:
        super().__init__(
            f"job {function!r} not enqueued: its payload is {size} bytes, over "
            f"WORKER_MAX_PAYLOAD_BYTES ({limit}); no consumer would run it (pass large data by "
            "reference, or raise the limit on the workers and the client alike)"
        )
        self.function = function
        self.size = size
        self.limit = limit


class JobExpired(WorkerError):
    """A job not started by its deadline (``enqueue(..., expires_in=...)``): it never ran.
    What its result record holds (``success`` false) and what ``on_job_end`` hooks see
    (``JobOutcome.status == "expired"``)."""


class LeadershipLost(WorkerError):
    """A fenced write was refused: this process no longer holds the leader lock."""


class ShardFenced(LeadershipLost):
    """A queue shard's fence refused the lease epoch (``fenced.TOKEN_FENCE``): a newer leader
    raised it, or someone wrote a fence above every epoch. Whoever writes to the shard checks
    the lease at home to tell which (``OrphanReaper``): the lease is not lost by this alone."""

    def __init__(self, message: str, fence: str) -> None:
        super().__init__(message)
        #: the fence as the shard holds it
        self.fence = fence


class NotReplicated(WorkerError, RedisConnectionError):
    """A write reached the primary, but fewer replicas than ``WORKER_REDIS_WAIT_REPLICAS``
    confirmed it within ``WORKER_REDIS_WAIT_TIMEOUT_S``: a primary failover may still lose it.

    Like a connection error mid-command, the write may or may not survive: retry it (an
    enqueue with a ``unique_key`` cannot duplicate). It is a redis-py ``ConnectionError``, so
    code that retries on connection trouble retries on this too.
    """

    def __init__(self, what: str, acked: int, wanted: int, timeout_ms: int) -> None:
        super().__init__(
            f"{what}: confirmed by {acked} of the {wanted} replica(s) required within "
            f"{timeout_ms} ms (WORKER_REDIS_WAIT_REPLICAS); a failover may lose it"
        )
        self.what = what
        self.acked = acked
        self.wanted = wanted
