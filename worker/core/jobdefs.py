"""What a consumer runs: job definitions, and the hooks features attach to every job.

The consumer knows no feature by name. A feature that needs something per job (limits hold a
job back until it has a slot; periodic jobs decode their tick from the job id; pollers settle
an item when its job ends) registers a :class:`JobHook` in the wiring (``worker/runtime/roles.py``);
the consumer calls every hook, in the order registered, for every job the hook concerns
(:meth:`JobHook.concerns`) and only for the steps it overrides (:class:`HookPlan`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

import structlog

from worker.core.errors import JobExpired
from worker.core.flow import NO_FLOW, TaskFlow
from worker.core.retry import RetryDelay

log = structlog.get_logger("worker.consumer")

TaskFn = Callable[..., Awaitable[Any]]
#: How a run of a job ended: ``retry`` covers arq's ``Retry`` and cancellation (it runs again).
#: The metrics' ``outcome`` label; :class:`JobOutcome` tells the finer :data:`Status`.
Outcome = Literal["success", "failure", "retry"]
#: How a run ended, as hooks see it: ``success``; ``failed`` (raised, will not run again);
#: ``retry`` (runs again: arq's ``Retry``, a ``retry_on`` error with tries left, its claim
#: taken over, a shutdown cut); ``cancelled`` (aborted); ``timeout`` (its ``timeout_s``
#: expired); ``dead`` (a ``retry_on`` error with no tries left: set aside as a dead letter);
#: ``expired`` (not started by its deadline: it never ran).
Status = Literal["success", "failed", "retry", "cancelled", "timeout", "dead", "expired"]


#: What :meth:`JobHook.admit` gets for a job whose record is not at hand (an empty map).
NO_RECORD: Mapping[str, Any] = MappingProxyType({})

#: The queue a task\'s jobs go to unless it names one (arq\'s own queue key, ``arq:queue``).
DEFAULT_QUEUE = "default"

#: What a queue's duty lane is named after: ``<queue>:duty`` (a queue name has no ``:``, so no
#: queue of the app's own can be named so). The leader's duties (periodic ticks, poll jobs)
#: enqueue there; a consumer claims a queue's lane before the queue, with slots of its own
#: (``WORKER_DUTY_SLOTS``). To arq it is one more sorted set of job ids: a queue like any other.
DUTY_LANE = ":duty"


def duty_lane(queue: str) -> str:
    """The duty lane of ``queue`` (a queue name, see :data:`DUTY_LANE`)."""
    return queue + DUTY_LANE


def is_duty_lane(queue: str) -> bool:
    return queue.endswith(DUTY_LANE)


def with_lanes(queues: Sequence[str]) -> tuple[str, ...]:
    """What a consumer of ``queues`` claims from, highest priority first: every queue's duty
    lane, then the queues themselves."""
    return (*(duty_lane(q) for q in queues), *queues)


@dataclass(frozen=True)
class JobOutcome:
    """How one run of a job ended, as ``@app.on_job_end`` hooks receive it.

    ``error`` is what the run raised (``None`` on success); ``result`` what it returned;
    ``duration_s`` how long the function ran (monotonic); ``job_try`` the try (1 first)."""

    status: Status
    task: str
    job_id: str
    job_try: int
    duration_s: float
    error: BaseException | None = None
    result: Any = None


def status_of(
    outcome: Outcome, error: BaseException | None, *, timed_out: bool, dead: bool
) -> Status:
    """The :data:`Status` of a run from its internal :data:`Outcome`: a failure is
    ``cancelled`` when the run was cancelled (an abort), ``expired`` when it was not started by
    its deadline (:class:`~worker.core.errors.JobExpired`), ``dead`` when it was set aside,
    ``timeout`` when the job's own timeout cut it, else ``failed``."""
    if outcome != "failure":
        return outcome
    if isinstance(error, asyncio.CancelledError):
        return "cancelled"
    if isinstance(error, JobExpired):
        return "expired"
    if dead:
        return "dead"
    return "timeout" if timed_out else "failed"


@dataclass(frozen=True)
class JobRun:
    """One run as :meth:`JobHook.started` and :meth:`JobHook.finished` see it: the job, its
    id, the queue it was claimed from, the try, the ``ctx`` the function gets (a
    :class:`~worker.context.JobContext`) and the job's record (arq's map, with any extra
    field a feature wrote at enqueue)."""

    job: JobDef
    job_id: str
    queue: str
    job_try: int
    ctx: Any
    record: Mapping[str, Any]


@dataclass(frozen=True)
class JobDef:
    """A function consumers run under ``name``. ``timeout_s``/``max_tries``/``keep_result_s``
    override the process defaults when set. ``queue`` is where its jobs wait; ``retry_on`` and
    ``retry_delay`` retry it automatically (see :mod:`worker.core.retry`); ``max_concurrency`` and
    ``rate`` limit it cluster-wide, ``max_concurrency_per_key`` and ``rate_per_key`` the same per
    flow key (see :mod:`worker.consumer.limits`); ``flow_key`` computes a job's flow key from its
    arguments when the enqueue names none; ``fair``: its jobs are taken round-robin across flow
    keys (see :mod:`worker.storage.fair`)."""

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
    #: the task's flow defaults: flow key, deadline, coalescing (``@app.task(...)``)
    flow: TaskFlow = NO_FLOW
    fair: bool = False
    max_concurrency_per_key: int | None = None
    rate_per_key: tuple[int, float] | None = None  # (jobs, per seconds)
    #: how a workflow step of this task gets its parents' results: its first argument after
    #: ``ctx`` (``args``) or ``ctx.parents`` (``context``)
    parents: Literal["args", "context"] = "args"


class SkipRun(Exception):
    """Raised by a hook's :meth:`JobHook.started`: the run does not start and ends cancelled,
    as an aborted job does (a cancelled workflow's step)."""


class JobHook:
    """Per-job behaviour a feature adds to the consumer. Every step is optional (a no-op
    here); a feature overrides the ones it needs. For each job, in this order:

    1. :meth:`admit` before it starts: ``None`` lets it start; a time defers it;
    2. :meth:`context` for its ``ctx``;
    3. :meth:`started` just before the function runs (in hook order);
    4. :meth:`release` once the run admitted is over (also when a later hook deferred it);
    5. :meth:`ended` with how the run ended (the internal :data:`Outcome`);
    6. :meth:`finished` with the run's :class:`JobOutcome` (in reverse hook order, so a hook
       listed first wraps the others, as a tracing span does).

    Between 4 and 5, :meth:`settle` with the run's :class:`JobOutcome`, before its end is
    handed to the completer: what must be written before the job is finished (a workflow's
    fan-in). :meth:`started` may raise :class:`SkipRun`: the run does not start.

    :meth:`started` and :meth:`finished` are called only when a hook overrides them, and
    only for runs that started (not for a job set aside before it ran).

    And :meth:`renew` with every claim check while jobs run (keep their leases).

    Steps 1-6 are called only for the tasks :meth:`concerns` names (asked once per task).
    """

    #: when set, the hook concerns only jobs whose id starts with it (a workflow's steps):
    #: any other job's run skips its steps for one string comparison
    id_prefix: str | None = None

    def concerns(self, job: JobDef) -> bool:
        """Whether this hook has anything to do with ``job``'s runs (every job unless a
        feature says otherwise): a hook's per-job steps cost nothing for the others."""
        return True

    async def admit(
        self, job: JobDef, job_id: str, record: Mapping[str, Any] = NO_RECORD
    ) -> int | None:
        """``None`` to let the job start now; else the time (epoch ms) to look again: the job
        is deferred, its try given back (a concurrency slot or rate allowance not free).
        ``record``: the job's record (arq's map, with any field a feature wrote at enqueue)."""
        return None

    def context(self, job_id: str) -> Mapping[str, Any]:
        """Extra values for the job's ``ctx`` (e.g. ``tick_ms``); empty when not concerned."""
        return {}

    async def release(self, job: JobDef, job_id: str) -> None:
        """The run :meth:`admit` let start is over: give back what it took."""

    async def ended(self, job_id: str, args: Sequence[Any], outcome: Outcome) -> None:
        """Called once a run ended (never raises into the consumer: errors are logged)."""

    async def started(self, run: JobRun) -> None:
        """The function is about to run (after admission and ``ctx``)."""

    async def finished(self, run: JobRun, outcome: JobOutcome) -> None:
        """The run :meth:`started` announced ended, its end handed to the completer."""

    async def settle(self, run: JobRun, outcome: JobOutcome) -> None:
        """The run ended; its end waits until every hook settled it. Raising makes the run a
        retry (it runs again): the write must be safe to repeat."""

    async def renew(self) -> None:
        """With each claim check while jobs run (errors count as a failed check)."""


def overriding(hooks: Sequence[JobHook], *steps: str) -> list[JobHook]:
    """The hooks whose class overrides one of ``steps`` (the consumer calls only those)."""
    return [h for h in hooks if any(getattr(type(h), s) is not getattr(JobHook, s) for s in steps)]


@dataclass(frozen=True)
class HookPlan:
    """The hooks one task's runs call at each step: those that concern the task and override
    the step, in hook order (empty for most tasks: no hook work at all)."""

    admit: tuple[JobHook, ...] = ()
    context: tuple[JobHook, ...] = ()
    runs: tuple[JobHook, ...] = ()  # started and finished
    release: tuple[JobHook, ...] = ()
    ends: tuple[JobHook, ...] = ()  # ended
    settles: tuple[JobHook, ...] = ()  # settle
    #: the job id prefixes of the hooks left out here (:attr:`JobHook.id_prefix`), and the
    #: plan with them, for the jobs whose id starts with one (:meth:`for_id`)
    prefixes: tuple[str, ...] = ()
    full: HookPlan | None = None

    @classmethod
    def of(cls, hooks: Sequence[JobHook], job: JobDef) -> HookPlan:
        mine = [h for h in hooks if h.concerns(job)]
        prefixes = tuple(h.id_prefix for h in mine if h.id_prefix is not None)
        if not prefixes:
            return cls._steps(mine)
        plain = [h for h in mine if h.id_prefix is None]
        return dataclasses.replace(cls._steps(plain), prefixes=prefixes, full=cls._steps(mine))

    @classmethod
    def _steps(cls, mine: Sequence[JobHook]) -> HookPlan:
        return cls(
            admit=tuple(overriding(mine, "admit")),
            context=tuple(overriding(mine, "context")),
            runs=tuple(overriding(mine, "started", "finished")),
            release=tuple(overriding(mine, "release")),
            ends=tuple(overriding(mine, "ended")),
            settles=tuple(overriding(mine, "settle")),
        )

    @property
    def hooked(self) -> bool:
        """Whether a run is announced to hooks (:meth:`started`, :meth:`settle`)."""
        return bool(self.runs or self.settles)

    def for_id(self, job_id: str) -> HookPlan:
        """The plan of the job ``job_id``: with the hooks of its id's prefix, if any (one
        string comparison for the others)."""
        if self.full is not None and job_id.startswith(self.prefixes):
            return self.full
        return self

    async def admitted(
        self, job: JobDef, job_id: str, record: Mapping[str, Any] = NO_RECORD
    ) -> int | None:
        """``None`` when every hook lets the job start; else the time the first refusing hook
        named (epoch ms), the hooks that had let it start having given back what they took."""
        for i, hook in enumerate(self.admit):
            due_ms = await hook.admit(job, job_id, record)
            if due_ms is not None:
                for earlier in self.admit[:i]:
                    await earlier.release(job, job_id)
                return due_ms
        return None

    async def started(self, run: JobRun) -> bool:
        """Tell the hooks that have a ``started`` step that the run begins (in order);
        ``False`` when one of them raised :class:`SkipRun` (the run must not start)."""
        for hook in self.runs:
            try:
                await hook.started(run)
            except SkipRun:
                return False
            except Exception:
                log.exception("job hook failed", job_id=run.job_id, step="started")
        return True

    async def settle(
        self, run: JobRun, outcome: Outcome, error: BaseException | None, result: Any,
        timed_out: bool, duration_s: float,
    ) -> bool:  # fmt: skip
        """Have every hook with a ``settle`` step settle the run's end (in order); ``False``
        when one failed (the run must run again)."""
        ended = _outcome(run, outcome, error, result, timed_out, duration_s)
        for hook in self.settles:
            try:
                await hook.settle(run, ended)
            except Exception:
                log.exception("job hook failed", job_id=run.job_id, step="settle")
                return False
        return True

    async def ended(self, job_id: str, args: Sequence[Any], outcome: Outcome) -> None:
        """Tell the hooks that have an ``ended`` step how the run ended (in order)."""
        for hook in self.ends:
            try:
                await hook.ended(job_id, args, outcome)
            except Exception as exc:
                log.warning("job hook failed", job_id=job_id, error=str(exc))

    async def finished(
        self,
        run: JobRun,
        outcome: Outcome,
        error: BaseException | None,
        result: Any,
        timed_out: bool,
        duration_s: float,
    ) -> None:
        """Tell the hooks how the run ended (in reverse order), once its end is handed to the
        completer: a hook can neither change nor delay it."""
        ended = _outcome(run, outcome, error, result, timed_out, duration_s)
        for hook in reversed(self.runs):
            try:
                await hook.finished(run, ended)
            except Exception:
                log.exception("job hook failed", job_id=run.job_id, step="finished")


def _outcome(
    run: JobRun, outcome: Outcome, error: BaseException | None, result: Any, timed_out: bool,
    duration_s: float,
) -> JobOutcome:  # fmt: skip
    job = run.job
    dead = outcome == "failure" and bool(job.retry_on) and isinstance(error, job.retry_on)
    status = status_of(outcome, error, timed_out=timed_out, dead=dead)
    return JobOutcome(status, job.name, run.job_id, run.job_try, duration_s, error, result)
