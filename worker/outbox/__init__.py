"""Enqueue inside the app's own database transaction: a fenced outbox on PostgreSQL.

:func:`enqueue` writes the job as a row of the outbox table on the app's open connection, in
its transaction: it becomes a job only if that transaction commits, and never before. The
leader's outbox relay (:mod:`worker.duties.outbox`, on when ``WORKER_OUTBOX_DSN`` is set) moves
committed rows into Redis under its fencing token, each row exactly one job, and deletes a row
only once Redis confirmed its job. :func:`install` creates the tables (:data:`SCHEMA` is the
same SQL, for a migration tool).

Takes psycopg 3 connections and cursors, sync and async (``fenced-worker[outbox]``), and
SQLAlchemy 2 sessions and connections, sync and async. Neither is imported by ``import
worker``::

    async with conn.transaction():
        await conn.execute("INSERT INTO orders ...")
        await worker.outbox.enqueue(conn, "send_receipt", order_id)

    with conn.transaction():  # a sync connection: no await
        worker.outbox.enqueue(conn, "send_receipt", order_id)
"""

from __future__ import annotations

import inspect
import json
import math
import uuid
from collections.abc import Awaitable, Sequence
from typing import Any

from worker.core.ids import check_id
from worker.outbox.schema import INSERT, INSERT_NAMED, SCHEMA, STATEMENTS, TABLE

__all__ = ["SCHEMA", "TABLE", "enqueue", "install"]


def enqueue(
    conn: Any,
    task: str,
    *args: Any,
    job_id: str | None = None,
    unique_key: str | None = None,
    queue: str | None = None,
    defer_by: float = 0.0,
    **kwargs: Any,
) -> Any:
    """Write ``task(*args, **kwargs)`` into the outbox on ``conn``, in its open transaction;
    return the row's key (a UUID string). The job's id is ``<prefix>outbox:<key>``, or
    ``job_id``, or the one ``unique_key`` names (as :meth:`worker.Client.enqueue`).

    ``conn``: a psycopg 3 connection or cursor, or a SQLAlchemy session or connection. An
    async one returns an awaitable (``await worker.outbox.enqueue(conn, ...)``), a sync one
    writes at once. Arguments must be JSON values (they wait in a ``jsonb`` column).
    ``queue``: the queue to wait in (by default the one the task declares); ``defer_by``:
    seconds after the relay moved the row. An id or key :meth:`worker.Client.enqueue` would
    refuse raises :class:`~worker.core.errors.InvalidId` here, before anything is written."""
    if not task:
        raise ValueError("task must be a task's name")
    if job_id is not None and unique_key is not None:
        raise ValueError("give unique_key or job_id, not both")
    if not math.isfinite(defer_by) or defer_by < 0:
        raise ValueError("defer_by must be a finite number of seconds >= 0")
    if job_id is not None:
        check_id(job_id, "job_id")
    elif unique_key is not None:
        check_id(unique_key, "unique_key")
    key = str(uuid.uuid4())
    row = {
        "key": key, "task": task, "args": json.dumps(list(args)), "kwargs": json.dumps(kwargs),
        "job_id": job_id, "unique_key": unique_key, "queue": queue, "defer_by_s": float(defer_by),
    }  # fmt: skip
    if _sqlalchemy(conn):
        from sqlalchemy import text

        result = conn.execute(text(INSERT_NAMED), row)
    else:
        result = conn.execute(INSERT, tuple(row.values()))
    if inspect.isawaitable(result):
        return _awaited([result], key)
    return key


def install(conn: Any) -> Any:
    """Create the outbox tables if they do not exist (:data:`SCHEMA`, idempotent) on
    ``conn`` (as :func:`enqueue` takes it); an async one returns an awaitable. Commit
    afterwards unless ``conn`` is in autocommit mode."""
    if _sqlalchemy(conn):
        from sqlalchemy import text

        if inspect.iscoroutinefunction(conn.execute):
            return _awaited([], TABLE, conn, [text(s) for s in STATEMENTS])
        for s in STATEMENTS:
            conn.execute(text(s))
        return TABLE
    result = conn.execute(SCHEMA)
    if inspect.isawaitable(result):
        return _awaited([result], TABLE)
    return TABLE


def _sqlalchemy(conn: Any) -> bool:
    return type(conn).__module__.startswith("sqlalchemy.")


async def _awaited(
    results: Sequence[Awaitable[Any]], out: str, conn: Any = None, statements: Sequence[Any] = ()
) -> str:
    for result in results:
        await result
    for statement in statements:
        await conn.execute(statement)
    return out
