"""The web side of the example: a FastAPI app that enqueues work and reads job results.

No background work runs in this process. Its lifespan only opens and closes a
:class:`worker.Client` (``Client.from_env``: the same ``WORKER_*`` settings as the workers), so
``uvicorn --workers 4`` and any number of API replicas are safe: crons, pollers and jobs run in
``python -m worker run --role leader|consumer`` processes from the same image.

    PYTHONPATH=examples/fastapi WORKER_REDIS_URL=redis://localhost:6379/0 \\
        uvicorn api:api --port 8000 --workers 4
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import jobs
from fastapi import Depends, FastAPI, HTTPException, Request

from worker import Client, JobStatus


@asynccontextmanager
async def lifespan(api: FastAPI) -> AsyncIterator[None]:
    # One client per API process. No crons, no pollers here: the leader runs those.
    api.state.client = await Client.from_env(app=jobs.app)
    try:
        yield
    finally:
        await api.state.client.close()


api = FastAPI(title="worker example: shop", lifespan=lifespan)


def get_client(request: Request) -> Client:
    client: Client = request.app.state.client
    return client


WorkerClient = Annotated[Client, Depends(get_client)]


def _key(client: Client, name: str) -> str:
    return jobs.shop_key(client.keys.prefix, name)


@api.get("/healthz")
async def healthz(client: WorkerClient) -> dict[str, bool]:
    await client.redis.ping()
    return {"ok": True}


@api.post("/orders/{order_id}/receipt")
async def send_receipt(order_id: int, client: WorkerClient) -> dict[str, Any]:
    """Enqueue a job: every call is a new job."""
    job_id = await client.enqueue("send_receipt", order_id)
    return {"job_id": job_id}


@api.post("/packages/{package_id}/activate")
async def activate(package_id: str, client: WorkerClient) -> dict[str, Any]:
    """Enqueue with a ``unique_key``: while the job is queued, running or its result is kept,
    calling again enqueues nothing and answers the same job id."""
    key = f"activate:{package_id}"
    job_id = await client.enqueue("activate", package_id, unique_key=key)
    return {"job_id": client.unique_job_id(key), "enqueued": job_id is not None}


@api.get("/packages/{package_id}")
async def package(package_id: str, client: WorkerClient) -> dict[str, Any]:
    count = await client.redis.hget(_key(client, "activations"), package_id)
    return {"package_id": package_id, "activations": int(count or 0)}


@api.post("/cards/{card_id}/poll")
async def schedule_poll(card_id: str, client: WorkerClient, delay: float = 0.0) -> dict[str, Any]:
    """Schedule a poll item: the leader dispatches it as a ``poll_card`` job when due."""
    await client.poller("cards").schedule(card_id, delay=delay)
    return {"card_id": card_id, "due_in_s": delay}


@api.get("/cards/{card_id}")
async def card(card_id: str, client: WorkerClient) -> dict[str, Any]:
    polls = await client.redis.hget(_key(client, "polls"), card_id)
    last = await client.redis.hget(_key(client, "last-poll"), card_id)
    return {
        "card_id": card_id,
        "polls": int(polls or 0),
        "last_polled": last.decode() if last else None,
    }


@api.get("/jobs/{job_id}")
async def job_status(job_id: str, client: WorkerClient) -> dict[str, Any]:
    """A job's status and, once complete, its result (arq's ``Job``)."""
    job = client.job(job_id)
    status = await job.status()
    if status is JobStatus.not_found:
        raise HTTPException(404, f"no job {job_id!r} (never enqueued, or its result expired)")
    out: dict[str, Any] = {"job_id": job_id, "status": status.value}
    info = await job.result_info()
    if info is not None:
        out["success"] = info.success
        out["result"] = info.result if info.success else repr(info.result)
        out["finished_at"] = info.finish_time.isoformat()
    return out


@api.get("/stats")
async def stats(client: WorkerClient) -> dict[str, Any]:
    """Ticks of the periodic job ``expire_orders`` and how often each ran (always 1)."""
    ticks = await client.redis.hgetall(_key(client, "expire-ticks"))
    runs = [int(v) for v in ticks.values()]
    return {"expire_orders_ticks": len(runs), "max_runs_per_tick": max(runs, default=0)}
