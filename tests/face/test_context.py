"""Job helpers: ctx.mutex, ctx.once/forget, Client.enqueue (unique keys, deferral)."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

from harness import FixedLease
from harness.arqfmt import deserialize_job, expires_extra_ms
from worker.app import App
from worker.client import Client
from worker.context import Context, JobContext
from worker.core.clock import FakeClock
from worker.core.errors import LeadershipLost, UnknownTask
from worker.core.ids import JobIds
from worker.core.serializer import msgpack_dumps, msgpack_loads
from worker.settings import Settings
from worker.storage import keys as K

KEYS = K.Keys("t:")
KEYS_ids = JobIds("t:")
NOW_S = 1_700_000_000.0
NOW = int(NOW_S * 1000)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW_S)


@pytest.fixture
def ctx(r: Any, clock: FakeClock) -> Context:
    app = App("t")
    app.poller("cards", task="poll")

    async def noop(ctx: JobContext, *args: Any, **kwargs: Any) -> None: ...

    for name in ("poll", "activate", "f", "send", "later", "now"):  # what the tests enqueue
        app.task(name=name)(noop)
    return Context(
        settings=Settings.model_construct(key_prefix=KEYS.prefix),
        redis=r,
        client=Client(r, keys=KEYS, serialize=msgpack_dumps, app=app, clock=clock),
        clock=clock,
        instance_id="i-1",
    )


# ---------------------------------------------------------------------------------------------
# mutex
# ---------------------------------------------------------------------------------------------


async def test_mutex_second_holder_gets_false(ctx: Context, r: Any) -> None:
    name = KEYS.mutex("daily-reset")
    async with ctx.mutex("daily-reset", ttl=30) as first:
        assert first is True
        assert 0 < await r.pttl(name) <= 30_000
        async with ctx.mutex("daily-reset", ttl=30) as second:
            assert second is False
        # the loser leaving does not free the winner's mutex
        assert await r.exists(name) == 1
        async with ctx.mutex("monthly-reset", ttl=30) as other:
            assert other is True  # independent keys
    assert await r.exists(name) == 0  # released on exit
    async with ctx.mutex("daily-reset", ttl=30) as again:
        assert again is True


async def test_mutex_released_when_body_raises(ctx: Context, r: Any) -> None:
    with pytest.raises(RuntimeError):
        async with ctx.mutex("m", ttl=30) as held:
            assert held
            raise RuntimeError("work failed")
    assert await r.exists(KEYS.mutex("m")) == 0


async def test_mutex_only_owner_releases(ctx: Context, r: Any) -> None:
    name = KEYS.mutex("m")
    async with ctx.mutex("m", ttl=30) as held:
        assert held
        # our TTL ran out and another worker took the mutex while we were still busy
        await r.set(name, "someone-else", px=30_000)
    assert await r.get(name) == b"someone-else"


async def test_mutex_via_job_context(ctx: Context, r: Any) -> None:
    job = JobContext({"job_id": "j1"}, ctx)
    async with job.mutex("m", 5) as a, ctx.mutex("m", 5) as b:
        assert (a, b) == (True, False)


# ---------------------------------------------------------------------------------------------
# once / forget
# ---------------------------------------------------------------------------------------------


async def test_once_and_forget(ctx: Context, r: Any) -> None:
    assert await ctx.once("remind:42:2024-05-01", ttl=3600) is True
    assert 0 < await r.pttl(KEYS.once("remind:42:2024-05-01")) <= 3_600_000
    assert await ctx.once("remind:42:2024-05-01", ttl=3600) is False
    assert await ctx.once("remind:43:2024-05-01", ttl=3600) is True
    await ctx.forget("remind:42:2024-05-01")
    assert await ctx.once("remind:42:2024-05-01", ttl=3600) is True
    job = JobContext({"job_id": "j"}, ctx)
    assert await job.once("remind:42:2024-05-01", 3600) is False
    await job.forget("remind:42:2024-05-01")
    assert await job.once("remind:42:2024-05-01", 3600) is True


# ---------------------------------------------------------------------------------------------
# enqueue
# ---------------------------------------------------------------------------------------------


async def test_enqueue_unique_key_dedups_while_job_exists(ctx: Context, r: Any) -> None:
    jid = await ctx.enqueue("activate", 7, unique_key="activate:7")
    assert jid == KEYS_ids.unique("activate:7") == "t:unique:activate:7"
    assert await ctx.enqueue("activate", 7, unique_key="activate:7") is None
    assert await ctx.client.enqueue("activate", 8, unique_key="activate:7") is None
    assert await r.zrange(KEYS.queue, 0, -1) == [jid.encode()]
    job = deserialize_job(await r.get(K.ARQ_JOB + jid), deserializer=msgpack_loads)
    assert list(job.args) == [7]  # the first payload is kept

    # running: arq keeps the job key; finished: job key gone, result kept -> still deduped
    await r.delete(K.ARQ_JOB + jid)
    await r.zrem(KEYS.queue, jid)
    await r.set(K.ARQ_RESULT + jid, b"result", px=60_000)
    assert await ctx.enqueue("activate", 7, unique_key="activate:7") is None
    # result expired: the key is free again
    await r.delete(K.ARQ_RESULT + jid)
    assert await ctx.enqueue("activate", 7, unique_key="activate:7") == jid


async def test_a_client_that_knows_the_app_refuses_an_unknown_task(ctx: Context, r: Any) -> None:
    """A misspelt name is refused before anything is written (it would be dead-lettered later
    as an unknown function); a client without an app accepts any name, as arq does."""
    with pytest.raises(UnknownTask, match=r"unknown task 'activte': app 't' declares .*'activate'"):
        await ctx.enqueue("activte", 7)
    with pytest.raises(ValueError, match="did you mean 'activate'"):
        await ctx.client.enqueue("activte", 7, unique_key="activate:7")
    assert await r.keys("*") == []
    plain = Client(r, keys=KEYS, serialize=msgpack_dumps, clock=ctx.clock)
    assert await plain.enqueue("anything_at_all") is not None


async def test_enqueue_ids(ctx: Context, r: Any) -> None:
    a = await ctx.enqueue("f")
    b = await ctx.enqueue("f")
    assert a and b and a != b
    assert a.startswith(KEYS.prefix) and len(a) == len(KEYS.prefix) + 32  # the app's keys
    assert await ctx.enqueue("f", job_id="mine") == "mine"
    assert await ctx.enqueue("f", job_id="mine") is None
    with pytest.raises(ValueError, match="not both"):
        await ctx.enqueue("f", unique_key="u", job_id="j")
    assert await r.zcard(KEYS.queue) == 3


async def test_enqueue_payload_is_arq_record(ctx: Context, r: Any) -> None:
    jid = await ctx.enqueue("send", 1, "two", flag=True)
    assert jid is not None
    job = deserialize_job(await r.get(K.ARQ_JOB + jid), deserializer=msgpack_loads)
    assert (job.function, list(job.args), job.kwargs, job.job_try) == (
        "send",
        [1, "two"],
        {"flag": True},
        None,
    )
    assert int(job.enqueue_time.timestamp() * 1000) == NOW
    assert await r.zscore(KEYS.queue, jid) == NOW
    assert 0 < await r.pttl(K.ARQ_JOB + jid) <= expires_extra_ms


async def test_enqueue_defer_by_and_until(ctx: Context, r: Any, clock: FakeClock) -> None:
    jid = await ctx.enqueue("later", defer_by=90)
    assert jid is not None
    assert await r.zscore(KEYS.queue, jid) == NOW + 90_000
    # the job record outlives the deferral (arq: expires_extra_ms after the due time)
    assert expires_extra_ms < await r.pttl(K.ARQ_JOB + jid) <= expires_extra_ms + 90_000

    at = dt.datetime.fromtimestamp(NOW_S + 3600, dt.UTC)
    jid2 = await ctx.enqueue("later", defer_until=at)
    assert jid2 is not None
    assert await r.zscore(KEYS.queue, jid2) == NOW + 3_600_000

    clock.advance(5)
    jid3 = await ctx.enqueue("now")
    assert await r.zscore(KEYS.queue, jid3) == NOW + 5000

    with pytest.raises(ValueError, match="timezone-aware"):
        await ctx.enqueue("later", defer_until=dt.datetime(2030, 1, 1))


# ---------------------------------------------------------------------------------------------
# JobContext
# ---------------------------------------------------------------------------------------------


async def test_job_context_attributes(ctx: Context, r: Any) -> None:
    job = JobContext({"job_id": "j1", "job_try": 3, "redis": "arq"}, ctx, tick_ms=NOW)
    assert job.job_id == "j1" and job.job_try == 3
    assert job["redis"] == "arq"  # arq's ctx is still a dict
    assert job.redis is r
    assert job.tick == dt.datetime.fromtimestamp(NOW_S, dt.UTC)
    assert job.state is ctx.state
    ctx.state["db"] = "pool"
    assert job.state["db"] == "pool"
    plain = JobContext({"job_id": "j2"}, ctx)
    assert plain.job_try == 1 and plain.tick is None
    assert job.poller("cards").name == "cards"
    jid = await job.enqueue("f", unique_key="k")
    assert jid == KEYS_ids.unique("k")


# ---------------------------------------------------------------------------------------------
# the lease handle: is_leading, leader_epoch, fencing_token, fenced_pipeline
# ---------------------------------------------------------------------------------------------


def with_lease(ctx: Context, value: str | None) -> FixedLease:
    lease = FixedLease(value)
    ctx.leader = lease
    return lease


async def test_lease_handle_without_a_leader_candidate(ctx: Context) -> None:
    assert ctx.is_leading() is False and ctx.leader_epoch() is None
    with pytest.raises(LeadershipLost):
        ctx.fenced_pipeline()


async def test_a_singleton_service_runs_with_its_lease_epoch_as_fencing_token(
    ctx: Context, clock: FakeClock
) -> None:
    from worker.duties.services import Service, ServiceDef

    seen: list[tuple[str, int]] = []
    lease = FixedLease("7:mine")

    async def ledger(sctx: Context, stop: asyncio.Event) -> None:
        seen.append(("start", sctx.fencing_token()))
        lease.value = "9:successor"  # the lease moves on while this run goes on
        seen.append(("later", sctx.fencing_token()))  # the run keeps its (now stale) token

    service = Service(ServiceDef("ledger", ledger), ctx, clock, leader=lease)
    await service.run(asyncio.Event())
    await service.run(asyncio.Event())  # a run under the next lease: its epoch
    assert seen == [("start", 7), ("later", 7), ("start", 9), ("later", 9)]
    with pytest.raises(LeadershipLost, match="singleton services"):
        ctx.fencing_token()  # the process context: no leadership of its own

    async def everywhere(sctx: Context, stop: asyncio.Event) -> None:
        sctx.fencing_token()

    with pytest.raises(LeadershipLost, match="singleton services"):
        await Service(ServiceDef("p", everywhere, "per_process"), ctx, clock).run(asyncio.Event())


async def test_a_refused_outside_fence_steps_the_leader_down(ctx: Context) -> None:
    lease = with_lease(ctx, "7:mine")
    sctx = ctx.under(7)
    exc = sctx.fence_refused("ledger")
    assert isinstance(exc, LeadershipLost) and "ledger refused token 7" in str(exc)
    assert lease.losses == [str(exc)]


async def test_fenced_pipeline_commits_only_while_the_lock_is_ours(ctx: Context, r: Any) -> None:
    lease = with_lease(ctx, "7:mine")
    await r.set(KEYS.leader, "7:mine")
    assert ctx.is_leading() and ctx.leader_epoch() == 7
    async with ctx.fenced_pipeline() as pipe:
        pipe.set("t:report", "one")
        pipe.hincrby("t:count", "n", 1)
        assert await pipe.execute() == [True, 1]
    assert await r.get("t:report") == b"one"

    await r.set(KEYS.leader, "8:successor")  # the lease moved on
    async with ctx.fenced_pipeline() as pipe:
        pipe.set("t:report", "two")
        with pytest.raises(LeadershipLost):
            await pipe.execute()
    assert await r.get("t:report") == b"one"  # nothing written
    assert lease.losses and "no longer this process's" in lease.losses[0]

    lease.value = None  # not leading (in doubt): refused without touching Redis
    async with ctx.fenced_pipeline() as pipe:
        pipe.set("t:report", "three")
        with pytest.raises(LeadershipLost):
            await pipe.execute()
    assert await r.get("t:report") == b"one"


async def test_fenced_pipeline_retries_when_a_renew_touches_the_lock(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal lands between each write's WATCH and EXEC (the leader's renew loop touching
    the lock): every write retries once and commits. The renewal is placed, not raced: a loop
    renewing every few ms lost to a loaded box's round trips five times in a row."""
    import redis.asyncio as aioredis

    from worker.storage.fenced import FencedPipeline

    r = aioredis.Redis.from_url(redis_url)
    renewer = aioredis.Redis.from_url(redis_url)  # the renew loop's own connection
    client = Client(r, keys=KEYS, serialize=msgpack_dumps)
    ctx2 = Context(Settings.model_construct(), r, client, FakeClock(NOW_S), "i")
    with_lease(ctx2, "7:mine")
    await r.set(KEYS.leader, "7:mine", px=10_000)
    watches: list[int] = []
    original_watch = FencedPipeline.watch

    async def watch_then_renew(self: FencedPipeline, *names: Any) -> Any:
        out = await original_watch(self, *names)
        watches.append(id(self))
        if watches.count(id(self)) == 1:  # a renewal touches the lock: this EXEC fails
            await renewer.pexpire(KEYS.leader, 10_000)
        return out

    monkeypatch.setattr(FencedPipeline, "watch", watch_then_renew)
    pipes = []
    try:
        for _ in range(50):
            async with ctx2.fenced_pipeline() as pipe:
                pipes.append(pipe)  # kept alive: ids stay distinct
                pipe.incr("t:n")
                await pipe.execute()
    finally:
        await renewer.aclose()
    assert await r.get("t:n") == b"50"  # each committed once, none lost or doubled
    assert all(watches.count(id(p)) == 2 for p in pipes)  # each retried exactly once
    assert await r.get(KEYS.leader) == b"7:mine"
    await r.aclose()


# ---------------------------------------------------------------------------------------------
# the public surface: the internal store and key names are not handed to user code
# ---------------------------------------------------------------------------------------------


def test_ctx_store_and_keys_are_deprecated_and_name_what_to_use(ctx: Context) -> None:
    with pytest.warns(DeprecationWarning, match=r"Context\.store .*ctx\.redis") as caught:
        assert ctx.store is ctx.client.store
    assert caught[0].filename == __file__  # the warning points at the caller's line
    with pytest.warns(DeprecationWarning, match=r"Context\.keys .*ctx\.settings\.key_prefix"):
        assert ctx.keys.prefix == KEYS.prefix
