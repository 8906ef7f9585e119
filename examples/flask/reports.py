"""The worker side of the Flask example: plain ``def`` tasks, written as synchronous code is.

Workers run it with ``WORKER_APP=reports:app python -m worker run`` (this folder on
``PYTHONPATH``); the Flask app (``web.py``) imports the same :class:`~worker.App` so its
:class:`~worker.SyncClient` enqueues exactly what these workers run. ``render_report`` is the
kind of code a team moves out of a view: a blocking database session (here ``sqlite3``, the
file named by ``REPORTS_DB``), run in the worker's sync threads (``WORKER_SYNC_THREADS``)
while its event loop goes on.
"""

from __future__ import annotations

import os
import sqlite3
import time

from worker import App, JobContext

app = App("reports")


def database() -> sqlite3.Connection:
    db = sqlite3.connect(os.environ.get("REPORTS_DB", "reports.sqlite3"), timeout=10)
    db.execute("CREATE TABLE IF NOT EXISTS reports (user_id INTEGER PRIMARY KEY, body TEXT)")
    return db


@app.task(timeout_s=60)
def render_report(ctx: JobContext, user_id: int) -> dict[str, object]:
    """Render a user's report with blocking calls, store it, and tell the user (an async task,
    enqueued from this thread through ``ctx.sync``)."""
    rows = []
    for month in range(1, 4):
        if not ctx.sync.still_claimed():  # a long loop checks it: stop once the run ended
            raise RuntimeError("the run ended (timeout or abort); stopping")
        time.sleep(0.05)  # a slow query
        rows.append(f"month {month}: {user_id * month} orders")
    body = "\n".join(rows)
    with database() as db:
        db.execute("REPLACE INTO reports VALUES (?, ?)", (user_id, body))
    ctx.sync.enqueue("notify", user_id, unique_key=f"notify:{user_id}:{ctx.job_id}")
    return {"user_id": user_id, "lines": len(rows)}


@app.task
async def notify(ctx: JobContext, user_id: int) -> str:
    """An ordinary async task next to the sync ones (here: count the notice in Redis)."""
    await ctx.redis.hincrby(f"{ctx.context.settings.key_prefix}reports:notified", str(user_id), 1)
    return f"notified {user_id}"
