"""The outbox's SQL: the tables, the producer's insert and the relay's statements.

``worker_outbox`` holds the jobs enqueued in committed (or still open) transactions, in the
order they were written; ``worker_outbox_fence`` the highest fencing token a relay has used:
a relay raises it when it starts and in every transaction that deletes rows (``token <= $1``),
and reads it before each read of rows, so a relay of an older leadership finds it above its
own token and its reads and deletes are refused by the database.
"""

from __future__ import annotations

#: The outbox table.
TABLE = "worker_outbox"
#: The NOTIFY channel an enqueue signals on (delivered at commit; a rollback sends nothing).
CHANNEL = "worker_outbox"

#: Every statement :func:`worker.outbox.install` runs (idempotent; also a migration's body).
SCHEMA = """
CREATE TABLE IF NOT EXISTS worker_outbox (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key uuid NOT NULL UNIQUE,
    task text NOT NULL,
    args jsonb NOT NULL,
    kwargs jsonb NOT NULL,
    job_id text,
    unique_key text,
    queue text,
    defer_by_s double precision NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS worker_outbox_fence (name text PRIMARY KEY, token bigint NOT NULL);
INSERT INTO worker_outbox_fence (name, token) VALUES ('relay', 0) ON CONFLICT (name) DO NOTHING;
"""

#: The producer's one statement: the row, and a NOTIFY the relay hears at commit.
INSERT = """
WITH row AS (
    INSERT INTO worker_outbox (key, task, args, kwargs, job_id, unique_key, queue, defer_by_s)
    VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
    RETURNING id
)
SELECT pg_notify('worker_outbox', '') FROM row
"""

#: The same insert for SQLAlchemy's ``text()`` (named parameters, explicit casts for drivers
#: that type parameters from the statement, such as asyncpg).
INSERT_NAMED = """
WITH row AS (
    INSERT INTO worker_outbox (key, task, args, kwargs, job_id, unique_key, queue, defer_by_s)
    VALUES (CAST(:key AS uuid), :task, CAST(:args AS jsonb), CAST(:kwargs AS jsonb), :job_id,
            :unique_key, :queue, :defer_by_s)
    RETURNING id
)
SELECT pg_notify('worker_outbox', '') FROM row
"""
#: :data:`SCHEMA` one statement at a time (a driver's extended protocol takes one per call).
STATEMENTS = tuple(s.strip() for s in SCHEMA.split(";") if s.strip())

#: The relay raises the fence to its token; no row updated: a newer relay's token is there.
FENCE = "UPDATE worker_outbox_fence SET token = %s WHERE name = 'relay' AND token <= %s"
#: The fence as the relay reads it before each read of rows (no write on an idle outbox).
FENCE_TOKEN = "SELECT token FROM worker_outbox_fence WHERE name = 'relay'"
#: The relay's read, in the fence's transaction: the oldest rows first.
READ = """
SELECT id, key, task, args, kwargs, job_id, unique_key, queue, defer_by_s,
       EXTRACT(EPOCH FROM clock_timestamp() - created_at)::float8
FROM worker_outbox ORDER BY id LIMIT %s
"""
#: The relay's delete of moved rows, in the fence's transaction.
DELETE = "DELETE FROM worker_outbox WHERE id = ANY(%s)"
#: A relay paused inside a transaction holds the fence row's lock: the server ends its session
#: after this, so the next relay waits no longer (a paused relay's delete is rolled back; its
#: rows are moved ids the next relay finds and deletes).
IDLE_TIMEOUT = "SET idle_in_transaction_session_timeout = 5000"
#: The relay listens for enqueues on this.
LISTEN = f"LISTEN {CHANNEL}"
