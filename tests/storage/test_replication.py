"""Durable writes (``WAIT``): what each part of the protocol does when the replicas confirm a
write and when they do not, on a real primary with one replica that the tests pause
(``SIGSTOP``: it stops acknowledging, as a lagging or partitioned replica would).

The failover itself (Sentinels, SIGKILLed primary, real worker processes) is in
tests/system/test_failover.py; here each rule is checked on its own, in-process, in seconds.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from harness import FixedLease, eventually
from harness.ports import free_port_pair
from harness.topology import Node, wait_for
from worker.app import App
from worker.client import Client
from worker.consumer.config import ConsumerConfig
from worker.consumer.consumer import Consumer
from worker.consumer.dead import DeadLetters
from worker.context import Context, JobContext
from worker.core.clock import SystemClock
from worker.core.errors import NotReplicated
from worker.core.redisurl import Replication
from worker.core.serializer import msgpack_dumps, msgpack_loads
from worker.leadership.base import LeaderTiming
from worker.leadership.elector import LeaderElector
from worker.settings import Settings
from worker.storage import keys as K
from worker.storage.election import Renewal
from worker.storage.jobs import NewJob
from worker.storage.periodic import DueTicks
from worker.storage.store import FencedStore, Store

KEYS = K.Keys("rep:")
#: The policy under test: its timeout is what a paused replica costs each lagging step, and
#: what a live one has to answer in (a loaded box has taken over 200 ms)
WAIT1 = Replication(1, 500)


class Pair:
    """A primary and one replica; :meth:`lag` pauses the replica (WAIT then times out)."""

    def __init__(self) -> None:
        root = Path(tempfile.mkdtemp(prefix="worker-pair-", dir="/tmp"))
        self.primary = Node(root, "primary", free_port_pair())
        self.replica = Node(root, "replica", free_port_pair())

    def start(self) -> Pair:
        self.primary.start()
        self.replica.start()
        with self.replica.client() as c:
            c.replicaof(*self.primary.address)
        wait_for(lambda: self.replica.synced_replica_of(self.primary), 20, "replica sync")
        return self

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.primary.port}/0"

    def lag(self) -> None:
        self.replica.pause()

    def catch_up(self) -> None:
        self.replica.resume()

    def close(self) -> None:
        self.replica.stop()
        self.primary.stop()


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    p = Pair().start()
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
async def r(pair: Pair) -> AsyncIterator[Any]:
    pair.catch_up()
    client = aioredis.Redis.from_url(pair.url)
    await client.flushall()
    # the replica, resumed from the last test's pause, has everything before the test starts
    assert await client.execute_command("WAIT", 1, 20_000) >= 1, "the replica did not catch up"
    yield client
    pair.catch_up()
    await client.aclose()


def lagging(pair: Pair) -> Any:
    """Context manager: the replica is paused inside it."""

    class _Lag:
        def __enter__(self) -> None:
            pair.lag()

        def __exit__(self, *exc: object) -> None:
            pair.catch_up()

    return _Lag()


# -- the store ---------------------------------------------------------------------------------


async def test_without_a_policy_nothing_waits(r: Any, pair: Pair) -> None:
    store = Store(r, KEYS)
    with lagging(pair):
        started = time.monotonic()
        assert await store.unique_enqueue(NewJob("j", b"x", 1), 60_000)
        assert time.monotonic() - started < 0.4  # no WAIT (it would take the 500 ms timeout)


async def test_enqueue_is_acknowledged_only_once_replicated(r: Any, pair: Pair) -> None:
    store = Store(r, KEYS, WAIT1)
    assert await store.unique_enqueue(NewJob("a", b"x", 1), 60_000) is True
    with lagging(pair):
        with pytest.raises(NotReplicated, match="enqueue: confirmed by 0 of the 1 replica"):
            await store.unique_enqueue(NewJob("b", b"x", 1), 60_000)
        assert await r.exists(K.ARQ_JOB + "b")  # on the primary, not acknowledged
        # the id exists, but "already there" is an answer only once the replicas have it
        with pytest.raises(NotReplicated):
            await store.unique_enqueue(NewJob("b", b"x", 1), 60_000)
    assert await store.unique_enqueue(NewJob("b", b"x", 1), 60_000) is False


async def test_client_enqueue_raises_a_connection_error(r: Any, pair: Pair) -> None:
    client = Client(r, keys=KEYS, serialize=msgpack_dumps, replication=WAIT1)
    assert await client.enqueue("f", unique_key="k1") is not None
    with lagging(pair), pytest.raises(RedisConnectionError):  # NotReplicated is one
        await client.enqueue("f", unique_key="k2")


async def test_lease_not_confirmed_is_not_led_and_a_renew_not_confirmed_fails(
    r: Any, pair: Pair
) -> None:
    store = Store(r, KEYS, WAIT1)
    elector = LeaderElector(store, LeaderTiming(3, 0.5, 1.5, 0.25), SystemClock())
    with lagging(pair):
        await elector._campaign()
        assert elector.lock is None and not elector.is_leading()
        assert elector.floor >= 1  # the epoch it was offered stays its floor
        assert (await r.get(KEYS.leader)).decode().endswith(elector.token)
    await elector._campaign()  # confirmed now: leads, with a newer epoch
    lock = elector.lock
    assert lock is not None and lock.epoch > 1 and elector.is_leading()
    with lagging(pair), pytest.raises(NotReplicated, match="lease renew"):
        await store.renew_lock(lock, 3000)
    assert await store.renew_lock(lock, 3000) == Renewal.RENEWED


async def test_fenced_writes_count_only_once_replicated(r: Any, pair: Pair) -> None:
    store = Store(r, KEYS, WAIT1)
    await r.set(KEYS.leader, "5:me")
    fenced = FencedStore(store, FixedLease("5:me"))
    tick = [DueTicks("t", 1000, [NewJob("rep:periodic:t:1000", b"x", 1000)], "default")]
    with lagging(pair), pytest.raises(NotReplicated, match="fenced write"):
        await fenced.enqueue_ticks(tick, 60_000)
    # a retry of the same ticks cannot duplicate them, and is confirmed now
    out = await fenced.enqueue_ticks(tick, 60_000)
    assert (out[0].enqueued, out[0].skipped) == (0, 1)
    assert await r.zcard(KEYS.queue) == 1
    with lagging(pair), pytest.raises(NotReplicated, match="fenced pipeline"):
        pipe = fenced.pipeline()
        pipe.set("rep:svc", 1)
        await pipe.execute()


async def test_once_and_mutex_leases_wait(r: Any, pair: Pair) -> None:
    store = Store(r, KEYS, WAIT1)
    assert await store.once("a", 60_000) is True
    with lagging(pair):
        with pytest.raises(NotReplicated):
            await store.once("b", 60_000)
        with pytest.raises(NotReplicated):
            await store.take_lease("rep:m", "me", 60_000)
        assert await store.once("a", 60_000) is False  # a refusal needs no confirmation


# -- the consumer --------------------------------------------------------------------------------


def loop_for(
    r: Any, app: App, instance: str, replication: Replication = WAIT1
) -> tuple[Consumer, Client]:
    client = Client(r, keys=KEYS, serialize=msgpack_dumps, app=app, replication=replication)
    ctx = Context(
        Settings.model_construct(key_prefix=client.keys.prefix), r, client, SystemClock(), instance
    )
    store = client.store
    cfg = ConsumerConfig(poll_delay_s=0.01, idle_poll_max_s=0.02, queues=("default",))
    dead = DeadLetters(store, SystemClock(), instance_id=instance, max_entries=100, keep_bytes=64)
    consumer = Consumer(
        app.jobs(), [], ctx, store, (msgpack_dumps, msgpack_loads), SystemClock(),
        instance_id=instance, config=cfg, dead=dead,
    )  # fmt: skip
    return consumer, client


async def test_a_claim_the_replicas_did_not_confirm_waits_unstarted(r: Any, pair: Pair) -> None:
    app = App("rep")
    ran: list[str] = []

    @app.task
    async def work(ctx: JobContext, n: int) -> int:
        ran.append(ctx.job_id)
        return n

    consumer, client = loop_for(r, app, "c1")
    job_ids = [await client.enqueue("work", i) for i in range(5)]
    stop = asyncio.Event()
    with lagging(pair):
        task = asyncio.create_task(consumer.run(stop))
        await eventually(lambda: _claimed(r, job_ids), what="the batch claimed")
        await asyncio.sleep(0.6)  # several confirmation checks, all short of the replica
        assert ran == [] and len(consumer.fetch.unconfirmed) == 5
    await eventually(lambda: _done(r, job_ids), what="the batch to run once confirmed")
    assert sorted(ran) == sorted(j for j in job_ids if j)
    stop.set()
    await asyncio.wait_for(task, 10)


async def test_ends_the_replicas_did_not_confirm_are_sent_again(r: Any, pair: Pair) -> None:
    app = App("rep")
    gate = asyncio.Event()

    @app.task
    async def work(ctx: JobContext) -> str:
        await gate.wait()
        return "ok"

    consumer, client = loop_for(r, app, "c2")
    job_id = await client.enqueue("work")
    assert job_id is not None
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    await eventually(lambda: _claimed(r, [job_id]), what="claimed")
    with lagging(pair):
        gate.set()
        await eventually(lambda: _done(r, [job_id]), what="the end written on the primary")

        async def pending() -> bool:
            return bool(consumer.completer.resend)

        await eventually(pending, what="the end kept for sending again")
        # as if a failover lost that end: the claim is back on the (new) primary
        # (one transaction: the consumer's next resend must not land half-way through it)
        token = consumer.completer.resend[0].token
        async with r.pipeline(transaction=True) as tx:
            tx.set(K.ARQ_IN_PROGRESS + job_id, token)
            tx.set(K.ARQ_JOB + job_id, b"x")
            tx.zadd(KEYS.queue, {job_id: int(time.time() * 1000) + 600_000})  # parked
            tx.delete(K.ARQ_RESULT + job_id)
            await tx.execute()
        await eventually(lambda: _done(r, [job_id]), what="the end sent again, same claim")
        assert consumer.completer.resend  # applied, still not confirmed

    async def confirmed() -> bool:
        return not consumer.completer.resend

    await eventually(confirmed, what="the end confirmed")
    assert await r.exists(K.ARQ_RESULT + job_id)
    stop.set()
    await asyncio.wait_for(task, 10)


async def _claimed(r: Any, job_ids: list[str | None]) -> bool:
    return all([await r.exists(K.ARQ_IN_PROGRESS + j) for j in job_ids if j])


async def _done(r: Any, job_ids: list[str | None]) -> bool:
    return all([not await r.exists(K.ARQ_JOB + j) for j in job_ids if j])


async def test_a_claim_whose_reply_was_lost_is_given_back(r: Any, pair: Pair) -> None:
    """CLAIM ran (and replicated) but its reply never arrived: a dropped connection, or a
    primary SIGKILLed during the WAIT and replaced by the replica that has the claim. The jobs
    are held in this consumer's name and no run of it knows them; the next round gives them
    back, and each runs once (before: they waited for their markers to expire, ~5 min)."""
    app = App("rep")
    ran: list[str] = []

    @app.task
    async def work(ctx: JobContext, n: int) -> None:
        ran.append(ctx.job_id)

    # the replica is healthy here: a 5 s WAIT costs nothing, and a box too loaded for the
    # replica to confirm within 200 ms no longer fails the enqueue (seen once in a rehearsal)
    consumer, client = loop_for(r, app, "c3", Replication(1, 5000))
    job_ids = [await client.enqueue("work", i) for i in range(3)]
    real = consumer.store.claim
    lost: list[Any] = []

    async def claim_then_drop(*args: Any, **kwargs: Any) -> Any:
        out = await real(*args, **kwargs)
        if not lost and out.jobs:
            lost.append(out)
            raise RedisConnectionError("Connection reset by peer (the reply was lost)")
        return out

    consumer.store.claim = claim_then_drop  # type: ignore[method-assign]
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    await eventually(lambda: _done(r, job_ids), what="the jobs given back and run")
    assert lost and {c.job_id for c in lost[0].jobs} == set(job_ids)
    assert sorted(ran) == sorted(j for j in job_ids if j)  # once each
    assert await r.scard(KEYS.holds("c3")) == 0
    stop.set()
    await asyncio.wait_for(task, 10)


# -- the default policy (auto): the attached replicas, up to one --------------------------------


def detached(pair: Pair) -> Any:
    """Context manager: the replica leaves the primary inside it (``REPLICAOF NO ONE``) and
    follows it again, synced, after."""

    def attached() -> int:
        with pair.primary.client() as c:
            return int(c.info("replication")["connected_slaves"])

    class _Detach:
        def __enter__(self) -> None:
            with pair.replica.client() as c:
                c.replicaof("NO", "ONE")
            wait_for(lambda: attached() == 0, 20, "the replica to leave")

        def __exit__(self, *exc: object) -> None:
            with pair.replica.client() as c:
                c.replicaof(*pair.primary.address)
            wait_for(lambda: pair.replica.synced_replica_of(pair.primary), 20, "replica sync")

    return _Detach()


async def test_auto_waits_while_a_replica_is_attached_goes_on_without_one_and_waits_again(
    r: Any, pair: Pair
) -> None:
    from worker.core.durability import ReplicaView

    auto = Replication(1, 200, adaptive=True, view=ReplicaView(grace_s=1.0))
    store = Store(r, KEYS, auto)
    assert await store.unique_enqueue(NewJob("a", b"x", 1), 60_000) is True
    assert (auto.view.attached, auto.view.degraded) == (1, False)
    with lagging(pair), pytest.raises(NotReplicated):  # attached but silent: as strict
        await store.unique_enqueue(NewJob("b", b"x", 1), 60_000)
    with detached(pair):  # the primary lost its replica: strict for grace_s, then go on
        with pytest.raises(NotReplicated):
            await store.unique_enqueue(NewJob("c", b"x", 1), 60_000)
        assert not auto.view.degraded
        await asyncio.sleep(1.0)
        assert await store.unique_enqueue(NewJob("c", b"x", 1), 60_000) is False  # there
        assert await store.unique_enqueue(NewJob("c2", b"x", 1), 60_000) is True
        await store.confirm()
        assert (auto.view.attached, auto.view.degraded) == (0, True)
        strict = Store(r, KEYS, Replication(1, 200))  # an explicit number: today's outage
        with pytest.raises(NotReplicated):
            await strict.unique_enqueue(NewJob("d", b"x", 1), 60_000)
    # attached again: the first write after waits for it (a probe, then WAIT 1)
    assert await store.unique_enqueue(NewJob("e", b"x", 1), 60_000) is True
    assert (auto.view.attached, auto.view.degraded) == (1, False)
    with pair.replica.client() as c:
        assert c.exists(K.ARQ_JOB + "e")
    with lagging(pair), pytest.raises(NotReplicated):
        await store.unique_enqueue(NewJob("f", b"x", 1), 60_000)


async def test_a_dead_letter_requeue_honours_the_policy(r: Any, pair: Pair) -> None:
    from worker.consumer.dead import retry_dead

    store = Store(r, KEYS, WAIT1)
    dead = DeadLetters(store, SystemClock(), instance_id="i-1", max_entries=100)
    payload = msgpack_dumps({"t": "f"})
    await dead.set_aside("dl-1", "boom", "failed", payload, len(payload))
    with lagging(pair), pytest.raises(NotReplicated, match="dead-letter re-queue"):
        await retry_dead(store, "dl-1")
    assert await r.exists(K.ARQ_JOB + "dl-1")  # re-queued on the primary, not acknowledged
    assert await retry_dead(store, "dl-1") == "missing"


async def test_dead_retry_from_the_command_line_waits_for_the_replicas(
    r: Any, pair: Pair, cli: Any
) -> None:
    """``python -m worker dead --retry`` with WAIT 1 and a silent replica: not acknowledged
    (one line, exit 1), as a client's enqueue would be; it used to answer ``requeued``."""
    dead = DeadLetters(Store(r, KEYS), SystemClock(), instance_id="i-1", max_entries=100)
    payload = msgpack_dumps({"t": "f"})
    await dead.set_aside("dl-2", "boom", "failed", payload, len(payload))
    env = {
        "WORKER_REDIS_URL": pair.url,
        "WORKER_KEY_PREFIX": KEYS.prefix,
        "WORKER_REDIS_WAIT_REPLICAS": "1",
        "WORKER_REDIS_WAIT_TIMEOUT_S": "0.2",
    }
    with lagging(pair):
        out = await asyncio.to_thread(cli, "dead", "--retry", "dl-2", env=env)
    assert out.returncode != 0, out.stdout
    assert "requeued" not in out.stdout
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "confirmed by 0 of the 1 replica" in lines[0], lines


def test_attached_replicas_are_online_and_recent() -> None:
    from worker.core.durability import ReplicaView, attached_replicas

    online = {"ip": "10.0.0.2", "port": 6379, "state": "online", "offset": 10, "lag": 0}
    info = {
        "role": "master",
        "connected_slaves": 3,
        "slave0": online,
        "slave1": {**online, "state": "wait_bgsave"},
        "slave2": {**online, "lag": 11},
    }
    assert attached_replicas(info) == 1
    assert attached_replicas({"role": "master", "connected_slaves": 0}) == 0
    view = ReplicaView()
    assert view.expect(1) == 0  # before the first look: no WAIT that must time out
    assert view.observe({**info, "master_replid": "a"}, 1) == 1 and not view.degraded
    assert view.observe(RuntimeError("NOPERM"), 1) == 1  # unreadable: strict
    # primary "a" lost its replica: strict for the grace period (a failover away from it?)
    assert view.observe({"master_replid": "a"}, 1) == 1 and not view.degraded
    # a promoted node (another replication id) without replicas: go on at once, degraded
    assert view.observe({"master_replid": "b"}, 1) == 0 and view.degraded
    assert view.observe({"master_replid": "a"}, 1) == 1  # "a" is still in its grace period
    assert ReplicaView().observe({"master_replid": "c"}, 1) == 0  # first seen without any


def test_degraded_durability_is_said_once_per_primary_not_once_per_view(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every store keeps its own view (one per queue shard, one per client): a primary that
    runs without a replica is said once by the process, not once per view and look."""
    from worker.core import durability
    from worker.core.durability import ReplicaView

    said: list[str] = []

    class Log:
        def warning(self, event: str, **_: object) -> None:
            said.append(event)

        def info(self, event: str, **_: object) -> None:
            said.append(event)

    monkeypatch.setattr(durability, "log", Log())
    for _ in range(20):
        view = ReplicaView()
        for _ in range(5):
            assert view.observe({"master_replid": "lonely"}, 1) == 0 and view.degraded
    assert len(said) == 1 and said[0].startswith("durability degraded"), said
    online = {"state": "online", "offset": 1, "lag": 0}
    ReplicaView().observe({"master_replid": "lonely", "slave0": online}, 1)
    ReplicaView().observe({"master_replid": "lonely", "slave0": online}, 1)
    assert len(said) == 2 and said[1].startswith("durability restored"), said
