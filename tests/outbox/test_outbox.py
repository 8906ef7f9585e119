"""The fenced outbox: ``worker.outbox.enqueue`` inside the app's PostgreSQL transaction, and
the leader's relay moving committed rows into Redis, each exactly one job.

A real PostgreSQL (``harness/postgres.py``) and the real Redis-compatible server throughout;
the end-to-end runs are real ``python -m worker`` processes running examples/outbox: a commit
runs its job once, a rollback runs nothing, and a relay frozen (``SIGSTOP``) after reading its
rows, past its lease, cannot publish them again once a new leader moved them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import time
from collections.abc import AsyncIterator, Iterable
from types import ModuleType
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

import worker
from harness import ROOT, FixedLease, Spawn, WorkerProc, wait_until
from harness.docpages import page
from harness.postgres import Postgres
from worker.core.clock import SystemClock
from worker.core.errors import ConfigError, InvalidId, LeadershipLost
from worker.core.metrics import Metrics
from worker.core.serializer import msgpack_dumps, msgpack_loads
from worker.duties.outbox import OutboxRelay
from worker.storage.keys import Keys
from worker.storage.store import FencedStore, Store


def _load_example() -> ModuleType:
    """examples/outbox/app.py (its processes find it on ``PYTHONPATH``; here, by its path)."""
    spec = importlib.util.spec_from_file_location("outbox_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLE = ROOT / "examples" / "outbox" / "app.py"
example = _load_example()
APP = "outbox.app:app"
KEYS = Keys("tob:")
LOCK = "1700000000000:relay-a"


def test_the_outbox_page_shows_the_example_this_file_runs() -> None:
    text = page("outbox")  # docs/outbox.md
    assert '--8<-- "examples/outbox/app.py"' in text
    assert "WORKER_OUTBOX_DSN" in text


def outbox_rows(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT task, args, kwargs FROM worker_outbox ORDER BY id").fetchall()


def test_a_row_is_written_only_when_its_transaction_commits(postgres: Postgres) -> None:
    dsn = postgres.database("outbox_sync")
    with psycopg.connect(dsn, autocommit=True) as conn:
        worker.outbox.install(conn)
        worker.outbox.install(conn)  # idempotent
        with pytest.raises(RuntimeError), conn.transaction():
            worker.outbox.enqueue(conn, "send_receipt", 1)
            raise RuntimeError("the request failed")
        assert outbox_rows(dsn) == []
        with conn.transaction():
            key = worker.outbox.enqueue(conn, "send_receipt", 2, note="x", defer_by=1.5)
            assert outbox_rows(dsn) == []  # not visible before the commit
        assert outbox_rows(dsn) == [("send_receipt", [2], {"note": "x"})]
        assert len(key) == 36
        with pytest.raises(ValueError):
            worker.outbox.enqueue(conn, "send_receipt", job_id="a", unique_key="b")
        with pytest.raises(InvalidId):
            worker.outbox.enqueue(conn, "send_receipt", job_id="a\nb")


async def test_an_async_connection_enqueues_with_await(postgres: Postgres) -> None:
    dsn = postgres.database("outbox_async")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await example.setup(conn)
        await example.place_order(conn, 7, "9.90")
        with pytest.raises(psycopg.errors.UniqueViolation):
            await example.place_order(conn, 7, "9.90")  # rolled back: no second row
    assert outbox_rows(dsn) == [("send_receipt", [7], {})]


def sqlalchemy_url(dsn: str) -> str:
    return dsn.replace("postgresql://", "postgresql+psycopg://", 1)


def test_a_sqlalchemy_session_enqueues_in_its_transaction(postgres: Postgres) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import Session

    dsn = postgres.database("outbox_sa")
    engine = create_engine(sqlalchemy_url(dsn))
    try:
        with engine.begin() as conn:
            worker.outbox.install(conn)
            worker.outbox.install(conn)
        with Session(engine) as session:
            session.execute(text("CREATE TABLE orders (id int)"))
            worker.outbox.enqueue(session, "send_receipt", 1)
            session.rollback()
            assert outbox_rows(dsn) == []
            worker.outbox.enqueue(session, "send_receipt", 2, unique_key="order-2")
            assert outbox_rows(dsn) == []
            session.commit()
        assert outbox_rows(dsn) == [("send_receipt", [2], {})]
    finally:
        engine.dispose()


async def test_an_async_sqlalchemy_session_enqueues_with_await(postgres: Postgres) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    dsn = postgres.database("outbox_sa_async")
    engine = create_async_engine(sqlalchemy_url(dsn))
    try:
        async with engine.begin() as conn:
            await worker.outbox.install(conn)
        async with AsyncSession(engine) as session, session.begin():
            key = await worker.outbox.enqueue(session, "send_receipt", 3, queue="mail")
        assert len(key) == 36
        assert outbox_rows(dsn) == [("send_receipt", [3], {})]
    finally:
        await engine.dispose()


def test_the_relay_without_psycopg_is_a_configuration_error(monkeypatch: Any) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    store = Store(aioredis.Redis(), KEYS)
    fenced = FencedStore(store, FixedLease(LOCK))
    with pytest.raises(ConfigError, match="fenced-worker\\[outbox\\]"):
        OutboxRelay("postgresql://x", store, fenced, {}, msgpack_dumps, SystemClock())


def rows_counted(relay: OutboxRelay, outcome: str) -> float | None:
    assert relay.metrics is not None
    sample = relay.metrics.registry.get_sample_value
    return sample("worker_outbox_rows_total", {"outcome": outcome})


async def relay_of(dsn: str, r: aioredis.Redis, lock: str = LOCK) -> tuple[OutboxRelay, FixedLease]:
    await r.set(KEYS.leader, lock)
    lease = FixedLease(lock)
    store = Store(r, KEYS)
    fenced = FencedStore(store, lease)
    relay = OutboxRelay(dsn, store, fenced, {}, msgpack_dumps, SystemClock(), Metrics())
    await relay.setup()
    return relay, lease


def outbox_db(pg: Postgres, name: str, receipts: Iterable[tuple[Any, str | None]] = ()) -> str:
    """Database ``name`` with the outbox installed, holding a ``send_receipt(arg)`` row per
    ``(arg, job id or None)`` of ``receipts``."""
    dsn = pg.database(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        worker.outbox.install(conn)
        for arg, job_id in receipts:
            worker.outbox.enqueue(conn, "send_receipt", arg, job_id=job_id)
    return dsn


@contextlib.asynccontextmanager
async def relay_on(
    dsn: str, redis_url: str
) -> AsyncIterator[tuple[OutboxRelay, FixedLease, aioredis.Redis]]:
    """A relay set up on ``dsn`` (:func:`relay_of`), its lease and its Redis client; torn down
    and closed after."""
    r = aioredis.Redis.from_url(redis_url)
    try:
        relay, lease = await relay_of(dsn, r)
        try:
            yield relay, lease, r
        finally:
            await relay.teardown()
    finally:
        await r.aclose()


async def test_a_row_moved_twice_is_one_job_and_a_stale_relay_is_refused(
    postgres: Postgres, redis_url: str
) -> None:
    receipts = [(n, f"tob:order:{n}" if n else None) for n in range(3)]
    dsn = outbox_db(postgres, "outbox_relay", receipts)
    async with relay_on(dsn, redis_url) as (relay, lease, r):
        assert relay.conn is not None
        rows = await relay.read(relay.conn)
        ids = [row[0] for row in rows]
        assert [await relay.move(rows), await relay.move(rows)] == [ids, ids]
        queued = [m.decode() for m in await r.zrange(KEYS.queue, 0, -1)]
        assert len(queued) == 3 and "tob:order:1" in queued
        assert [rows_counted(relay, o) for o in ("moved", "duplicate")] == [3, 3]
        assert sum(q.startswith("tob:outbox:") for q in queued) == 1
        record = msgpack_loads(await r.get("arq:job:tob:order:2") or b"")
        assert record["a"] == [2]
        await relay.remove(relay.conn, ids)
        assert outbox_rows(dsn) == []
        # a newer relay raised the fence: this one's reads and deletes are refused
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE worker_outbox_fence SET token = token + 1")
        with pytest.raises(LeadershipLost):
            await relay.read(relay.conn)
        with pytest.raises(LeadershipLost):
            await relay.remove(relay.conn, ids)
        assert lease.losses and "outbox fence refused" in lease.losses[0]
        with pytest.raises(LeadershipLost):  # nor can it start again on its old token
            await relay_of(dsn, r)
        # and the lease gone in Redis: its Redis write is refused too
        await r.set(KEYS.leader, "1700000000001:relay-b")
        with pytest.raises(LeadershipLost):
            await relay.move(rows)


async def test_a_row_the_serializer_refuses_stays_and_the_others_move(
    postgres: Postgres, redis_url: str
) -> None:
    dsn = outbox_db(postgres, "outbox_poison", [(2**70, None), (1, None)])  # msgpack: no 2**70
    async with relay_on(dsn, redis_url) as (relay, _, r):
        assert await relay.tick() == 0.001
        assert await r.zcard(KEYS.queue) == 1
        assert relay.metrics is not None
        assert relay.metrics.registry.get_sample_value("worker_outbox_lag_seconds", {}) > 0
        assert outbox_rows(dsn) == [("send_receipt", [2**70], {})]
        started = time.monotonic()
        assert await relay.tick() == 0.0  # only the refused row left: it waits for a commit
        assert time.monotonic() - started >= 0.9
        assert [rows_counted(relay, o) for o in ("moved", "refused")] == [1, 1]  # logged once


# -- real processes -----------------------------------------------------------------------------


def receipts(dsn: str) -> dict[int, int]:
    """order id -> how many times its receipt job ran."""
    with psycopg.connect(dsn) as conn:
        found = conn.execute("SELECT order_id, count(*) FROM receipts GROUP BY order_id")
        return dict(found.fetchall())


def prepare(pg: Postgres, name: str) -> str:
    dsn = pg.database(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(example.SCHEMA)
        worker.outbox.install(conn)
    return dsn


def order(dsn: str, order_id: int, *, commit: bool = True) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO orders (id, total) VALUES (%s, 1)", (order_id,))
        worker.outbox.enqueue(conn, "send_receipt", order_id)
        conn.commit() if commit else conn.rollback()


def env_for(dsn: str, **more: str) -> dict[str, str | None]:
    return {
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'examples'}",
        "WORKER_OUTBOX_DSN": dsn,
        **more,
    }


@pytest.mark.slow
def test_a_commit_runs_its_job_once_and_a_rollback_nothing(
    spawn: Spawn, postgres: Postgres
) -> None:
    dsn = prepare(postgres, "outbox_e2e")
    proc = spawn("all", app=APP, env=env_for(dsn))
    order(dsn, 1)
    order(dsn, 2, commit=False)
    order(dsn, 3)
    done = wait_until(lambda: receipts(dsn) if len(receipts(dsn)) >= 2 else None, 60, 0.05)
    time.sleep(1.0)  # a rolled-back row would have run by now (the relay looks every 1 s)
    assert receipts(dsn) == {1: 1, 3: 1}, (done, proc.log()[-3000:])
    assert outbox_rows(dsn) == []


def held(proc: WorkerProc) -> bool:
    return any(e.get("event") == "outbox rows held" for e in proc.events())


@pytest.mark.slow
@pytest.mark.parametrize("hold_in", ["read", "delete"])
def test_a_relay_frozen_mid_round_past_its_lease_leaves_every_row_one_job(
    spawn: Spawn, postgres: Postgres, hold_in: str
) -> None:
    """Two processes; the relay holding a batch is SIGSTOPped past its lease: after its read,
    before its Redis write (``read``), or after its Redis write inside its delete transaction,
    holding the fence row's lock (``delete``: the server ends that session after 5 s). The
    other takes over and relays the rows; the old one resumed moves nothing more."""
    dsn = prepare(postgres, f"outbox_frozen_{hold_in}")
    env = env_for(dsn, OUTBOX_HOLD_S="2", OUTBOX_HOLD_IN=hold_in)
    procs = [spawn("all", name=n, app="harness.apps.outbox_hold:app", env=env) for n in "ab"]
    orders = range(1, 21)
    for n in orders:
        order(dsn, n)
    old = wait_until(lambda: next((p for p in procs if held(p)), None), 60, 0.01, what="a hold")
    old.pause()  # frozen mid-round, past its lease
    try:
        new = next(p for p in procs if p is not old)
        wait_until(lambda: outbox_rows(dsn) == [], 60, 0.1, what="the new leader's relay")
        wait_until(lambda: len(receipts(dsn)) == len(orders), 60, 0.1, what="every receipt")
        assert held(new)
    finally:
        old.resume()
    # the old relay wakes mid-round: its Redis write refused by the lease, or its delete
    # transaction ended by the server; either way it stops
    stopped = wait_until(
        lambda: [e for e in old.events() if e.get("component") == "outbox-relay"
                 and "error" in e and e.get("event") != "outbox rows held"],
        30,
        what="the old relay to fail its round",
    )  # fmt: skip
    print("the old relay:", [str(e.get("error"))[:120] for e in stopped])
    order(dsn, 21)  # the cluster relays on
    wait_until(lambda: 21 in receipts(dsn), 60, 0.1, what="a later order")
    wait_until(lambda: outbox_rows(dsn) == [], 30, 0.1, what="the outbox empty")
    time.sleep(1.0)
    assert receipts(dsn) == {n: 1 for n in range(1, 22)}
