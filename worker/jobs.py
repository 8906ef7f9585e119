"""What a consumer runs: job definitions, and the hooks features attach to every job.

The consumer knows no feature by name. A feature that needs something per job (limits hold a
job back until it has a slot; periodic jobs decode their tick from the job id; pollers settle
an item when its job ends) registers a :class:`JobHook` in the wiring (``worker/roles.py``);
the consumer calls every hook, in the order registered, for every job.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from worker.retry import RetryDelay
from worker.storage.keys import DEFAULT_QUEUE

TaskFn = Callable[..., Awaitable[Any]]
#: How a run of a job ended: ``retry`` covers arq's ``Retry`` and cancellation (it runs again).
Outcome = Literal["success", "failure", "retry"]


@dataclass(frozen=True)
class JobDef:
    """A function consumers run under ``name``. ``timeout_s``/``max_tries``/``keep_result_s``
    override the process defaults when set. ``queue`` is where its jobs wait; ``retry_on`` and
    ``retry_delay`` retry it automatically (see :mod:`worker.retry`); ``max_concurrency`` and
    ``rate`` limit it cluster-wide (see :mod:`worker.limits`)."""

    name: str
    fn: TaskFn
    timeout_s: float | None = None
    max_tries: int | None = None
    keep_result_s: float | None = None
    queue: str = DEFAULT_QUEUE
    retry_on: tuple[type[BaseException], ...] = ()
    retry_delay: RetryDelay | None = None
    max_concurrency: int | None = None
    rate: tuple[int, float] | None = None  # (jobs, per seconds)


class JobHook:
    """Per-job behaviour a feature adds to the consumer. Every step is optional (a no-op
    here); a feature overrides the ones it needs. For each job, in this order:

    1. :meth:`admit` before it starts: ``None`` lets it start; a time defers it;
    2. :meth:`context` for its ``ctx``;
    3. :meth:`release` once the run admitted is over (also when a later hook deferred it);
    4. :meth:`ended` with how the run ended.

    And :meth:`renew` with every claim check while jobs run (keep their leases).
    """

    async def admit(self, job: JobDef, job_id: str) -> int | None:
        """``None`` to let the job start now; else the time (epoch ms) to look again: the job
        is deferred, its try given back (a concurrency slot or rate allowance not free)."""
        return None

    def context(self, job_id: str) -> Mapping[str, Any]:
        """Extra values for the job's ``ctx`` (e.g. ``tick_ms``); empty when not concerned."""
        return {}

    async def release(self, job: JobDef, job_id: str) -> None:
        """The run :meth:`admit` let start is over: give back what it took."""

    async def ended(self, job_id: str, args: Sequence[Any], outcome: Outcome) -> None:
        """Called once a run ended (never raises into the consumer: errors are logged)."""

    async def renew(self) -> None:
        """With each claim check while jobs run (errors count as a failed check)."""
