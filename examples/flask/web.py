"""The web side of the Flask example: synchronous views that enqueue work and read results.

One :class:`worker.SyncClient` per process, made in :func:`create_app` from the same
``WORKER_*`` settings as the workers (``SyncClient.from_env``) and shared by every request
thread (Flask's threaded server, gunicorn's ``gthread`` workers): it is thread-safe. No
background work runs here::

    PYTHONPATH=examples/flask WORKER_REDIS_URL=redis://localhost:6379/0 \\
        flask --app web:create_app run --port 8000
    PYTHONPATH=examples/flask WORKER_REDIS_URL=redis://localhost:6379/0 WORKER_APP=reports:app \\
        python -m worker run
"""

from __future__ import annotations

import atexit
from typing import Any

import reports
from flask import Flask, abort

from worker import JobStatus, SyncClient


def create_app(client: SyncClient | None = None) -> Flask:
    """The Flask app; ``client`` defaults to ``SyncClient.from_env(app=reports.app)``."""
    web = Flask(__name__)
    if client is None:
        client = SyncClient.from_env(app=reports.app)
        atexit.register(client.close)
    web.extensions["worker"] = client

    @web.post("/reports/<int:user_id>")
    def request_report(user_id: int) -> dict[str, Any]:
        job_id = client.enqueue("render_report", user_id, unique_key=f"report:{user_id}")
        return {"job_id": job_id or client.unique_job_id(f"report:{user_id}"), "new": bool(job_id)}

    @web.get("/jobs/<job_id>")
    def job(job_id: str) -> dict[str, Any]:
        handle = client.job(job_id)
        status = handle.status()
        if status == JobStatus.not_found:
            abort(404)
        info = handle.info() if status == JobStatus.complete else None
        out: dict[str, Any] = {"job_id": job_id, "status": status.value}
        if info is not None:
            out["success"] = info.success
            out["result"] = info.result if info.success else repr(info.result)
        return out

    @web.get("/reports/<int:user_id>")
    def report(user_id: int) -> dict[str, Any]:
        with reports.database() as db:
            row = db.execute("SELECT body FROM reports WHERE user_id = ?", (user_id,)).fetchone()
        if row is None:
            abort(404)
        return {"user_id": user_id, "report": row[0]}

    return web
