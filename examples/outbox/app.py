"""Enqueue in the app's own transaction: an order and its receipt job commit together.

``place_order`` is what a request handler does: it writes the order and enqueues
``send_receipt`` on the same psycopg connection, in one transaction. If the transaction rolls
back, there is no order and no job; if it commits, the leader's outbox relay
(``WORKER_OUTBOX_DSN``) moves the job to Redis, once, and a consumer runs it. The task records
each run in ``receipts`` so you (and tests/outbox/test_outbox.py) can count them.

Run it (PostgreSQL and Redis at hand)::

    pip install 'fenced-worker[outbox]'
    export WORKER_OUTBOX_DSN=postgresql://localhost/postgres
    WORKER_APP=outbox.app:app PYTHONPATH=examples python -m worker --role all
"""

from __future__ import annotations

import os
from typing import Any

import psycopg

import worker
from worker import App, JobContext

app = App("outbox-example")

#: The app's database: the outbox lives in it, beside the orders.
DSN = os.environ.get("WORKER_OUTBOX_DSN", "postgresql://localhost/postgres")

SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, total numeric NOT NULL);
CREATE TABLE IF NOT EXISTS receipts (
    order_id bigint NOT NULL,
    job_id text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""


async def setup(conn: psycopg.AsyncConnection[Any]) -> None:
    """The app's tables and the outbox's (a migration would do this once)."""
    async with conn.transaction():
        await conn.execute(SCHEMA)
        await worker.outbox.install(conn)


async def place_order(conn: psycopg.AsyncConnection[Any], order_id: int, total: str) -> str:
    """Write the order and enqueue its receipt in one transaction: both or neither."""
    async with conn.transaction():
        await conn.execute("INSERT INTO orders (id, total) VALUES (%s, %s)", (order_id, total))
        return str(await worker.outbox.enqueue(conn, "send_receipt", order_id))


@app.task()
async def send_receipt(ctx: JobContext, order_id: int) -> None:
    """Runs only for committed orders: the order is there to read."""
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        cur = await conn.execute("SELECT total FROM orders WHERE id = %s", (order_id,))
        if await cur.fetchone() is None:
            raise RuntimeError(f"order {order_id} is not there")
        await conn.execute(
            "INSERT INTO receipts (order_id, job_id) VALUES (%s, %s)", (order_id, ctx.job_id)
        )
