"""The consumer: envelope validation, the claim/finish scripts, the claim guard, and the loop
itself on fakeredis and the real server (arq's records, results readable by arq's ``Job``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pytest

from harness import eventually
from harness.arqfmt import Job, JobStatus, Retry, SerializationError, deserialize_result
from worker.app import App
from worker.client import Client
from worker.consumer.config import ConsumerConfig
from worker.consumer.consumer import Consumer
from worker.consumer.dead import DeadLetters
from worker.consumer.envelope import BadJob, validate
from worker.consumer.guard import ClaimGuard
from worker.consumer.limits import LimitsHook
from worker.context import Context, JobContext
from worker.core.clock import SystemClock
from worker.core.jobdefs import NO_RECORD, JobDef, JobHook, Outcome
from worker.core.metrics import Metrics
from worker.core.serializer import msgpack_dumps, msgpack_loads
from worker.settings import Settings
from worker.storage import keys as K
from worker.storage.jobs import Finish
from worker.storage.store import Store

KEYS = K.Keys("t:")
T = 1_700_000_000_000


# -- validate ---------------------------------------------------------------------------------


def test_validate_accepts_arq_records() -> None:
    rec = {"t": None, "f": "send", "a": [1, "x"], "k": {"flag": True}, "et": T}
    assert validate(rec) == ("send", (1, "x"), {"flag": True}, None, T)
    assert validate({**rec, "t": 3, "a": (1,)})[3] == 3


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("f", {"a": 1}),
        ("f", ["send"]),
        ("f", ""),
        ("f", None),
        ("a", {"x": 1}),
        ("a", "abc"),
        ("k", [1, 2]),
        ("k", {1: 2}),
        ("t", "1"),
        ("t", -1),
        ("t", True),
        ("et", "1700000000000"),
        ("et", 10**18),
        ("et", -5),
        ("et", 1.5),
        ("et", None),
    ],
)
def test_validate_names_the_bad_field(field: str, value: Any) -> None:
    rec = {"t": None, "f": "send", "a": [], "k": {}, "et": T, field: value}
    with pytest.raises(BadJob, match=rf"field '{field}'") as err:
        validate(rec)
    assert err.value.kind == "malformed"


def test_validate_rejects_non_maps() -> None:
    for value in ([1, 2], "x", 7, None):
        with pytest.raises(BadJob, match="not a map"):
            validate(value)


# -- the claim and finish scripts -------------------------------------------------------------


async def claim(
    store: Store,
    token: str,
    limit: int = 10,
    max_payload: int = 1000,
    queues: tuple[str, ...] = ("default",),
) -> Any:
    return await store.claim(
        "me",
        token,
        now_ms=T,
        limit=limit,
        in_progress_ttl_ms=60_000,
        holds_ttl_ms=60_000,
        max_payload=max_payload,
        retry_ttl_ms=60_000,
        queues=queues,
    )


async def test_claim_marks_counts_reads_and_holds(r: Any) -> None:
    store = Store(r, KEYS)
    await r.zadd(KEYS.queue, {"a": T - 10, "b": T - 5, "later": T + 1, "taken": T - 20})
    await r.set(K.ARQ_JOB + "a", b"payload-a")
    await r.set(K.ARQ_JOB + "b", b"x" * 2000)  # larger than max_payload
    await r.set(K.ARQ_IN_PROGRESS + "taken", b"1", px=30_000)  # arq's own Worker runs it
    await r.zadd(KEYS.abort, {"zzz": T})
    got = await claim(store, "me/1")
    assert got.aborts_pending == 1
    by_id = {j.job_id: j for j in got.jobs}
    assert set(by_id) == {"a", "b"}  # not due, not claimed by someone else
    assert (by_id["a"].payload, by_id["a"].size, by_id["a"].try_) == (b"payload-a", 9, 1)
    assert (by_id["b"].payload, by_id["b"].size) == (None, 2000)  # reported, never read
    assert by_id["a"].score_ms == T - 10
    # claimed jobs stay queued, parked until their marker expires; others keep their score
    assert await r.zscore(KEYS.queue, "a") == T + 60_000
    assert await r.zscore(KEYS.queue, "taken") == T - 20
    assert await r.get(K.ARQ_IN_PROGRESS + "a") == b"me/1"
    assert await r.smembers(KEYS.holds("me")) == {b"a", b"b"}
    assert 0 < await r.pttl(K.ARQ_RETRY + "a") <= 60_000
    # claimed jobs are not claimed again, even by the same consumer
    assert (await claim(store, "me/2")).jobs == []


async def test_claim_reads_past_jobs_held_by_others_and_reaps_stale_markers(r: Any) -> None:
    """Jobs held by someone else never use up the limit; a marker without a TTL (nobody writes
    one) is taken over, one that outlives any job is cut to the marker TTL; arq's Worker's
    markers and the scores of the jobs they hold are left alone."""
    store = Store(r, KEYS)
    held = [f"held{n}" for n in range(4)]
    await r.zadd(KEYS.queue, {jid: T - 100 + n for n, jid in enumerate(held)})
    await r.zadd(KEYS.queue, {f"free{n}": T - 50 + n for n in range(3)})
    await r.set(K.ARQ_IN_PROGRESS + "held0", b"1")  # stray: no TTL
    await r.set(K.ARQ_IN_PROGRESS + "held1", b"1", px=10**9)  # stray: outlives any job
    for jid in held[2:]:
        await r.set(K.ARQ_IN_PROGRESS + jid, b"1", px=30_000)  # arq's own Worker runs these
    got = await claim(store, "me/1", limit=3)
    assert [j.job_id for j in got.jobs] == ["held0", "free0", "free1"]
    assert got.stale == 2
    assert await r.get(K.ARQ_IN_PROGRESS + "held0") == b"me/1"
    assert 0 < await r.pttl(K.ARQ_IN_PROGRESS + "held1") <= 60_000
    assert await r.get(K.ARQ_IN_PROGRESS + "held1") == b"1"
    assert 0 < await r.pttl(K.ARQ_IN_PROGRESS + "held2") <= 30_000
    assert await r.zscore(KEYS.queue, "held2") == T - 98  # not parked: not ours
    again = await claim(store, "me/2", limit=3)
    assert [j.job_id for j in again.jobs] == ["free2"] and again.stale == 0


async def test_claim_reports_bad_records_without_failing_the_batch(r: Any) -> None:
    store = Store(r, KEYS)
    await r.zadd(KEYS.queue, {"missing": T, "hash": T, "badtry": T, "good": T})
    await r.hset(K.ARQ_JOB + "hash", "f", "x")  # not a string
    await r.set(K.ARQ_JOB + "badtry", b"p")
    await r.hset(K.ARQ_RETRY + "badtry", "n", 1)  # INCR fails on a hash
    await r.set(K.ARQ_JOB + "good", b"p")
    got = {j.job_id: j for j in (await claim(store, "me/1")).jobs}
    assert (got["missing"].payload, got["missing"].size) == (None, 0)
    assert (got["hash"].payload, got["hash"].size) == (None, -1)
    assert got["badtry"].try_ == -1 and got["badtry"].payload == b"p"
    assert got["good"].try_ == 1


async def test_finish_writes_only_while_the_claim_holds(r: Any) -> None:
    store = Store(r, KEYS)
    for jid in ("done", "stolen", "again"):
        await r.zadd(KEYS.queue, {jid: T})
        await r.set(K.ARQ_JOB + jid, b"p")
    await r.zadd(KEYS.abort, {"done": T})
    await claim(store, "me/1")
    await r.set(K.ARQ_IN_PROGRESS + "stolen", b"other/9")  # reaped and claimed elsewhere
    out = await store.finish(
        "me",
        [
            Finish("done", "done", "me/1", b"result", 5000),
            Finish("done", "stolen", "me/1", b"mine", 5000),
            Finish("retry", "again", "me/1", score_ms=T + 3000),
        ],
        now_ms=T,
    )
    assert (out.done, out.retried, out.refused) == (1, 1, 1)
    assert await r.get(K.ARQ_RESULT + "done") == b"result"
    assert await r.exists(K.ARQ_JOB + "done", K.ARQ_IN_PROGRESS + "done", K.ARQ_RETRY + "done") == 0
    assert await r.zscore(KEYS.queue, "done") is None
    assert await r.zscore(KEYS.abort, "done") is None
    # the stolen job: untouched, still the other consumer's
    assert await r.get(K.ARQ_IN_PROGRESS + "stolen") == b"other/9"
    assert await r.exists(K.ARQ_RESULT + "stolen") == 0
    assert await r.get(K.ARQ_JOB + "stolen") == b"p"
    # the retried job: marker gone, rescheduled, payload kept
    assert await r.exists(K.ARQ_IN_PROGRESS + "again") == 0
    assert await r.zscore(KEYS.queue, "again") == T + 3000
    assert await r.smembers(KEYS.holds("me")) == set()


async def test_finish_counts_finished_runs_per_queue_and_minute(r: Any) -> None:
    store = Store(r, KEYS)
    jobs = {"a1": "default", "a2": "default", "a3": "default", "b1": "mail", "r1": "default"}
    for jid, queue in jobs.items():
        await r.zadd(KEYS.queue_of(queue), {jid: T})
        await r.set(K.ARQ_JOB + jid, b"p")
    await claim(store, "me/1", queues=("default", "mail"))
    runs = [
        Finish("done", "a1", "me/1"),
        Finish("failed", "a2", "me/1"),
        Finish("done", "b1", "me/1", queue="mail"),
        Finish("retry", "r1", "me/1", score_ms=T),  # runs again: not counted
    ]
    out = await store.finish("me", runs[:2], now_ms=T)
    assert (out.done, out.retried) == (2, 0)
    await store.finish("me", runs[2:], now_ms=T + 60_000)  # the next minute
    # a stolen run is not counted either
    await r.set(K.ARQ_IN_PROGRESS + "a3", b"other/1")
    await store.finish("me", [Finish("done", "a3", "me/1")], now_ms=T)
    hour = T // 3_600_000
    assert await r.hgetall(KEYS.stats("default", hour)) == {
        f"{T // 60_000}:done".encode(): b"1",
        f"{T // 60_000}:failed".encode(): b"1",
    }
    assert 0 < await r.pttl(KEYS.stats("default", hour)) <= K.STATS_TTL_MS
    series = await store.throughput(["default", "mail"], T + 60_000, minutes=3)
    minute = T // 60_000 * 60_000
    assert series["default"] == [(minute - 60_000, 0, 0), (minute, 1, 1), (minute + 60_000, 0, 0)]
    assert series["mail"] == [(minute - 60_000, 0, 0), (minute, 0, 0), (minute + 60_000, 1, 0)]


# -- the claim guard ------------------------------------------------------------------------------


async def test_guard_holds_a_step_in_doubt_and_resumes_when_confirmed() -> None:
    from worker.core.clock import FakeClock

    clock = FakeClock()
    guard = ClaimGuard(clock, doubt_s=1.0)
    gate = asyncio.Event()
    steps: list[str] = []

    async def job() -> str:
        steps.append("start")
        await gate.wait()
        steps.append("after the pause")
        return "ok"

    task = asyncio.ensure_future(guard.guard(job(), "j1"))
    await asyncio.sleep(0)
    assert steps == ["start"]
    clock.advance(5)  # a freeze: no round trip for 5 s
    gate.set()
    for _ in range(10):
        await asyncio.sleep(0)
    assert steps == ["start"] and not task.done()  # held at its next step
    assert guard.wanted.is_set()
    guard.checked(clock.monotonic(), lost=set())
    assert await asyncio.wait_for(task, 1) == "ok"
    assert steps == ["start", "after the pause"]


async def test_guard_cancels_a_job_whose_claim_was_lost() -> None:
    from worker.core.clock import FakeClock

    clock = FakeClock()
    guard = ClaimGuard(clock, doubt_s=1.0)
    gate = asyncio.Event()
    steps: list[str] = []

    async def job() -> None:
        try:
            await gate.wait()
            steps.append("side effect")  # must never run
        except asyncio.CancelledError:
            steps.append("cancelled")
            raise

    task = asyncio.ensure_future(guard.guard(job(), "j1"))
    await asyncio.sleep(0)
    clock.advance(5)
    gate.set()
    await asyncio.sleep(0)
    guard.checked(clock.monotonic(), lost={"j1"})
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 1)
    assert steps == ["cancelled"]


# -- the loop -------------------------------------------------------------------------------------


class Loop:
    """A consumer running as a task on ``r``, with a client to enqueue."""

    def __init__(
        self,
        r: Any,
        app: App,
        instance: str = "i-1",
        hooks: Sequence[JobHook] = (),
        metrics: Metrics | None = None,
        **config: Any,
    ) -> None:
        self.client = Client(r, keys=KEYS, serialize=msgpack_dumps, app=app)
        ctx = Context(
            Settings.model_construct(key_prefix=self.client.keys.prefix),
            r,
            self.client,
            SystemClock(),
            instance,
        )
        store = self.client.store
        config.setdefault("queues", tuple(app.queue_names()))
        limits = LimitsHook(store, SystemClock(), slot_lease_s=config.pop("slot_lease_s", 10.0))
        fast = {"poll_delay_s": 0.01, "idle_poll_max_s": 0.02, "idle_poll_subscribed_s": 0.02}
        cfg = ConsumerConfig(**{**fast, **config})
        dead = DeadLetters(
            store, SystemClock(), instance_id=instance, max_entries=100, keep_bytes=64
        )
        self.consumer = Consumer(
            app.jobs(), [limits, *hooks], ctx, store, (msgpack_dumps, msgpack_loads), SystemClock(),
            instance_id=instance, config=cfg, dead=dead, metrics=metrics,
        )  # fmt: skip
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> Loop:
        self.task = asyncio.create_task(self.consumer.run(self.stop))
        return self

    async def halt(self) -> None:
        self.stop.set()
        if self.task is not None:
            await asyncio.wait_for(self.task, 30)


@pytest.fixture
async def loops() -> AsyncIterator[list[Loop]]:
    started: list[Loop] = []
    yield started
    for lp in started:
        await lp.halt()


async def test_jobs_run_once_with_arq_results_retries_and_dead_letters(
    r: Any, loops: list[Loop]
) -> None:
    app = App("t")
    runs: Counter[str] = Counter()

    @app.task
    async def add(ctx: JobContext, a: int, b: int = 0) -> int:
        runs[ctx.job_id] += 1
        return a + b

    @app.task
    async def boom(ctx: JobContext) -> None:
        runs[ctx.job_id] += 1
        raise ValueError("no")

    @app.task(max_tries=3)
    async def flaky(ctx: JobContext) -> int:
        runs[ctx.job_id] += 1
        if ctx.job_try < 3:
            raise Retry(defer=0.01)
        return ctx.job_try

    @app.task(max_tries=2)
    async def hopeless(ctx: JobContext) -> None:
        runs[ctx.job_id] += 1
        raise Retry(defer=0.01)

    lp = Loop(r, app)
    loops.append(lp.start())
    ids = [await lp.client.enqueue("add", i, b=1) for i in range(50)]
    bad = await lp.client.enqueue("boom")
    retried = await lp.client.enqueue("flaky")
    given_up = await lp.client.enqueue("hopeless")
    # a plain arq-like client (no app) enqueues any name; the consumer dead-letters it
    plain = Client(r, keys=lp.client.keys, serialize=msgpack_dumps, clock=lp.client.clock)
    unknown = await plain.enqueue("no_such_function")

    async def settled() -> bool:
        return await r.zcard(KEYS.queue) == 0 and not lp.consumer.running

    await eventually(settled, what="the queue to drain")
    assert all(runs[j] == 1 for j in ids if j)
    for i, jid in enumerate(ids):
        assert await Job(jid, r, _deserializer=msgpack_loads).result(timeout=1) == i + 1
    job = Job(bad, r, _deserializer=msgpack_loads)  # type: ignore[arg-type]
    assert await job.status() == JobStatus.complete
    # msgpack stores an exception as {error, message}; arq's Job reports it as such
    with pytest.raises(SerializationError, match="ValueError"):
        await job.result(timeout=1)
    assert runs[retried] == 3  # type: ignore[index]
    assert await Job(retried, r, _deserializer=msgpack_loads).result(timeout=1) == 3  # type: ignore[arg-type]
    assert runs[given_up] == 2  # type: ignore[index]
    dead = {j.decode() for j in await r.zrange(KEYS.dead, 0, -1)}
    assert dead == {given_up, unknown}
    assert await r.exists(K.ARQ_JOB + given_up) == 0  # type: ignore[operator]
    assert lp.consumer.totals["complete"] == 51  # 50 adds and flaky
    # per task: each finished run counted once (retries are not), a bad record under no task
    now_ms = int(time.time() * 1000)
    stats = await lp.client.store.task_stats([j.name for j in app.jobs()], now_ms, minutes=5)
    ends = {t: (sum(p[1] for p in s.series), sum(p[2] for p in s.series), s.timed)
            for t, s in stats.items()}  # fmt: skip
    assert ends == {"add": (50, 0, 50), "boom": (0, 1, 1), "flaky": (1, 0, 1),
                    "hopeless": (0, 1, 1)}  # fmt: skip
    assert stats["add"].quantile_ms(0.95) is not None


async def test_drain_waits_for_started_jobs_and_starts_no_new_one(
    r: Any, loops: list[Loop]
) -> None:
    app = App("t")
    started: list[str] = []
    finished: list[str] = []

    @app.task
    async def slow(ctx: JobContext) -> None:
        started.append(ctx.job_id)
        await asyncio.sleep(0.3)
        finished.append(ctx.job_id)

    lp = Loop(r, app, concurrency=5)
    loops.append(lp.start())
    for _ in range(20):
        await lp.client.enqueue("slow")
    await eventually(lambda: len(started) == 5, what="a first batch")
    lp.stop.set()
    await asyncio.wait_for(lp.task, 10)  # type: ignore[arg-type]
    assert sorted(finished) == sorted(started)  # every started job finished
    assert len(started) == 5  # and none started after the stop
    assert await r.zcard(KEYS.queue) == 15
    assert await r.smembers(KEYS.holds("i-1")) == set()


async def test_shutdown_timeout_cancels_late_jobs_which_run_again(
    r: Any, loops: list[Loop]
) -> None:
    app = App("t")
    tries: list[int] = []

    @app.task
    async def stuck(ctx: JobContext) -> None:
        tries.append(ctx.job_try)
        await asyncio.sleep(3600)

    lp = Loop(r, app, shutdown_timeout_s=0.2)
    loops.append(lp.start())
    jid = await lp.client.enqueue("stuck")
    await eventually(lambda: tries, what="the job to start")
    await lp.halt()
    assert await r.zscore(KEYS.queue, jid) is not None  # still queued: it runs again
    assert await r.exists(K.ARQ_IN_PROGRESS + jid) == 0  # type: ignore[operator]
    assert await r.exists(K.ARQ_RESULT + jid) == 0  # type: ignore[operator]


async def test_a_run_whose_claim_was_taken_is_cancelled_and_writes_nothing(
    r: Any, loops: list[Loop]
) -> None:
    app = App("t")
    events: list[str] = []

    @app.task
    async def long(ctx: JobContext) -> str:
        events.append("start")
        for _ in range(200):
            await asyncio.sleep(0.02)
        events.append("end")
        return "mine"

    lp = Loop(r, app, doubt_s=0.4)
    loops.append(lp.start())
    jid = await lp.client.enqueue("long")
    await eventually(lambda: events, what="the job to start")
    await r.set(K.ARQ_IN_PROGRESS + jid, b"other/1")  # reaped and claimed by another consumer
    await eventually(lambda: not lp.consumer.running, what="the run to be cancelled")
    assert events == ["start"]
    assert await r.exists(K.ARQ_RESULT + jid) == 0  # type: ignore[operator]
    assert await r.get(K.ARQ_IN_PROGRESS + jid) == b"other/1"  # type: ignore[operator]
    assert lp.consumer.totals["lost"] == 1


async def test_aborted_job_ends_with_a_failed_result(r: Any, loops: list[Loop]) -> None:
    app = App("t")
    started = asyncio.Event()
    cancelled = asyncio.Event()

    @app.task
    async def waits(ctx: JobContext) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    lp = Loop(r, app)
    loops.append(lp.start())
    jid = await lp.client.enqueue("waits")
    assert jid is not None
    await asyncio.wait_for(started.wait(), 5)
    await r.zadd(KEYS.abort, {jid: T})  # what Client.abort() writes
    await asyncio.wait_for(cancelled.wait(), 5)

    async def result_written() -> bool:
        return bool(await r.exists(K.ARQ_RESULT + jid))

    await eventually(result_written, what="the aborted run's result")
    info = deserialize_result(await r.get(K.ARQ_RESULT + jid), deserializer=msgpack_loads)
    assert info.success is False and info.result["error"] == "CancelledError"
    assert await r.zscore(KEYS.queue, jid) is None
    assert await r.zcard(KEYS.abort) == 0


# -- queues, retry policies, cluster-wide limits ----------------------------------------------


async def test_queues_in_priority_order_and_routed_by_task(r: Any, loops: list[Loop]) -> None:
    app = App("t", queues=("high", "default", "low"))
    order: list[str] = []

    @app.task(queue="high")
    async def urgent(ctx: JobContext, n: int) -> None:
        order.append(f"high-{n}")

    @app.task
    async def normal(ctx: JobContext, n: int) -> None:
        order.append(f"default-{n}")

    @app.task(queue="low")
    async def later(ctx: JobContext, n: int) -> None:
        order.append(f"low-{n}")

    lp = Loop(r, app, concurrency=1)
    for n in range(3):  # enqueued before any consumer runs: backlog in every queue
        await lp.client.enqueue("later", n)
        await lp.client.enqueue("normal", n)
        await lp.client.enqueue("urgent", n)
    assert await r.zcard(KEYS.queue_of("high")) == 3 and await r.zcard(KEYS.queue) == 3
    loops.append(lp.start())
    await eventually(lambda: len(order) == 9, what="every job")
    assert [o.split("-")[0] for o in order] == ["high"] * 3 + ["default"] * 3 + ["low"] * 3
    # the result names the queue the job ran from, as arq's does
    jid = await lp.client.enqueue("later", 9)
    await eventually(lambda: "low-9" in order)

    async def kept() -> bool:
        return bool(await r.exists(K.ARQ_RESULT + jid))

    await eventually(kept)
    info = deserialize_result(await r.get(K.ARQ_RESULT + jid), deserializer=msgpack_loads)
    assert info.queue_name == KEYS.queue_of("low")


async def test_duty_slots_run_a_duty_job_while_user_jobs_fill_every_shared_slot(
    r: Any, loops: list[Loop]
) -> None:
    """With ``concurrency=2`` and ``duty_slots=1``: two user jobs hold both shared slots, three
    more wait, and the third never takes the duty slot; a job in the duty lane, announced on
    the duty marker, starts in it at once, ahead of every queued user job."""
    app = App("t")
    release = asyncio.Event()
    started: list[str] = []

    @app.task
    async def hold(ctx: JobContext, n: int) -> None:
        started.append(f"user-{n}")
        await release.wait()

    @app.task
    async def duty(ctx: JobContext) -> None:
        started.append("duty")

    lp = Loop(r, app, concurrency=2, duty_slots=1)
    for n in range(5):
        await lp.client.enqueue("hold", n)
    loops.append(lp.start())
    try:
        await eventually(lambda: len(started) == 2, what="both shared slots busy")
        await asyncio.sleep(0.3)
        assert len(started) == 2 and "duty" not in started  # the duty slot is not a user job's
        await lp.client.enqueue("duty", queue="default:duty")
        await r.zadd(KEYS.wake_duty_marker, {"wake": round(time.time() * 1000)}, lt=True)
        await eventually(lambda: "duty" in started, what="the duty job in its slot")
        assert len(started) == 3 and started[2] == "duty" and lp.consumer.in_flight == 2
    finally:
        release.set()  # the held user jobs end (the consumer's drain waits for them)
    await eventually(lambda: len(started) == 6, what="the user jobs after")


async def test_a_consumer_takes_only_its_queues(r: Any, loops: list[Loop]) -> None:
    app = App("t")
    ran: list[str] = []

    @app.task(queue="emails")
    async def mail(ctx: JobContext) -> None:
        ran.append("mail")

    @app.task
    async def other(ctx: JobContext) -> None:
        ran.append("other")

    lp = Loop(r, app, queues=("emails",))
    loops.append(lp.start())
    await lp.client.enqueue("other")
    await lp.client.enqueue("mail")
    await lp.client.enqueue("mail", queue="default")  # explicit queue wins over the task's
    await eventually(lambda: ran == ["mail"], what="the emails job")
    await asyncio.sleep(0.2)
    assert ran == ["mail"] and await r.zcard(KEYS.queue) == 2


async def test_retry_on_with_a_delay_policy_then_set_aside(r: Any, loops: list[Loop]) -> None:
    app = App("t")
    tries: list[int] = []
    delays: list[int] = []

    @app.task(max_tries=3, retry_on=ConnectionError, retry_delay=lambda n: 0.05 * n)
    async def flaky(ctx: JobContext) -> None:
        tries.append(ctx.job_try)
        delays.append(int(time.time() * 1000))
        raise ConnectionError("partner down")

    @app.task(max_tries=3, retry_on=ConnectionError)
    async def other_error(ctx: JobContext) -> None:
        tries.append(100 + ctx.job_try)
        raise ValueError("not retried")

    lp = Loop(r, app)
    loops.append(lp.start())
    jid = await lp.client.enqueue("flaky")
    await eventually(lambda: tries == [1, 2, 3], what="three tries")

    async def dead() -> bool:
        return await r.zscore(KEYS.dead, jid) is not None

    await eventually(dead, what="set aside after the last try")
    assert delays[1] - delays[0] >= 45 and delays[2] - delays[1] >= 95  # 50 ms, then 100 ms
    rec = json.loads(await r.hget(KEYS.dead_jobs, jid))
    assert "ConnectionError: partner down (after 3 tries)" in rec["reason"]
    await lp.client.enqueue("other_error")
    await eventually(lambda: 101 in tries)
    await asyncio.sleep(0.2)
    assert tries.count(101) == 1 and 102 not in tries  # not a retried exception: fails once


async def test_max_concurrency_holds_across_consumers(r: Any, loops: list[Loop]) -> None:
    app = App("t")
    running = 0
    peak = 0
    done: list[int] = []

    @app.task(max_concurrency=2, max_tries=1)  # over the limit is a deferral, not a try
    async def scarce(ctx: JobContext, n: int) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        done.append(n)

    a, b = Loop(r, app, instance="a"), Loop(r, app, instance="b")
    for n in range(12):
        await a.client.enqueue("scarce", n)
    loops += [a.start(), b.start()]
    await eventually(lambda: len(done) == 12, within=20, what="every job")
    assert peak <= 2 and sorted(done) == list(range(12))
    assert await r.zcard(KEYS.dead) == 0  # nobody ran out of tries waiting
    assert await r.zcard(KEYS.limit_slots("scarce")) == 0


async def test_a_dead_holders_slot_comes_back_after_its_lease(r: Any, loops: list[Loop]) -> None:
    app = App("t")
    done: list[str] = []

    @app.task(max_concurrency=1)
    async def single(ctx: JobContext) -> None:
        done.append(ctx.job_id)

    # a consumer that died (SIGKILL) while holding the only slot: nobody renews it
    now = int(time.time() * 1000)
    await r.zadd(KEYS.limit_slots("single"), {"ghost": now + 400})
    lp = Loop(r, app, slot_lease_s=0.4)
    loops.append(lp.start())
    await lp.client.enqueue("single")
    await asyncio.sleep(0.2)
    assert done == []  # waiting for the slot
    await eventually(lambda: len(done) == 1, within=5, what="the slot to come back")


async def test_rate_limit_spreads_starts(r: Any, loops: list[Loop]) -> None:
    app = App("t")
    starts: list[float] = []

    @app.task(rate="5/s")
    async def throttled(ctx: JobContext) -> None:
        starts.append(time.monotonic())

    lp = Loop(r, app)
    for _ in range(10):
        await lp.client.enqueue("throttled")
    loops.append(lp.start())
    await eventually(lambda: len(starts) == 10, within=10, what="every start")
    # a burst of 5, then 5 more spread over about a second
    assert starts[-1] - starts[0] >= 0.8, starts[-1] - starts[0]


class Recorder(JobHook):
    """A feature's hook: defers each job once, then records every step the consumer calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def admit(
        self, job: JobDef, job_id: str, record: Mapping[str, Any] = NO_RECORD
    ) -> int | None:
        self.calls.append("admit")
        return None if "admit" in self.calls[:-1] else int(time.time() * 1000) + 50

    def context(self, job_id: str) -> Mapping[str, Any]:
        self.calls.append("context")
        return {"mark": "from the hook"}

    async def release(self, job: JobDef, job_id: str) -> None:
        self.calls.append("release")

    async def ended(self, job_id: str, args: Sequence[Any], outcome: Outcome) -> None:
        self.calls.append(f"ended:{outcome}")


async def test_hooks_admit_defer_add_context_and_see_each_end(r: Any, loops: list[Loop]) -> None:
    app = App("t")
    seen: list[tuple[str, int]] = []

    @app.task(max_tries=1)  # a deferral gives its try back
    async def work(ctx: JobContext) -> None:
        seen.append((ctx["mark"], ctx.job_try))

    rec = Recorder()
    lp = Loop(r, app, hooks=[rec])
    loops.append(lp.start())
    await lp.client.enqueue("work")
    await eventually(lambda: "ended:success" in rec.calls, what="the run's end")
    assert seen == [("from the hook", 1)]
    assert rec.calls == ["admit", "admit", "context", "release", "ended:success"]


# -- the shape ----------------------------------------------------------------------------------


def test_the_consumer_knows_no_feature_and_stays_in_small_parts() -> None:
    """Features attach through ``JobHook`` from the wiring: no module of ``worker/consumer/``
    imports one; each part stays under 400 lines; a part imports siblings, never the package."""
    import ast
    from pathlib import Path

    features = {"periodic", "poller", "limits", "broadcast", "initializer", "services", "keyed"}
    offenders = []
    for path in sorted((Path(__file__).parents[2] / "worker" / "consumer").glob("*.py")):
        text = path.read_text()
        assert len(text.splitlines()) <= 400, f"{path.name} is over 400 lines"
        for node in ast.walk(ast.parse(text)):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                parts = name.split(".")
                if parts[0] == "worker" and len(parts) > 1 and parts[1] in features:
                    offenders.append(f"{path.name} imports {name}")
                if name == "worker.consumer" and path.name != "__init__.py":
                    offenders.append(f"{path.name} imports the package")
    assert not offenders, offenders


# -- the idle fallback look -----------------------------------------------------


async def test_the_fallback_look_is_rare_while_subscribed_and_at_once_when_the_wake_ups_break(
    redis_url: str, loops: list[Loop]
) -> None:
    """Waiting on the wake marker, an idle consumer looks at the queue every
    ``idle_poll_subscribed_s`` (30 s here: enqueues wake it); once that wait breaks it looks at
    once and then every ``idle_poll_max_s``, so a job nobody announced (a plain arq client) is
    not left waiting."""
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(redis_url)
    app = App("t")
    ran: list[str] = []

    @app.task
    async def record(ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    lp = Loop(r, app, idle_poll_max_s=0.2, idle_poll_subscribed_s=30.0)
    loops.append(lp.start())
    wakeups, fetch = lp.consumer.wakeups, lp.consumer.fetch
    await eventually(lambda: wakeups.subscribed, what="the wake subscription")
    await eventually(lambda: fetch.next_delay(0) == 30.0, what="the idle, subscribed delay")
    await asyncio.sleep(0.3)  # the look the subscription asked for (it may have missed some)
    # unannounced, as arq's enqueue_job writes it: nothing wakes the consumer
    plain = Client(r, keys=lp.client.keys, serialize=msgpack_dumps, clock=lp.client.clock)
    await plain.store.redis.set(
        K.ARQ_JOB + "plain-1", msgpack_dumps({"t": 1, "f": "record", "a": [], "k": {}, "et": 1})
    )
    await plain.store.redis.zadd(lp.client.keys.queue, {"plain-1": 1})
    await asyncio.sleep(0.5)
    assert ran == []  # the next look is 30 s away
    for c in await r.client_list():  # the wait on the wake marker breaks
        if c.get("cmd") == "bzpopmin":
            await r.client_kill_filter(_id=c["id"])
    await eventually(lambda: ran == ["plain-1"], within=5, what="the look after the break")
    await eventually(lambda: wakeups.subscribed, what="subscribed again")
    await lp.halt()
    loops.remove(lp)
    await r.aclose()


def test_a_wake_for_a_job_due_a_millisecond_ahead_is_a_timer_not_a_lost_claim() -> None:
    """``CLAIM`` takes what is due by the consumer's clock: a job announced 1 ms ahead of it,
    claimed now, would be skipped and then wait for the next fallback look (30 s)."""
    from worker.consumer.wakeups import Wakeups
    from worker.core.clock import FakeClock

    clock = FakeClock()
    wakeups = Wakeups(None, clock)  # type: ignore[arg-type]  # no Redis: heard() only
    wakeups.woken = False
    now = round(clock.time() * 1000)
    wakeups.heard(now + 1)
    assert not wakeups.woken and wakeups.next_due == now + 1 and wakeups.event.is_set()
    wakeups.heard(now)
    assert wakeups.woken


async def test_a_job_whose_dead_letter_cannot_be_written_still_ends_failed(
    r: Any, loops: list[Loop], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Setting aside a job that used up its retries fails (Redis said no): the error is logged
    and the job still ends with a failed result, and the consumer goes on."""
    app = App("t")

    @app.task(max_tries=1, retry_on=ConnectionError)
    async def flaky(ctx: JobContext) -> None:
        raise ConnectionError("partner down")

    @app.task
    async def fine(ctx: JobContext) -> int:
        return 7

    async def refused(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("dead letters unavailable")

    monkeypatch.setattr(DeadLetters, "set_aside", refused)
    lp = Loop(r, app)
    loops.append(lp.start())
    jid = await lp.client.enqueue("flaky")

    async def ended() -> bool:
        return bool(await r.exists(K.ARQ_RESULT + jid)) and not await r.exists(K.ARQ_JOB + jid)

    await eventually(ended, what="a failed result, the job record gone")
    info = await lp.client.job(jid).result_info()
    assert info is not None and info.success is False
    assert await lp.client.job(await lp.client.enqueue("fine")).result(timeout=10) == 7
    assert lp.task is not None and not lp.task.done()
