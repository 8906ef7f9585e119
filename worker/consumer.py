"""The consumer: runs the app's jobs from the queue, in every role — arq's records, our loop.

Job records, keys and results are arq's own (a plain arq client enqueues work, ``arq.jobs.Job``
reads statuses and results, and arq's ``Worker`` can consume the same queue during a rollout),
but the loop is the framework's, for what arq's ``Worker`` cannot give:

- **batched**: one script claims a batch of due jobs (in-progress markers, try counters,
  payloads, the holds set for orphan recovery) and one finishes every run that ended since the
  last round (results, deletes, queue removal): a few Redis commands per job, not seventeen;
- **claims are fenced**: each claim carries a token ``<instance id>/<n>``; a run finishes only
  while its marker still holds that token, so a consumer that was paused past the orphan
  bound, and whose job another consumer took over meanwhile, writes nothing. A paused or cut-off
  consumer also *knows* it may have lost its claims (:class:`ClaimGuard`): every job holds at its
  next step until the claims are confirmed, and the ones taken over are cancelled;
- **a blocked event loop** (a task calling ``time.sleep``) does not leave finished runs
  unrecorded: the loop watchdog's thread sends their ``FINISH`` meanwhile
  (:meth:`Consumer.loop_blocked`), before the orphan reaper can hand them to another consumer;
- **draining** stops claiming first, then waits for every job that started (up to the shutdown
  timeout) — no job that started is cut short by a graceful stop within that time;
- **hostile records** (a payload of the wrong shape, too large, not a string; a try counter
  that is not a number) are dead-lettered one by one; the loop never crashes on them;
- **durable under a failover** (with a WAIT policy, ``WORKER_REDIS_WAIT_REPLICAS``): a batch
  runs only once the replicas confirmed its claim (one ``WAIT`` per batch, in the claim's round
  trip; an unconfirmed batch waits unstarted until a later check confirms it with its claim
  tokens unchanged), so a job that runs exists, claimed by us, on whichever replica is promoted;
  a batch of ends the replicas did not confirm (or whose round trip failed) is sent again, with
  the same claim tokens, until it is confirmed: a new primary that lost it still holds our
  claims, finishes the jobs, and never hands them to another consumer;
- **a claim whose reply was lost** (a dropped connection; a primary killed during the ``WAIT``
  after replicating the claim) does not strand its jobs until their markers expire: before
  claiming again the consumer gives back every job held in its name that it does not know
  (``Store.release_own``).

Semantics follow arq: retries on ``Retry``/cancellation up to ``max_tries``, job timeouts,
deferred jobs, ``keep_result``, aborts through the app's ``<prefix>abort`` (``Client.abort``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import itertools
import random
import threading
import time
from collections.abc import Awaitable, Coroutine, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from arq.jobs import serialize_result
from arq.worker import Retry, RetryJob
from redis.exceptions import RedisError

from worker.clock import Clock, ms
from worker.component import Component
from worker.context import Context, JobContext
from worker.dead import DeadLetters
from worker.jobs import JobDef, JobHook, Outcome
from worker.logs import capped
from worker.metrics import Metrics
from worker.serializer import Deserialize, Serialize
from worker.storage import FOREIGN, Claimed, Finish, Store
from worker.storage.keys import DEFAULT_QUEUE

log = structlog.get_logger("worker.consumer")

SUMMARY_EVERY_S = 60.0
HEALTH_EVERY_S = 10.0
#: arq's retry-counter TTL (88,400 s).
RETRY_TTL_MS = 88_400_000
#: Largest enqueue time accepted in a payload (year 2286): later values break datetimes.
MAX_ENQUEUE_MS = 10**13
#: Most jobs one claim round takes (the scripts unpack one argument per job).
MAX_CLAIM = 1000
#: After the drain, how long the consumer keeps trying to record (and confirm) the last ends.
FINAL_FLUSH_S = 3.0


class BadJob(Exception):
    """A job that cannot run: set aside with this reason, never retried."""

    def __init__(self, reason: str, kind: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


@dataclass(frozen=True)
class ConsumerConfig:
    """The consumer's slice of the settings."""

    concurrency: int = 100
    poll_delay_s: float = 0.05
    idle_poll_max_s: float = 0.5
    job_timeout_s: float = 300.0
    max_tries: int = 5
    keep_result_s: float = 3600.0
    shutdown_timeout_s: float = 30.0
    holds_ttl_s: float = 360.0
    max_payload_bytes: int = 4 * 1024 * 1024
    #: With no confirmed Redis round trip for this long, claims may have been reaped.
    doubt_s: float = 5.0
    #: Queues to take jobs from, highest priority first.
    queues: tuple[str, ...] = (DEFAULT_QUEUE,)
    #: Lease of a concurrency slot, renewed while its job runs (a dead holder's slot comes
    #: back after at most this long).
    slot_lease_s: float = 10.0
    #: Burst mode (``python -m worker run --burst``, arq's ``burst``): once nothing runs and no
    #: job is due in ``queues``, stop claiming, drain, and set :attr:`Consumer.emptied`.
    burst: bool = False


def validate(record: Any) -> tuple[str, tuple[Any, ...], dict[str, Any], int | None, int]:
    """``(function, args, kwargs, try, enqueue ms)`` of an arq job record, or :class:`BadJob`
    naming the field that is wrong. Checked before anything else touches it."""
    if not isinstance(record, dict):
        raise BadJob(f"malformed payload: a {type(record).__name__}, not a map", "malformed")
    fn, args, kwargs = record.get("f"), record.get("a", ()), record.get("k", {})
    job_try, enqueued = record.get("t"), record.get("et")
    if not isinstance(fn, str) or not fn or len(fn) > 256:
        raise BadJob(f"malformed payload: field 'f' is {_shape(fn)}", "malformed")
    if not isinstance(args, list | tuple):
        raise BadJob(f"malformed payload: field 'a' is {_shape(args)}", "malformed")
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise BadJob(f"malformed payload: field 'k' is {_shape(kwargs)}", "malformed")
    if job_try is not None and (
        isinstance(job_try, bool) or not isinstance(job_try, int) or not 0 <= job_try < 10**6
    ):
        raise BadJob(f"malformed payload: field 't' is {_shape(job_try)}", "malformed")
    if (
        isinstance(enqueued, bool)
        or not isinstance(enqueued, int)
        or not 0 <= enqueued <= MAX_ENQUEUE_MS
    ):
        raise BadJob(f"malformed payload: field 'et' is {_shape(enqueued)}", "malformed")
    return fn, tuple(args), kwargs, job_try, enqueued


def _shape(value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{type(value).__name__} {value!r}"[:60]
    return f"a {type(value).__name__}"


class ClaimGuard:
    """Holds job steps while this process may have lost its claims.

    The consumer confirms its claims with every successful Redis round trip (claim, finish,
    or the periodic check while jobs run). When none succeeded for ``doubt_s`` — the process
    was frozen (SIGSTOP, a stalled VM, a blocked loop) or cut off from Redis — the orphan
    reaper may have handed its jobs to another consumer. Then every job, at its next step,
    waits until the consumer has checked its claims; a job whose claim is gone is cancelled
    before it runs another line.
    """

    def __init__(self, clock: Clock, doubt_s: float) -> None:
        self.clock = clock
        self.doubt_s = doubt_s
        self.alive_at = clock.monotonic()
        self.lost: set[str] = set()
        self.wanted = asyncio.Event()  # a job is waiting for a check
        self._waiters: list[asyncio.Future[None]] = []

    def confirmed(self, since: float) -> None:
        """A round trip sent at ``since`` (monotonic) succeeded."""
        self.alive_at = max(self.alive_at, since)

    def in_doubt(self) -> bool:
        return self.clock.monotonic() - self.alive_at > self.doubt_s

    def wait(self) -> asyncio.Future[None]:
        """A future resolved at the next completed claim check."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self.wanted.set()
        return fut

    def checked(self, since: float, lost: set[str]) -> None:
        """The claims were checked (the check was sent at ``since``); ``lost`` are gone."""
        self.lost |= lost
        self.confirmed(since)
        waiters, self._waiters = self._waiters, []
        self.wanted.clear()
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def guard(self, aw: Awaitable[Any], job_id: str) -> Awaitable[Any]:
        coro = aw if isinstance(aw, Coroutine) else _await(aw)
        return _Guarded(coro, job_id, self)


async def _await(aw: Awaitable[Any]) -> Any:
    return await aw


class _Guarded:
    """Runs a coroutine step by step; before each step taken in doubt, waits for the claim
    check and throws :class:`asyncio.CancelledError` into it when its claim is gone."""

    __slots__ = ("_coro", "_guard", "_job_id")

    def __init__(self, coro: Coroutine[Any, Any, Any], job_id: str, guard: ClaimGuard) -> None:
        self._coro = coro
        self._job_id = job_id
        self._guard = guard

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, guard = self._coro, self._guard
        value: Any = None
        error: BaseException | None = None
        while True:
            if guard.in_doubt() or self._job_id in guard.lost:
                try:
                    while guard.in_doubt() and self._job_id not in guard.lost:
                        yield from guard.wait().__await__()
                except BaseException as exc:  # cancelled while waiting: pass it on
                    error = exc
                if self._job_id in guard.lost and error is None:
                    error = asyncio.CancelledError("claim lost to another consumer")
            try:
                step = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as done:
                return done.value
            value, error = None, None
            try:
                value = yield step
            except BaseException as exc:
                error = exc


@dataclass
class _Run:
    job_id: str
    token: str
    task: asyncio.Task[None] | None = None
    aborted: bool = False
    started: float = field(default=0.0)
    ended: bool = False  # its end is recorded (or queued to be): no claim to check any more


class Consumer(Component):
    """Claims, runs and finishes jobs until stopped, then drains (see module docstring)."""

    def __init__(
        self,
        jobs: Sequence[JobDef],
        hooks: Sequence[JobHook],
        context: Context,
        store: Store,
        serializer: tuple[Serialize, Deserialize],
        clock: Clock,
        *,
        instance_id: str,
        config: ConsumerConfig,
        dead: DeadLetters,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__("consumer", clock, sla_s=60.0)
        self.jobs = {j.name: j for j in jobs}
        self.hooks = list(hooks)
        self.context = context
        self.store = store
        self.slots: dict[str, str] = {}  # job id -> task, concurrency slots held
        self.instance_id = instance_id
        self.serialize, self.deserialize = serializer
        self.config = config
        self.dead = dead
        self.metrics = metrics
        timeouts = [j.timeout_s or config.job_timeout_s for j in jobs] or [config.job_timeout_s]
        self.in_progress_ttl_ms = ms(max(timeouts) + 10)
        self.guard = ClaimGuard(clock, config.doubt_s)
        self.running: dict[str, _Run] = {}
        self._ended: list[Finish] = []
        #: guards ``_ended`` and ``_resend``: the loop watchdog's thread records the ends too
        #: while the event loop is blocked (:meth:`loop_blocked`)
        self._ends_lock = threading.Lock()
        #: claimed, but the replicas have not confirmed the claim yet: not started (one batch)
        self._unconfirmed: list[Claimed] = []
        self._unconfirmed_token = ""
        #: ends sent without a confirmation (or whose round trip failed): sent again until one is
        self._resend: list[Finish] = []
        #: a claim round trip failed: it may have claimed jobs no run of ours knows about
        self._claims_in_doubt = False
        self._wake = asyncio.Event()
        self._seq = itertools.count(1)
        self._woken = True  # claim on the first round
        self._next_due: int | None = None  # a deferred job announced for this time (ms)
        self.totals = {"complete": 0, "failed": 0, "retried": 0, "lost": 0}
        self._summary_at = clock.monotonic()
        self._summary_totals = dict(self.totals)
        self._health_at = -HEALTH_EVERY_S
        #: Burst mode: set once the queues had nothing due and nothing ran (then it drains).
        self.emptied = asyncio.Event()

    @property
    def in_flight(self) -> int:
        return len(self.running)

    # -- the loop -----------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        if not self.jobs:
            raise RuntimeError("the app registers no tasks or periodic jobs")
        done = asyncio.Event()  # the claim checker outlives `stop`: it serves the drain too
        checker = asyncio.create_task(self._check_claims(done), name="consumer:claims")
        listener = asyncio.create_task(self._listen(stop), name="consumer:wake")
        backoff = 0.0
        try:
            while not stop.is_set():
                self._wake.clear()
                try:
                    claimed = await self._claim_round() if await self._should_claim() else 0
                    if self._ended or self._resend:
                        await self._flush()
                    now = self.clock.monotonic()
                    self.health.ok(now)
                    await self._housekeeping(now)
                    backoff = 0.0
                    if self.config.burst and not claimed and await self._nothing_left():
                        self.emptied.set()
                        break
                except (RedisError, OSError, TimeoutError) as exc:
                    # Redis away: running jobs go on (their ends are written later); no new
                    # work; liveness fails once this lasts longer than the SLA.
                    backoff = min(max(backoff * 2, 0.1), 2.0)
                    log.warning(
                        "consumer cannot reach Redis; retrying",
                        error=f"{type(exc).__name__}: {exc}",
                        retry_in_s=backoff,
                    )
                    await self.clock.wait(stop, backoff)
                    continue
                await self.clock.wait((stop, self._wake), self._next_delay(claimed))
        finally:
            listener.cancel()
            try:
                await self._drain()
            finally:
                done.set()
                checker.cancel()
                await asyncio.gather(checker, listener, return_exceptions=True)
                with contextlib.suppress(Exception):
                    await self.store.clear_health(self.instance_id)

    async def _nothing_left(self) -> bool:
        """Burst mode: nothing runs, no end waits to be written, no job is due."""
        if self.running or self._ended:
            return False
        due = await self.store.queue_head(self.config.queues)
        return due is None or due > ms(self.clock.time())

    def _next_delay(self, claimed: int) -> float:
        """``poll_delay_s`` while busy; idle, until the next announced due time, at most
        ``idle_poll_max_s`` (the fallback for jobs a plain arq client enqueued unannounced)."""
        c = self.config
        if claimed or self.running or self._unconfirmed or self._resend:
            return c.poll_delay_s
        delay = max(c.idle_poll_max_s, c.poll_delay_s)
        if self._next_due is not None:
            delay = min(delay, max(0.0, (self._next_due - ms(self.clock.time())) / 1000))
        return delay

    async def _should_claim(self) -> bool:
        """Claim when busy, woken by an enqueue, or an announced due time came; an idle
        consumer otherwise looks at the head of the queue only (one command)."""
        now = ms(self.clock.time())
        if (
            self.running
            or self._woken
            or self._unconfirmed
            or self._claims_in_doubt
            or self.config.burst
        ):
            self._woken = False
            return True
        if self._next_due is not None and self._next_due <= now:
            self._next_due = None
            return True
        due = await self.store.queue_head(self.config.queues)
        if due is None:
            return False
        if due <= now:
            return True
        self._next_due = due if self._next_due is None else min(self._next_due, due)
        return False

    async def _listen(self, stop: asyncio.Event) -> None:
        """Pub/sub on the wake channel: every enqueue through the framework announces its due
        time, so an idle consumer claims at once (or sets a timer for a deferred job). A lost
        message costs at most the fallback poll."""
        redis = self.store.redis
        while not stop.is_set():
            pubsub = redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.store.keys.wake)
                while not stop.is_set():
                    msg = await pubsub.get_message(timeout=1.0)
                    if msg is not None and msg.get("type") == "message":
                        self._heard(int(msg["data"]))
            except asyncio.CancelledError:
                raise
            except Exception:
                await self.clock.wait(stop, 1.0)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.shield(pubsub.aclose())  # type: ignore[no-untyped-call]

    def _heard(self, due_ms: int) -> None:
        if due_ms <= ms(self.clock.time()) + 1:
            self._woken = True
        elif self._next_due is None or due_ms < self._next_due:
            self._next_due = due_ms
        self._wake.set()

    async def _claim_round(self) -> int:
        if self._claims_in_doubt:
            await self._release_unknown()
        if self._unconfirmed:
            return await self._confirm_claims()
        free = min(self.config.concurrency - len(self.running), MAX_CLAIM)
        if free <= 0:
            return 0
        token = f"{self.instance_id}/{next(self._seq)}"
        sent = self.clock.monotonic()
        try:
            claims = await self.store.claim(
                self.instance_id,
                token,
                now_ms=ms(self.clock.time()),
                limit=free,
                in_progress_ttl_ms=self.in_progress_ttl_ms,
                holds_ttl_ms=ms(self.config.holds_ttl_s),
                max_payload=self.config.max_payload_bytes,
                retry_ttl_ms=RETRY_TTL_MS,
                queues=self.config.queues,
            )
        except BaseException:
            # The script may have run and its reply been lost (a dropped connection, a primary
            # that failed over after replicating it): jobs claimed in our name that no run of
            # ours will finish. Give them back before claiming again.
            self._claims_in_doubt = True
            raise
        self.guard.confirmed(sent)
        if claims.stale:
            log.warning(
                "stale in-progress markers (without a TTL: taken over; outliving any job: cut "
                "to the marker TTL)",
                markers=claims.stale,
                marker_ttl_s=self.in_progress_ttl_ms / 1000,
            )
        if claims.jobs and not claims.replicated:
            self._unconfirmed, self._unconfirmed_token = claims.jobs, token
            log.warning(
                "claimed jobs not confirmed by the replicas (WORKER_REDIS_WAIT_REPLICAS); "
                "holding them unstarted until they are",
                jobs=len(claims.jobs),
            )
            return 0
        if (
            claims.jobs
            and len(claims.jobs) == free
            and self.in_flight + free < self.config.concurrency
        ):
            self._woken = True  # a full batch and room left: there may be more due right away
            self._wake.set()
        self._start(claims.jobs, token)
        if claims.aborts_pending:
            await self._abort_requested()
        return len(claims.jobs)

    async def _release_unknown(self) -> None:
        """Make the jobs held in our name that we do not know about due again (a claim whose
        reply was lost); the runs we know (running, held, ending) keep their claims."""
        known = {*self.running, *(c.job_id for c in self._unconfirmed)}
        known |= {f.job_id for f in (*self._ended, *self._resend)}
        released = await self.store.release_own(
            self.instance_id, sorted(known), ms(self.clock.time()), self.config.queues
        )
        self._claims_in_doubt = False
        if released:
            log.warning(
                "gave back jobs claimed in a round trip whose reply was lost; they run again",
                jobs=released,
            )

    def _start(self, jobs: Sequence[Claimed], token: str) -> None:
        for job in jobs:
            run = self.running[job.job_id] = _Run(job.job_id, token, started=self.clock.monotonic())
            run.ended = job.size == FOREIGN  # never claimed: no claim to check (another slot)
            run.task = asyncio.create_task(self._run(job, run), name=f"job:{job.job_id}")

    async def _confirm_claims(self) -> int:
        """Check a batch whose claim the replicas did not confirm: once they have every write
        so far, start the jobs still claimed with its token (a failover may have lost some:
        those were never ours on the new primary and are not run)."""
        held, token = self._unconfirmed, self._unconfirmed_token
        sent = self.clock.monotonic()
        tokens, replicated = await self.store.confirm_claims([c.job_id for c in held])
        self.guard.confirmed(sent)
        if not replicated:
            return 0
        self._unconfirmed = []
        kept = [c for c, now in zip(held, tokens, strict=True) if now == token]
        if len(kept) < len(held):
            log.warning(
                "claims lost before the replicas confirmed them (a failover?); those jobs were "
                "not run and stay queued",
                lost=len(held) - len(kept),
            )
        log.info("held claims confirmed by the replicas; starting", jobs=len(kept))
        self._start(kept, token)
        return len(kept)

    async def _flush(self) -> None:
        if self._resend:
            resend = list(self._resend)
            sent = self.clock.monotonic()
            again = await self.store.finish(
                self.instance_id, resend, now_ms=ms(self.clock.time()), resend=True
            )
            self.guard.confirmed(sent)
            if not again.replicated:
                return  # the replicas still lag: new ends wait behind these
            log.info("job ends confirmed by the replicas", runs=len(resend))
            with self._ends_lock:  # others only append meanwhile
                del self._resend[: len(resend)]
        with self._ends_lock:
            ended, self._ended = self._ended, []
        if not ended:
            return
        sent = self.clock.monotonic()
        try:
            out = await self.store.finish(self.instance_id, ended, now_ms=ms(self.clock.time()))
        except Exception:
            # It may or may not have been applied (the reply was lost): send the same ends again
            # (the claims still hold) until a round trip is confirmed.
            with self._ends_lock:
                self._resend += ended
            raise
        self.guard.confirmed(sent)
        if not out.replicated:
            with self._ends_lock:
                self._resend += ended
            log.warning(
                "job ends not confirmed by the replicas (WORKER_REDIS_WAIT_REPLICAS); sending "
                "them again until they are",
                runs=len(ended),
            )
        if out.refused:
            self.totals["lost"] += out.refused
            if self.metrics is not None:
                self.metrics.claims_lost.inc(out.refused)
            log.warning(
                "job runs ended after their claims were taken over; nothing written",
                refused=out.refused,
            )

    async def loop_blocked(self, store: Store, lag_s: float) -> None:
        """Called by the loop watchdog, in its thread (``store`` on its own connection), while
        the event loop is blocked: record the ends of the runs that finished before the block.
        Left for the next round, they would wait for the loop while the leader's orphan reaper,
        seeing no heartbeat, handed those jobs to another consumer: a finished run would run
        again. The claims still hold (the block is shorter than the orphan bound yet), so the
        ``FINISH`` is the one the loop would have sent; one whose reply is lost is sent again."""
        with self._ends_lock:
            ended, self._ended = self._ended, []
        if not ended:
            return
        try:
            out = await store.finish(self.instance_id, ended, now_ms=ms(self.clock.time()))
        except BaseException:
            with self._ends_lock:
                self._resend += ended
            raise
        if not out.replicated:
            with self._ends_lock:
                self._resend += ended
        log.warning(
            "event loop blocked; recorded the ends of finished runs from the watchdog",
            runs=len(ended),
            refused=out.refused,
            lag_s=round(lag_s, 3),
        )

    async def _check_claims(self, stop: asyncio.Event) -> None:
        """While jobs run (or one waits in doubt): confirm the claims, cancel lost ones."""
        interval = max(0.05, self.config.doubt_s / 4)
        while not stop.is_set():
            await self.clock.wait((stop, self.guard.wanted), interval)
            if stop.is_set() or not (self.running or self.guard.wanted.is_set()):
                continue
            ids = [job_id for job_id, run in self.running.items() if not run.ended]
            sent = self.clock.monotonic()
            try:
                tokens = await self.store.claim_tokens(ids)
                if self.slots:  # keep the concurrency slots of running jobs
                    by_task: dict[str, list[str]] = {}
                    for job_id, task in self.slots.items():
                        by_task.setdefault(task, []).append(job_id)
                    until = ms(self.clock.time() + self.config.slot_lease_s)
                    await self.store.renew_slots(by_task, until)
            except Exception as exc:
                log.warning("claim check failed", error=f"{type(exc).__name__}: {exc}")
                await self.clock.wait(stop, interval)
                continue
            lost = {
                job_id
                for job_id, token in zip(ids, tokens, strict=True)
                if job_id in self.running
                and not self.running[job_id].ended  # ended meanwhile: FINISH may have run
                and token != self.running[job_id].token
            }
            self.guard.checked(sent, lost)
            for job_id in lost:
                run = self.running.get(job_id)
                if run is not None and run.task is not None:
                    log.warning(
                        "job claim taken over by another consumer; cancelling", job_id=job_id
                    )
                    run.task.cancel()

    async def _abort_requested(self) -> None:
        mine = [j for j in await self.store.abort_requests() if j in self.running]
        for job_id in mine:
            run = self.running[job_id]
            run.aborted = True
            if run.task is not None:
                run.task.cancel()
        await self.store.aborts_handled(mine)

    async def _drain(self) -> None:
        """Stop claiming (the loop has ended); wait up to the shutdown timeout for every job that
        started, writing their ends as they come; cancel the rest (they run again)."""
        timeout = self.config.shutdown_timeout_s
        log.info("consumer draining", in_flight=self.in_flight, timeout_s=timeout)
        for c in self._unconfirmed:  # never started: give them back, their try with them
            self._end(
                Finish(
                    "defer", c.job_id, self._unconfirmed_token, score_ms=c.score_ms, queue=c.queue
                )
            )
        self._unconfirmed = []
        deadline = self.clock.monotonic() + timeout
        while self.running and self.clock.monotonic() < deadline:
            tasks = [r.task for r in self.running.values() if r.task is not None]
            remaining = deadline - self.clock.monotonic()
            await asyncio.wait(tasks, timeout=max(0.0, min(0.5, remaining)))
            await self._flush_quietly()
        late = [r.task for r in self.running.values() if r.task is not None]
        if late:
            log.warning("shutdown timeout: cancelling jobs; they run again", cancelled=len(late))
            for t in late:
                t.cancel()
            await asyncio.wait(late, timeout=5)
        # Ends not written (or not confirmed) yet: a few more tries, bounded (a Redis that is
        # away, or a failover in progress, must not hold the shutdown up).
        until = self.clock.monotonic() + FINAL_FLUSH_S
        while (self._ended or self._resend) and self.clock.monotonic() < until:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._flush_quietly(), until - self.clock.monotonic())
            if self._ended or self._resend:
                await asyncio.sleep(0.3)
        if self._claims_in_doubt and self.clock.monotonic() < until:
            # a claim whose reply was lost just before the stop: give its jobs back now (a
            # process that deregisters is never reaped; they would wait for their markers)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._release_unknown(), until - self.clock.monotonic())

    async def _flush_quietly(self) -> None:
        if not (self._ended or self._resend):
            return
        try:
            await self._flush()
        except Exception as exc:  # the claims expire and orphan recovery re-queues
            log.error("could not record job ends", error=f"{type(exc).__name__}: {exc}")

    # -- one job ------------------------------------------------------------------------------
    async def _run(self, claimed: Claimed, run: _Run) -> None:
        try:
            await self._run_job(claimed, run)
        except BaseException as exc:  # bookkeeping must never leave a run unaccounted for
            log.error("job bookkeeping failed", job_id=claimed.job_id, error=repr(exc))
            self._end(
                Finish(
                    "retry",
                    claimed.job_id,
                    run.token,
                    score_ms=claimed.score_ms,
                    queue=claimed.queue,
                )
            )
        finally:
            self.running.pop(claimed.job_id, None)
            self._wake.set()

    def _end(self, finish: Finish) -> None:
        run = self.running.get(finish.job_id)
        if run is not None:
            run.ended = True
        with self._ends_lock:
            self._ended.append(finish)

    async def _run_job(self, c: Claimed, run: _Run) -> None:
        job_id = c.job_id
        start_ms = ms(self.clock.time())
        try:
            fn_name, args, kwargs, enqueue_try, enqueued_ms = self._decode(c)
            job = self.jobs.get(fn_name)
            if job is None:
                raise BadJob(f"unknown function {fn_name!r}", "unknown")
        except BadJob as bad:
            await self._give_up(c, run, bad, start_ms)
            return
        job_try = c.try_
        if enqueue_try and enqueue_try > job_try:
            job_try = enqueue_try
            await self.store.raise_try(job_id, job_try, RETRY_TTL_MS)
        max_tries = job.max_tries if job.max_tries is not None else self.config.max_tries
        queue_key = self.store.keys.queue_of(c.queue)
        result_for = _ResultFor(fn_name, args, kwargs, job_try, enqueued_ms, job_id, queue_key)
        if job_try > max_tries:
            reason = f"max {max_tries} retries exceeded"
            await self._give_up(c, run, BadJob(reason, "retries"), start_ms, result_for)
            return
        if (job.max_concurrency or job.rate) and not await self._within_limits(job, c, run):
            return  # deferred: it waits for a slot, its try given back

        extra: dict[str, Any] = {}
        for hook in self.hooks:
            extra.update(hook.context(job_id))
        ctx = JobContext(
            {
                "redis": self.context.redis,
                "worker_instance": self.instance_id,
                "job_id": job_id,
                "job_try": job_try,
                "enqueue_time": dt.datetime.fromtimestamp(enqueued_ms / 1000, dt.UTC),
                "score": c.score_ms,
            },
            self.context,
            **extra,
        )
        ctx.claim = (self.store, run.token)  # for ctx.still_claimed()
        timeout = job.timeout_s or self.config.job_timeout_s
        keep = job.keep_result_s if job.keep_result_s is not None else self.config.keep_result_s
        started = time.perf_counter()
        outcome: Outcome = "success"
        try:
            async with asyncio.timeout(timeout):
                result = await self.guard.guard(job.fn(ctx, *args, **kwargs), job_id)
        except (Retry, RetryJob) as exc:
            outcome = "retry"
            defer_ms = exc.defer_score if isinstance(exc, Retry) else None
            if defer_ms is None and job.retry_delay is not None:
                defer_ms = ms(job.retry_delay(job_try))
            score = ms(self.clock.time()) + defer_ms if defer_ms else c.score_ms
            self._end(Finish("retry", job_id, run.token, score_ms=score, queue=c.queue))
            self.totals["retried"] += 1
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # handled here: the run ends normally
            outcome = self._cancelled(c, run, result_for, start_ms, keep)
        except Exception as exc:
            outcome = await self._failed(c, run, job, exc, result_for, start_ms, keep, max_tries)
        else:
            data = result_for(True, result, start_ms, self.serialize) if keep > 0 else None
            self._end(Finish("done", job_id, run.token, data, ms(keep), queue=c.queue))
            self.totals["complete"] += 1
        finally:
            if self.slots.pop(job_id, None) is not None:
                with contextlib.suppress(Exception):
                    await self.store.release_slot(job.name, job_id)
            if self.metrics is not None:
                self.metrics.jobs.labels(fn_name, outcome).inc()
                self.metrics.job_seconds.labels(fn_name).observe(time.perf_counter() - started)
        for hook in self.hooks:
            try:
                await hook.ended(job_id, args, outcome)
            except Exception as exc:
                log.warning("job hook failed", job_id=job_id, error=str(exc))

    def _cancelled(
        self, c: Claimed, run: _Run, result_for: _ResultFor, start_ms: int, keep: float
    ) -> Outcome:
        """A run cancelled: its claim was taken over, it was aborted, or the shutdown timeout
        cut it (it runs again)."""
        if c.job_id in self.guard.lost:
            self.guard.lost.discard(c.job_id)  # another consumer runs it now: nothing to write
            self.totals["lost"] += 1
            if self.metrics is not None:
                self.metrics.claims_lost.inc()
            return "retry"
        if run.aborted:
            aborted = asyncio.CancelledError("aborted")
            data = result_for(False, aborted, start_ms, self.serialize) if keep > 0 else None
            self._end(Finish("failed", c.job_id, run.token, data, ms(keep), queue=c.queue))
            self.totals["failed"] += 1
            return "failure"
        self._end(Finish("retry", c.job_id, run.token, score_ms=c.score_ms, queue=c.queue))
        self.totals["retried"] += 1
        return "retry"

    async def _failed(
        self,
        c: Claimed,
        run: _Run,
        job: JobDef,
        exc: Exception,
        result_for: _ResultFor,
        start_ms: int,
        keep: float,
        max_tries: int,
    ) -> Outcome:
        """A run that raised: retried when the task retries that exception and tries remain
        (set aside once they are used up), else a failed result (arq semantics). The error
        text is capped in logs (:func:`worker.logs.capped`; the dead letter caps its own)."""
        full = f"{type(exc).__name__}: {exc}"
        error = capped(full)
        if job.retry_on and isinstance(exc, job.retry_on):
            if result_for.job_try < max_tries:
                delay = job.retry_delay(result_for.job_try) if job.retry_delay else 0.0
                score = ms(self.clock.time() + delay)
                self._end(Finish("retry", c.job_id, run.token, score_ms=score, queue=c.queue))
                self.totals["retried"] += 1
                log.info("job failed; retrying", job_id=c.job_id, error=error, retry_in_s=delay)
                return "retry"
            reason = f"{full} (after {result_for.job_try} tries)"
            bad = BadJob(reason, "retries")
            await self._give_up(c, run, bad, start_ms, result_for, count=False)
            return "failure"
        log.info("job failed", job_id=c.job_id, function=job.name, error=error)
        data = result_for(False, exc, start_ms, self.serialize) if keep > 0 else None
        self._end(Finish("failed", c.job_id, run.token, data, ms(keep), queue=c.queue))
        self.totals["failed"] += 1
        return "failure"

    async def _within_limits(self, job: JobDef, c: Claimed, run: _Run) -> bool:
        """Take the task's concurrency slot and rate allowance; when over a limit, defer the
        job (its try given back) and say so."""
        now = ms(self.clock.time())
        wait = 0
        if job.max_concurrency:
            lease = ms(self.config.slot_lease_s)
            wait = await self.store.take_slot(job.name, c.job_id, now, lease, job.max_concurrency)
            if not wait:
                self.slots[c.job_id] = job.name
        if not wait and job.rate:
            wait = await self.store.take_rate(job.name, now, *job.rate)
            if wait and self.slots.pop(c.job_id, None) is not None:
                await self.store.release_slot(job.name, c.job_id)  # not starting after all
        if not wait:
            return True
        wait = min(wait, 1000) + random.randint(0, 50)  # look again soon; spread the herd
        self._end(Finish("defer", c.job_id, run.token, score_ms=now + wait, queue=c.queue))
        return False

    def _decode(self, c: Claimed) -> tuple[str, tuple[Any, ...], dict[str, Any], int | None, int]:
        if c.payload is None:
            if c.size == FOREIGN:
                where = (
                    "the app's hash slot: in Redis Cluster"
                    if self.store.keys.slot_tag
                    else "the Redis user's key patterns: with an ACL user per app"
                )
                raise BadJob(
                    f"job id outside {where} every job id must start with "
                    f"{self.store.keys.slot_tag or self.store.keys.prefix} (enqueue with Client, "
                    "or pass arq's _job_id=client.new_job_id())",
                    "foreign",
                )
            if c.size == 0:
                raise BadJob("job expired", "expired")
            if c.size < 0:
                raise BadJob("malformed payload: the job record is not a string", "malformed")
            raise BadJob(
                f"payload of {c.size} bytes exceeds WORKER_MAX_PAYLOAD_BYTES "
                f"({self.config.max_payload_bytes})",
                "oversized",
            )
        if c.try_ < 0:
            raise BadJob("the job's try counter is not a number", "malformed")
        try:
            record = self.deserialize(c.payload)
        except Exception as exc:
            raise BadJob(f"malformed payload: {type(exc).__name__}", "malformed") from None
        return validate(record)

    async def _give_up(
        self,
        c: Claimed,
        run: _Run,
        bad: BadJob,
        start_ms: int,
        result_for: _ResultFor | None = None,
        *,
        count: bool = True,
    ) -> None:
        """Set the job aside, keep a failed result (as arq does), take it off the queue."""
        try:
            await self.dead.set_aside(
                c.job_id,
                bad.reason,
                bad.kind,
                c.payload,
                max(c.size, 0),
                queue=c.queue,
                task=result_for.function if result_for else None,
                tries=c.try_ if c.try_ >= 0 else None,
            )
        except Exception as exc:
            log.error("dead-lettering failed", job_id=c.job_id, error=str(exc))
        if c.size == FOREIGN:  # CLAIM took it off the queue; its keys are not the app's
            self.totals["failed"] += 1
            return
        keep = self.config.keep_result_s
        data = None
        if keep > 0:
            queue = self.store.keys.queue_of(c.queue)
            rf = result_for or _ResultFor("<unknown>", (), {}, max(c.try_, 0), 0, c.job_id, queue)
            data = rf(False, _JobFailed(capped(bad.reason)), start_ms, self.serialize)
        self._end(Finish("failed", c.job_id, run.token, data, ms(keep), queue=c.queue))
        self.totals["failed"] += 1
        if count and self.metrics is not None:
            self.metrics.jobs.labels(
                result_for.function if result_for else "<unknown>", "failure"
            ).inc()

    # -- housekeeping -------------------------------------------------------------------------
    async def _housekeeping(self, now: float) -> None:
        self.health.extra.update(in_flight=self.in_flight, **self.totals)
        if now - self._summary_at >= SUMMARY_EVERY_S:
            self._summarize(now)
        if now - self._health_at >= HEALTH_EVERY_S:
            self._health_at = now
            t = self.totals
            text = (
                f"{dt.datetime.now(dt.UTC):%b-%d %H:%M:%S} j_complete={t['complete']} "
                f"j_failed={t['failed']} j_retried={t['retried']} j_ongoing={self.in_flight}"
            )
            with contextlib.suppress(Exception):
                await self.store.set_health(self.instance_id, text, ms(HEALTH_EVERY_S + 1))

    def _summarize(self, now: float) -> None:
        """One INFO line per minute with what the consumer did (per-job lines are DEBUG)."""
        delta = {k: v - self._summary_totals[k] for k, v in self.totals.items()}
        if any(delta.values()):
            log.info(
                "consumer summary",
                window_s=round(now - self._summary_at),
                in_flight=self.in_flight,
                **delta,
            )
        self._summary_totals = dict(self.totals)
        self._summary_at = now


class _JobFailed(Exception):
    """Stands in arq's result record for a job that never ran (arq's ``JobExecutionFailed``)."""


@dataclass(frozen=True)
class _ResultFor:
    """Builds arq's result record for one run."""

    function: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    job_try: int
    enqueued_ms: int
    job_id: str
    queue: str

    def __call__(
        self, success: bool, result: Any, start_ms: int, serialize: Serialize
    ) -> bytes | None:
        return serialize_result(
            self.function,
            self.args,
            self.kwargs,
            self.job_try,
            self.enqueued_ms,
            success,
            result,
            start_ms,
            int(time.time() * 1000),
            f"{self.job_id}:{self.function}",
            self.queue,
            job_id=self.job_id,
            serializer=serialize,
        )
