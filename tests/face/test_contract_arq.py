"""Contract with arq: arq's own ``Worker`` (not ours) consumes what our Lua scripts write, our
consumer runs what ``ArqRedis.enqueue_job`` writes, and each side reads the other's results.

The framework speaks arq's format without depending on arq (:mod:`worker.core.codec`); the
poller's DISPATCH script and the periodic enqueuer's ENQUEUE_TICKS script build arq job records
by hand. If arq changes its record format, these tests fail before production does. They need
arq (``pip install -e '.[test,arq]'``, which brings redis-py 5): without it they skip, except
where ``WORKER_REQUIRE_ARQ=1`` (CI's arq environment), where they fail.
"""

from __future__ import annotations

import asyncio
import tomllib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from harness import ROOT, FixedLease
from harness.arqfmt import require_arq
from worker.app import App
from worker.client import Client, connect_redis
from worker.core.clock import SystemClock, ms
from worker.core.ids import JobIds
from worker.core.serializer import get_serializer
from worker.duties.periodic import PeriodicEnqueuer
from worker.duties.poller import PollingScheduler
from worker.polls import BoundPoller
from worker.storage import keys as K
from worker.storage.store import FencedStore, Store

arq = require_arq(module_level=True)
from arq.connections import ArqRedis  # noqa: E402 (arq only once it is known to be there)
from arq.jobs import Job, JobStatus  # noqa: E402
from arq.worker import Worker, func  # noqa: E402

pytestmark = pytest.mark.timeout(60)

LOCK_VALUE = "1:contract-test-token"


def test_arq_is_an_extra_not_a_dependency() -> None:
    """arq comes with the ``[arq]`` extra only (it pins redis<6); the installed arq is one the
    extra accepts."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = [Requirement(d) for d in project["dependencies"]]
    assert not [d for d in deps if d.name == "arq"], "arq must not be a runtime dependency"
    (pin,) = [Requirement(d) for d in project["optional-dependencies"]["arq"]]
    assert pin.name == "arq" and Version(arq.VERSION) in pin.specifier, (pin, arq.VERSION)


def arq_redis(redis_url: str, keys: K.Keys) -> ArqRedis:
    """arq's client with our msgpack serializer and ``keys``' queue as its default."""
    ser, de = get_serializer("msgpack")
    pool = connect_redis(redis_url, queue_name=keys.queue).connection_pool
    return ArqRedis(pool, job_serializer=ser, job_deserializer=de, default_queue_name=keys.queue)


@pytest.fixture
async def contract(redis_url: str) -> AsyncIterator[tuple[ArqRedis, K.Keys]]:
    """An ArqRedis with our msgpack serializer, a fresh prefix, and a leader lock we hold."""
    keys = K.Keys(f"c{uuid.uuid4().hex[:6]}:")
    redis = arq_redis(redis_url, keys)
    await redis.set(keys.leader, LOCK_VALUE)  # the fenced scripts check this value
    yield redis, keys
    await redis.aclose(close_connection_pool=True)


async def run_arq_worker(
    redis_url: str, keys: K.Keys, functions: list[Any], expected_jobs: int
) -> Worker:
    """arq's own Worker, burst mode, on its own pool: runs every queued job and returns."""
    ser, de = get_serializer("msgpack")
    pool = arq_redis(redis_url, keys)
    worker = Worker(
        functions=functions,
        redis_pool=pool,
        queue_name=keys.queue,
        burst=True,
        poll_delay=0.05,
        handle_signals=False,
        job_serializer=ser,
        job_deserializer=de,
        keep_result=60,
    )
    try:
        await worker.main()
    finally:
        # not worker.close(): it calls redis-py's deprecated close(); same effect here
        await pool.aclose(close_connection_pool=True)
    assert worker.jobs_failed == 0
    assert worker.jobs_complete == expected_jobs
    return worker


async def test_arq_worker_consumes_poller_dispatch(
    contract: tuple[ArqRedis, K.Keys], redis_url: str
) -> None:
    redis, keys = contract
    ser, de = get_serializer("msgpack")
    app = App("contract")
    poller = app.poller("cards", task="poll_card", shards=3, batch_size=50)
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any], int]] = []

    async def poll_card(ctx: dict[str, Any], *args: Any, **kwargs: Any) -> str:
        calls.append((ctx["job_id"], args, kwargs, ctx["job_try"]))
        return f"polled {args[0]}"

    now = ms(SystemClock().time())
    items = {f"card-{n}": (now - 5000 + n) / 1000 for n in range(12)}
    store = Store(redis, keys)
    keys_ids = JobIds(keys.prefix)
    await BoundPoller(poller, store, SystemClock()).schedule_many(items)
    future = "card-future"
    await BoundPoller(poller, store, SystemClock()).schedule(future, delay=3600)

    fenced = FencedStore(store, FixedLease(LOCK_VALUE))
    scheduler = PollingScheduler(poller, store, fenced, ser, SystemClock())
    await scheduler.tick()
    assert scheduler.dispatched_total == len(items)

    # arq's own view of the queue reads the records the script wrote
    queued = {jd.job_id: jd for jd in await redis.queued_jobs()}
    assert len(queued) == len(items)
    expected_ids = {}
    for item, due_s in items.items():
        job_id = keys_ids.poll("cards", item, round(due_s * 1000))
        expected_ids[job_id] = item
        jd = queued[job_id]
        assert jd.function == "poll_card"
        assert list(jd.args) == [item]
        assert jd.kwargs == {}
        assert jd.job_try is None
        assert abs(ms(jd.enqueue_time.timestamp()) - now) < 10_000
        assert (
            await Job(job_id, redis, _queue_name=keys.queue, _deserializer=de).status()
            == JobStatus.queued
        )

    await run_arq_worker(redis_url, keys, [func(poll_card, name="poll_card")], len(items))

    assert {c[0]: c[1] for c in calls} == {j: (i,) for j, i in expected_ids.items()}
    assert all(kwargs == {} and job_try == 1 for _, _, kwargs, job_try in calls)
    for job_id, item in expected_ids.items():
        job = Job(job_id, redis, _queue_name=keys.queue, _deserializer=de)
        assert await job.status() == JobStatus.complete
        assert await job.result(timeout=1) == f"polled {item}"
    assert await redis.zcard(keys.queue) == 0
    # the future item was left alone
    assert await redis.zscore(keys.poll_shard("cards", poller.shard_of(future)), future)


async def test_arq_worker_consumes_periodic_ticks(
    contract: tuple[ArqRedis, K.Keys], redis_url: str
) -> None:
    redis, keys = contract
    ser, _ = get_serializer("msgpack")
    app = App("contract")
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    async def heartbeat_job(ctx: dict[str, Any], *args: Any, **kwargs: Any) -> int:
        calls.append((ctx["job_id"], args, kwargs))
        return len(calls)

    app.periodic(every=1, catch_up="all", catch_up_limit=5)(heartbeat_job)
    job = app.periodics["heartbeat_job"]

    now = ms(SystemClock().time())
    last = job.schedule.latest(now) - 4000  # four ticks were missed since this one
    await redis.hset(keys.periodic_state, "heartbeat_job", last)
    keys_ids = JobIds(keys.prefix)
    store = Store(redis, keys)
    enqueuer = PeriodicEnqueuer(
        [job], store, FencedStore(store, FixedLease(LOCK_VALUE)), ser, SystemClock()
    )
    await enqueuer.tick()

    queued = {jd.job_id: jd for jd in await redis.queued_jobs()}
    ticks = sorted(int(j.rsplit(":", 1)[1]) for j in queued)
    assert len(ticks) >= 4, queued
    assert ticks == list(range(last + 1000, ticks[-1] + 1, 1000))
    for t in ticks:
        jd = queued[keys_ids.periodic("heartbeat_job", t)]
        assert jd.function == "heartbeat_job"
        assert list(jd.args) == [] and jd.kwargs == {}
        assert jd.score == t

    # a second leader (or a paused one waking up) cannot enqueue the same ticks again
    await redis.hset(keys.periodic_state, "heartbeat_job", last)
    await enqueuer.tick()
    assert await redis.zcard(keys.queue) == len(ticks)

    await run_arq_worker(redis_url, keys, [func(heartbeat_job, name="heartbeat_job")], len(ticks))
    assert sorted(c[0] for c in calls) == sorted(
        keys_ids.periodic("heartbeat_job", t) for t in ticks
    )
    assert all(args == () and kwargs == {} for _, args, kwargs in calls)


async def test_arq_worker_consumes_client_enqueue(
    contract: tuple[ArqRedis, K.Keys], redis_url: str
) -> None:
    """The UNIQUE_ENQUEUE script (Client.enqueue) writes records arq runs, args and kwargs."""
    redis, keys = contract
    ser, _ = get_serializer("msgpack")
    client = Client(redis, keys=keys, serialize=ser)
    keys_ids = JobIds(keys.prefix)
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    async def send(ctx: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        calls.append((args, kwargs))

    first = await client.enqueue("send", 1, "two", flag=True, unique_key="send:1")
    assert first == keys_ids.unique("send:1")
    assert await client.enqueue("send", 1, "two", flag=True, unique_key="send:1") is None
    await client.enqueue("send", 3)

    await run_arq_worker(redis_url, keys, [func(send, name="send")], 2)
    assert sorted(calls, key=repr) == sorted([((1, "two"), {"flag": True}), ((3,), {})], key=repr)


async def test_arq_worker_runs_jobs_a_traced_client_enqueued(
    contract: tuple[ArqRedis, K.Keys], redis_url: str
) -> None:
    """With WORKER_TRACING=otel the record carries one extra field (the trace context): arq
    ignores it and runs the job with exactly the arguments given."""
    from worker.tracing import KEY, Tracing

    redis, keys = contract
    ser, deser = get_serializer("msgpack")
    client = Client(redis, keys=keys, serialize=ser, tracing=Tracing())
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    async def send(ctx: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        calls.append((args, kwargs))

    jid = await client.enqueue("send", 1, flag=True)
    assert jid is not None
    record = deser(await redis.get(K.ARQ_JOB + jid))
    assert set(record) == {"t", "f", "a", "k", "et", KEY}
    await run_arq_worker(redis_url, keys, [func(send, name="send")], 1)
    assert calls == [((1,), {"flag": True})]


async def test_mixed_deployment_arq_worker_and_ours_on_one_queue_run_each_job_once(
    redis_url: str,
) -> None:
    """During a rollout a plain arq ``Worker`` and the framework's consumer share a queue: every
    job runs once, and every result is readable with arq's ``Job``."""
    from worker.consumer.config import ConsumerConfig
    from worker.consumer.consumer import Consumer
    from worker.consumer.dead import DeadLetters
    from worker.context import Context
    from worker.settings import Settings

    keys = K.Keys(f"mix{uuid.uuid4().hex[:6]}:")
    ser, de = get_serializer("msgpack")
    redis = connect_redis(redis_url, queue_name=keys.queue)
    ledger = f"{keys.prefix}ledger"

    async def rec(ctx: Any, n: int) -> int:
        await redis.hincrby(ledger, str(ctx["job_id"]), 1)
        await asyncio.sleep(0.005)
        return n * 2

    app = App("mix")
    app.task(name="rec")(rec)
    client = Client(redis, keys=keys, serialize=ser, app=app)
    ids = [await client.enqueue("rec", n) for n in range(2000)]
    arq_pool = arq_redis(redis_url, keys)
    arq_worker = Worker(
        functions=[func(rec, name="rec")], redis_pool=arq_pool, queue_name=keys.queue,
        poll_delay=0.01, max_jobs=50, handle_signals=False, job_serializer=ser,
        job_deserializer=de, keep_result=60, burst=True,  # it ends once the queue is empty
    )  # fmt: skip
    ctx = Context(
        Settings.model_construct(key_prefix=client.keys.prefix),
        redis,
        client,
        SystemClock(),
        "ours",
    )
    store = client.store
    ours = Consumer(
        app.jobs(), [], ctx, store, (ser, de), SystemClock(), instance_id="ours",
        config=ConsumerConfig(concurrency=10, poll_delay_s=0.01, keep_result_s=60),
        dead=DeadLetters(store, SystemClock(), instance_id="ours"),
    )  # fmt: skip
    stop = asyncio.Event()
    tasks = [asyncio.create_task(arq_worker.main())]
    for _ in range(500):  # arq's Worker first, so it surely takes a share; then both at once
        if await redis.hlen(ledger) >= 20:
            break
        await asyncio.sleep(0.01)
    tasks.append(asyncio.create_task(ours.run(stop)))
    try:
        await asyncio.wait_for(tasks[0], 45)
        for _ in range(600):
            if await redis.zcard(keys.queue) == 0 and not ours.running:
                break
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await arq_pool.aclose(close_connection_pool=True)
    runs = {k.decode(): int(v) for k, v in (await redis.hgetall(ledger)).items()}
    twice = {j: n for j, n in runs.items() if n != 1}
    assert not twice, f"{len(twice)} jobs ran more than once"
    assert set(runs) == set(ids), f"{len(set(ids) - set(runs))} jobs never ran"
    assert arq_worker.jobs_complete > 0 and ours.totals["complete"] > 0  # both took a share
    assert arq_worker.jobs_complete + ours.totals["complete"] == len(ids)
    for n, jid in enumerate(ids[::97]):
        job = Job(jid, redis, _queue_name=keys.queue, _deserializer=de)  # type: ignore[arg-type]
        assert await job.status() == JobStatus.complete
        assert await job.result(timeout=1) == ids.index(jid) * 2, n
    await redis.aclose(close_connection_pool=True)


@pytest.mark.parametrize("name", ["msgpack", "json", "pickle"])
def test_records_are_arqs_byte_for_byte(name: Any) -> None:
    """The codec writes arq's job and result records (the same bytes) and each side decodes
    the other's."""
    import warnings

    from arq.jobs import deserialize_job, deserialize_result, serialize_job, serialize_result

    from worker.core import codec

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pickle's warning
        ser, de = get_serializer(name)
    args, kwargs = ["card-1", 2], {"k": 1}
    for job_try in (None, 3):
        ours = codec.encode_job("poll", args, kwargs, 1_700_000_000_123, ser, job_try)
        assert ours == serialize_job(
            "poll", args, kwargs, job_try, 1_700_000_000_123, serializer=ser
        )  # type: ignore[arg-type]
        theirs = deserialize_job(ours, deserializer=de)
        mine = codec.decode_job(ours, de)
        assert (mine.function, mine.args, mine.kwargs, mine.job_try, mine.enqueue_time) == (
            theirs.function, theirs.args, theirs.kwargs, theirs.job_try, theirs.enqueue_time
        )  # fmt: skip
    fields = (
        "poll",
        ("card-1",),
        kwargs,
        2,
        1_000,
        True,
        {"ok": 1},
        2_000,
        3_000,
        "ref",
        "q",
        "j1",
    )
    ours_r = codec.encode_result(*fields, serializer=ser)
    assert ours_r == serialize_result(*fields, serializer=ser)  # type: ignore[arg-type]
    a, b = (
        codec.decode_result(ours_r or b"", de),
        deserialize_result(ours_r or b"", deserializer=de),
    )
    assert vars(a) == vars(b)
    bad = ("poll", (), {}, 1, 1, True, object(), 2, 3, "ref", "q", "j2")  # not serializable
    if name != "pickle":
        assert codec.encode_result(*bad, serializer=ser) == serialize_result(*bad, serializer=ser)  # type: ignore[arg-type]


async def test_our_consumer_runs_what_arq_enqueued_and_both_read_the_results(
    contract: tuple[ArqRedis, K.Keys],
) -> None:
    """``ArqRedis.enqueue_job`` (arq's ids and ours) runs on our consumer; a task raising arq's
    own ``arq.worker.Retry`` runs again; arq's ``Job`` and ``Client.job`` read every result."""
    from arq.worker import Retry as ArqRetry

    from worker.consumer.config import ConsumerConfig
    from worker.consumer.consumer import Consumer
    from worker.consumer.dead import DeadLetters
    from worker.context import Context
    from worker.settings import Settings

    redis, keys = contract
    ser, de = get_serializer("msgpack")
    app = App("contract")

    @app.task(name="double")
    async def double(ctx: Any, n: int, *, plus: int = 0) -> int:
        return n * 2 + plus

    @app.task(name="flaky", max_tries=3)
    async def flaky(ctx: Any) -> int:
        if ctx["job_try"] == 1:
            raise ArqRetry(defer=0.1)
        return int(ctx["job_try"])

    client = Client(redis, keys=keys, serialize=ser, deserialize=de, app=app)
    jobs = [
        await redis.enqueue_job("double", 1),
        await redis.enqueue_job("double", 2, plus=1, _job_id=client.new_job_id()),
        await redis.enqueue_job("flaky"),
    ]
    assert all(j is not None for j in jobs)
    ctx = Context(Settings.model_construct(), redis, client, SystemClock(), "ours")
    ours = Consumer(
        app.jobs(), [], ctx, client.store, (ser, de), SystemClock(), instance_id="ours",
        config=ConsumerConfig(concurrency=4, poll_delay_s=0.05, keep_result_s=60),
        dead=DeadLetters(client.store, SystemClock(), instance_id="ours"),
    )  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(ours.run(stop))
    try:
        for j, want in zip(jobs, [2, 5, 2], strict=True):
            assert j is not None
            assert await j.result(timeout=30, poll_delay=0.05) == want  # arq reads ours
            assert await j.status() == JobStatus.complete
            mine = client.job(j.job_id)  # ours reads ours (arq's record layout)
            assert await mine.status() == JobStatus.complete
            info = await mine.result_info()
            assert info is not None and info.success and info.result == want
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
    flaky_info = await jobs[2].result_info()  # type: ignore[union-attr]
    assert flaky_info is not None and flaky_info.job_try == 2


async def test_our_client_reads_results_arqs_worker_wrote(
    contract: tuple[ArqRedis, K.Keys], redis_url: str
) -> None:
    """``Client.job`` (no arq underneath) reads the status and result arq's ``Worker`` wrote,
    a failure's exception included."""
    redis, keys = contract
    ser, de = get_serializer("msgpack")
    client = Client(redis, keys=keys, serialize=ser, deserialize=de)

    async def echo(ctx: Any, n: int) -> int:
        return n + 1

    jid = await client.enqueue("echo", 41)
    assert jid is not None
    assert await client.job(jid).status() == JobStatus.queued
    await run_arq_worker(redis_url, keys, [func(echo, name="echo")], 1)
    job = client.job(jid)
    assert await job.status() == JobStatus.complete
    assert await job.result(timeout=1) == 42
    info = await job.info()
    assert info is not None and info.function == "echo" and list(info.args) == [41]
