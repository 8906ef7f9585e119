"""Coalesced enqueues and deadlines, one process: each mode's script on fakeredis AND the real
server (``r``), the options' checks, and the record's own fields (absent: arq's bytes)."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
import uuid
from typing import Any

import pytest

from harness import eventually
from harness.apps.coalesce import app as co_app
from tests.consumer.test_consumer import Loop, loops
from worker.app import App
from worker.bulk import JobSpec
from worker.client import Client
from worker.context import JobContext
from worker.core import codec
from worker.core.errors import JobExpired
from worker.core.jobdefs import JobHook, JobOutcome, JobRun
from worker.core.metrics import Metrics
from worker.core.serializer import msgpack_dumps, msgpack_loads
from worker.storage import keys as K

__all__ = ["loops"]  # the fixture, shared with test_consumer

#: a realistic epoch-ms value
T0 = 1_700_000_000_000


def _client(r: Any) -> Client:
    prefix = f"c{uuid.uuid4().hex[:6]}:"
    return Client(r, keys=K.Keys(prefix), serialize=msgpack_dumps, app=co_app)


async def _record(r: Any, job_id: str) -> dict[str, Any]:
    raw = await r.get(K.ARQ_JOB + job_id)
    assert raw is not None
    return msgpack_loads(raw)


async def _queued(client: Client) -> list[tuple[bytes, float]]:
    return list(await client.redis.zrange(client.keys.queue, 0, -1, withscores=True))


async def _claim(client: Client, job_id: str) -> None:
    """What CLAIM does to a job it takes: the in-progress marker."""
    await client.redis.set(K.ARQ_IN_PROGRESS + job_id, "someone/1", px=60_000)


async def test_replace_folds_into_the_pending_job_until_it_is_claimed(r: Any) -> None:
    client = _client(r)
    first = await client.enqueue("note", "k", 1, flow_key="k", coalesce="replace")
    again = await client.enqueue("note", "k", 2, flow_key="k", coalesce="replace")
    other = await client.enqueue("note", "j", 9, flow_key="j", coalesce="replace")
    assert first is not None and again == first and other not in (None, first)
    assert (await _record(r, first))[codec.ARGS] == ["k", 2]  # the latest arguments
    assert len(await _queued(client)) == 2
    await _claim(client, first)  # claimed: a new enqueue is a new job
    later = await client.enqueue("note", "k", 3, flow_key="k", coalesce="replace")
    assert later not in (None, first)
    assert (await _record(r, first))[codec.ARGS] == ["k", 2]


async def test_a_unique_key_is_the_coalescing_key_where_given(r: Any) -> None:
    client = _client(r)
    a = await client.enqueue("note", "k", 1, unique_key="u", coalesce="replace")
    b = await client.enqueue("note", "k", 2, unique_key="u", coalesce="replace", flow_key="x")
    assert a is not None and a == b and a != client.unique_job_id("u")
    assert (await _record(r, a))[codec.FLOW_KEY] == "x"


async def test_debounce_moves_the_run_after_the_last_enqueue_but_not_past_max_wait(r: Any) -> None:
    client = _client(r)
    t0 = time.time() * 1000
    jid = await client.enqueue("note", "k", 1, flow_key="k", coalesce="debounce",
                               debounce_s=0.4, max_wait_s=0.7)  # fmt: skip
    assert jid is not None
    [(_, s1)] = await _queued(client)
    assert t0 + 350 <= s1 <= t0 + 1000  # ~0.4 s after the enqueue
    await asyncio.sleep(0.2)
    assert jid == await client.enqueue("note", "k", 2, flow_key="k", coalesce="debounce",
                                       debounce_s=0.4, max_wait_s=0.7)  # fmt: skip
    [(_, s2)] = await _queued(client)
    assert s2 >= s1 + 150  # moved: 0.4 s after the second enqueue
    await asyncio.sleep(0.3)
    assert jid == await client.enqueue("note", "k", 3, flow_key="k", coalesce="debounce",
                                       debounce_s=0.4, max_wait_s=0.7)  # fmt: skip
    [(_, s3)] = await _queued(client)
    assert s3 == pytest.approx(s1 - 400 + 700, abs=5)  # capped: 0.7 s after the first
    assert (await _record(r, jid))[codec.ARGS] == ["k", 3]


async def test_throttle_accepts_one_enqueue_per_period_and_says_when_it_drops(r: Any) -> None:
    client = _client(r)
    got = [await client.enqueue("note", "k", i, flow_key="k", coalesce="throttle",
                                throttle_s=0.5) for i in range(3)]  # fmt: skip
    assert got[0] is not None and got[1:] == [None, None]
    other = await client.enqueue("note", "j", 0, flow_key="j", coalesce="throttle", throttle_s=0.5)
    assert other is not None  # per key
    await asyncio.sleep(0.6)
    assert await client.enqueue("note", "k", 9, flow_key="k", coalesce="throttle",
                                throttle_s=0.5) not in (None, got[0])  # fmt: skip


async def test_keep_last_replaces_the_pending_job_and_admits_one_run_per_key(r: Any) -> None:
    client = _client(r)
    a = await client.enqueue("latest", "k", 1)  # @app.task(flow_key=..., coalesce="keep_last")
    assert a is not None and a == await client.enqueue("latest", "k", 2)
    assert (await _record(r, a))[codec.GATE] == ["keep_last", "k", 0]
    state = client.keys.coalesce("latest", "k")
    store = client.store
    await _claim(client, a)
    assert await store.keep_last_admit(state, a, 60_000)  # a runs
    b = await client.enqueue("latest", "k", 3)  # a runs: b is the pending one
    assert b not in (None, a)
    await _claim(client, b)
    assert not await store.keep_last_admit(state, b, 60_000)  # a still runs: b waits
    await client.redis.delete(K.ARQ_IN_PROGRESS + b)  # (deferred: back in its queue)
    assert b == await client.enqueue("latest", "k", 4)  # b pending again: replaced
    await client.redis.delete(K.ARQ_IN_PROGRESS + a)  # a ended
    assert await store.keep_last_admit(state, b, 60_000)
    assert (await _record(r, b))[codec.ARGS] == ["k", 4]


async def test_the_options_are_checked_before_anything_is_sent(r: Any) -> None:
    client = _client(r)
    with pytest.raises(ValueError, match="needs a flow_key"):
        await client.enqueue("note", "k", 1, coalesce="replace")
    with pytest.raises(ValueError, match="debounce_s"):
        await client.enqueue("note", "k", 1, flow_key="k", coalesce="debounce")
    with pytest.raises(ValueError, match="throttle_s"):
        await client.enqueue("note", "k", 1, flow_key="k", coalesce="replace", throttle_s=1)
    with pytest.raises(ValueError, match="coalesce must be"):
        await client.enqueue("note", "k", 1, flow_key="k", coalesce="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not both"):
        await client.enqueue("note", "k", 1, expires_in=1, expires_at=dt.datetime.now(dt.UTC))
    with pytest.raises(ValueError, match="timezone"):
        await client.enqueue("note", "k", 1, expires_at=dt.datetime.now())
    with pytest.raises(ValueError, match="one by one"):
        await client.enqueue_many([JobSpec("latest", ("k", 1))])
    assert await _queued(client) == []


async def test_the_record_carries_flow_fields_only_when_set(r: Any) -> None:
    client = _client(r)
    plain = await client.enqueue("note", "k", 1)
    keyed = await client.enqueue("note", "k", 1, flow_key="tenant-7", expires_in=30)
    bulk = await client.enqueue_many([JobSpec("note", ("k", 1), flow_key="t", expires_in=5)])
    assert plain is not None and keyed is not None and bulk[0] is not None
    assert set(await _record(r, plain)) == set(codec.JOB_FIELDS)
    rec = await _record(r, keyed)
    assert rec[codec.FLOW_KEY] == "tenant-7"
    now_ms = (await r.time())[0] * 1000
    assert now_ms + 25_000 <= rec[codec.DEADLINE] <= now_ms + 35_000  # the server's clock
    assert (await _record(r, bulk[0]))[codec.FLOW_KEY] == "t"


def test_a_record_without_flow_fields_is_arqs_and_arq_reads_one_with_them() -> None:
    arq_jobs = pytest.importorskip("arq.jobs")
    args = ("send", (1, "x"), {"a": 2}, 1_700_000_000_000)
    ours = codec.encode_job(*args, msgpack_dumps)
    theirs = arq_jobs.serialize_job(*args[:3], None, args[3], serializer=msgpack_dumps)
    assert ours == theirs
    flow = codec.JobFlow("tenant-7", 1_700_000_060_000, ("throttle", "k", 500))
    with_fields = codec.encode_job(*args, msgpack_dumps, flow=flow)
    read = arq_jobs.deserialize_job(with_fields, deserializer=msgpack_loads)
    assert (read.function, read.args, read.kwargs) == ("send", [1, "x"], {"a": 2})
    assert codec.job_flow(msgpack_loads(with_fields)) == flow


# -- in one consumer (tests/consumer/test_consumer.py's loop) ----------------------------------


class _Ends(JobHook):
    """Records each run's outcome as ``on_job_end`` hooks see it."""

    def __init__(self) -> None:
        self.seen: list[JobOutcome] = []

    async def finished(self, run: JobRun, outcome: JobOutcome) -> None:
        self.seen.append(outcome)


async def test_an_expired_job_never_runs_its_end_is_told_and_counted(
    r: Any, loops: list[Loop]
) -> None:
    app = App("t")
    ran: list[int] = []

    @app.task
    async def work(ctx: JobContext, n: int) -> None:
        ran.append(n)

    ends, metrics = _Ends(), Metrics()
    lp = Loop(r, app, hooks=[ends], metrics=metrics)
    late = await lp.client.enqueue("work", 1, expires_in=0.05)
    fine = await lp.client.enqueue("work", 2, expires_in=60)
    await asyncio.sleep(0.3)  # no consumer yet: the first deadline passes
    loops.append(lp.start())
    await eventually(lambda: len(ends.seen) == 2, what="both ends")
    assert ran == [2]
    by_id = {o.job_id: o for o in ends.seen}
    assert by_id[fine].status == "success"  # type: ignore[index]
    expired = by_id[late]  # type: ignore[index]
    assert expired.status == "expired" and isinstance(expired.error, JobExpired)
    assert metrics.jobs_expired.labels("default", "work")._value.get() == 1


async def test_keep_last_waits_for_its_keys_run_in_one_consumer(r: Any, loops: list[Loop]) -> None:
    app = App("t")
    running: list[int] = []
    overlaps: list[int] = []
    ran: list[int] = []

    @app.task(flow_key=lambda n: "k", coalesce="keep_last")
    async def sync(ctx: JobContext, n: int) -> None:
        if running:
            overlaps.append(n)
        running.append(n)
        await asyncio.sleep(0.2)
        running.remove(n)
        ran.append(n)

    lp = Loop(r, app, concurrency=10)
    loops.append(lp.start())
    for n in range(6):
        await lp.client.enqueue("sync", n)
        await asyncio.sleep(0.05)
    await eventually(lambda: ran and ran[-1] == 5, what="the last enqueue's run")
    assert overlaps == [] and len(ran) < 6


async def test_throttle_admits_one_start_per_key_and_period(r: Any) -> None:
    client = _client(r)
    store, state = client.store, client.keys.coalesce("note", "k")
    assert await store.throttle_admit(state, "a", T0, 500, 60_000) is None
    assert await store.throttle_admit(state, "b", T0 + 100, 500, 60_000) == T0 + 500
    assert await store.throttle_admit(state, "a", T0 + 200, 500, 60_000) is None  # a again
    assert await store.throttle_admit(state, "b", T0 + 600, 500, 60_000) == T0 + 700
    assert await store.throttle_admit(state, "b", T0 + 700, 500, 60_000) is None
    assert await r.pttl(state) > 0


async def test_throttled_jobs_due_together_start_a_period_apart(r: Any, loops: list[Loop]) -> None:
    app = App("t")
    starts: list[float] = []

    @app.task
    async def refresh(ctx: JobContext, n: int) -> None:
        starts.append(time.monotonic())

    lp = Loop(r, app)
    opts: dict[str, Any] = {"flow_key": "k", "coalesce": "throttle", "throttle_s": 0.5}
    assert await lp.client.enqueue("refresh", 1, **opts) is not None
    await asyncio.sleep(0.6)  # the period of the first enqueue is over: the next is accepted
    assert await lp.client.enqueue("refresh", 2, **opts) is not None
    await asyncio.sleep(0.1)  # a backlog: both due when the consumer starts
    loops.append(lp.start())
    await eventually(lambda: len(starts) == 2, what="both runs")
    assert starts[1] - starts[0] >= 0.4  # the second waited for its key's period
