"""A singleton service that writes to PostgreSQL under its leadership's fencing token.

The leader appends a row to ``ledger`` every round, after some work (``FENCING_WORK_S``, a
stand-in for a call to another service). Each row is written in one transaction with the
update of its ``fence`` row, ``WHERE token <= <this leader's token>``: a leader paused past
its lease (a GC pause, SIGSTOP, a stalled VM) that wakes up mid-round still holds its old,
lower token, so the fence refuses its write once a newer leader has written, and it steps down.
docs/fencing.md explains the recipe; tests/system/test_fencing_postgres.py runs this file with two
leaders and a real server.

Run it (PostgreSQL and Redis at hand)::

    pip install 'psycopg[binary]'
    FENCING_PG_DSN=postgresql://localhost/postgres WORKER_APP=fencing_postgres.app:app \\
        PYTHONPATH=examples python -m worker --role all
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import psycopg
import structlog

from worker import App, Context

app = App("fencing-postgres")
log = structlog.get_logger("fencing_postgres")

#: The database: a libpq connection string or URL.
DSN = os.environ.get("FENCING_PG_DSN", "postgresql://localhost/postgres")
#: Seconds of work before each write.
WORK_S = float(os.environ.get("FENCING_WORK_S", "1"))
#: ``1``: write without the fence, as with a lease alone (the test shows the stale write that
#: lets in). Never in production.
UNFENCED = os.environ.get("FENCING_UNFENCED") == "1"
#: The resource the fence guards: one row of ``fence`` per resource.
RESOURCE = "ledger"
#: A writer paused inside a transaction holds the fence row's lock: the server ends such a
#: session after this many ms, so the next leader waits at most that long.
IDLE_IN_TRANSACTION_MS = 5_000

SCHEMA = """
CREATE TABLE IF NOT EXISTS fence (name text PRIMARY KEY, token bigint NOT NULL);
CREATE TABLE IF NOT EXISTS ledger (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    token bigint NOT NULL,
    writer text NOT NULL,
    n bigint NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
INSERT INTO fence (name, token) VALUES ('ledger', 0) ON CONFLICT (name) DO NOTHING;
"""


async def fence(conn: psycopg.AsyncConnection[Any], name: str, token: int) -> bool:
    """Raise the fence of ``name`` to ``token`` inside the caller's transaction (the row stays
    locked until it commits): ``False`` when the fence already holds a higher token, that is,
    a newer leader wrote. Roll back then."""
    cur = await conn.execute(
        "UPDATE fence SET token = %s WHERE name = %s AND token <= %s", (token, name, token)
    )
    return cur.rowcount == 1


@app.service(cardinality="singleton")
async def ledger(ctx: Context, stop: asyncio.Event) -> None:
    """Append a row per round to ``ledger``, fenced by this leadership's token."""
    token = ctx.fencing_token()
    writer = ctx.settings.instance_name
    conn = await psycopg.AsyncConnection.connect(
        DSN,
        autocommit=True,  # transactions only where written: conn.transaction()
        options=f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}",
    )
    async with conn:
        await conn.execute(SCHEMA)
        # a new leader raises the fence before it acts: from here on, the writes of every
        # older leadership are refused, even before this one's first row
        if not UNFENCED:
            async with conn.transaction():
                if not await fence(conn, RESOURCE, token):
                    raise ctx.fence_refused(RESOURCE)
        log.info("ledger writer started", token=token, unfenced=UNFENCED)
        n = 0
        while not stop.is_set():
            await asyncio.sleep(WORK_S)  # the work the row records
            n += 1
            async with conn.transaction():
                if not UNFENCED and not await fence(conn, RESOURCE, token):
                    log.warning("fenced write refused", token=token, n=n)
                    raise ctx.fence_refused(RESOURCE)  # rolls the transaction back
                await conn.execute(
                    "INSERT INTO ledger (token, writer, n) VALUES (%s, %s, %s)", (token, writer, n)
                )
            log.info("ledger row written", token=token, n=n)
