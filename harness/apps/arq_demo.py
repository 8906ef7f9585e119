"""arq's README demo, as an arq user has it (``arq harness.apps.arq_demo.WorkerSettings`` runs it
on arq), with a cron job, made testable without the network: ``download_content`` "downloads"
through a session opened by ``startup`` and closed by ``shutdown``, which writes what it
fetched to a ledger in Redis instead of fetching it.

- ``arqdemo:downloads``: HINCRBY url 1 per run of ``download_content``;
- ``arqdemo:ticks``: HINCRBY job id 1 per run of the cron job ``heartbeat`` (every second);
- ``arqdemo:sessions``: HINCRBY ``opened`` / ``closed`` per process.

Nothing here imports the framework: ``python -m worker --arq-settings
harness.apps.arq_demo:WorkerSettings`` runs it as written.
"""

from __future__ import annotations

from typing import Any

from arq import cron
from arq.connections import ArqRedis


class Session:
    """Stands in for aiohttp's ClientSession: "fetches" by writing to the ledger."""

    def __init__(self, redis: ArqRedis) -> None:
        self.redis = redis
        self.closed = False

    async def get(self, url: str) -> str:
        assert not self.closed, "the session was closed"
        await self.redis.hincrby("arqdemo:downloads", url, 1)
        return f"<html>{url}</html>"

    async def close(self) -> None:
        self.closed = True
        await self.redis.hincrby("arqdemo:sessions", "closed", 1)


async def download_content(ctx: dict[str, Any], url: str) -> int:
    session: Session = ctx["session"]
    content = await session.get(url)
    return len(content)


async def heartbeat(ctx: dict[str, Any]) -> None:
    await ctx["redis"].hincrby("arqdemo:ticks", ctx["job_id"], 1)


async def startup(ctx: dict[str, Any]) -> None:
    ctx["session"] = Session(ctx["redis"])
    await ctx["redis"].hincrby("arqdemo:sessions", "opened", 1)


async def shutdown(ctx: dict[str, Any]) -> None:
    await ctx["session"].close()


# WorkerSettings defines the settings to use when creating the worker; it's used by the arq CLI.
# redis_settings is omitted: the default, or WORKER_REDIS_URL here.
class WorkerSettings:
    functions = [download_content]  # noqa: RUF012
    cron_jobs = [cron(heartbeat, second=set(range(60)))]  # noqa: RUF012
    on_startup = startup
    on_shutdown = shutdown
