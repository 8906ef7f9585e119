"""What a consumer runs: job definitions, and the hooks features attach to every job.

The consumer knows no feature by name. A feature that needs something per job (periodic jobs
decode their tick from the job id; pollers forget an item's in-flight entry when its job ends)
registers a :class:`JobHook`; the consumer calls every hook for every job.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

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


class JobHook(Protocol):
    """Per-job behaviour a feature adds to the consumer."""

    def context(self, job_id: str) -> Mapping[str, Any]:
        """Extra values for the job's ``ctx`` (e.g. ``tick_ms``); empty when not concerned."""

    async def ended(self, job_id: str, args: Sequence[Any], outcome: Outcome) -> None:
        """Called once a run ended (never raises into the consumer: errors are logged)."""
