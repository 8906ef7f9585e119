"""Clients for tests and benches: one :class:`worker.Client` call from synchronous code (a
sync test, a bench step), and the test apps' ledger client."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis

from worker.client import Client


def ledger_client(env_var: str) -> Callable[[], aioredis.Redis]:
    """A test app's ``ledger()``: this process's async client on the server the environment
    variable ``env_var`` names (a server the tests never fault), created on first use."""

    @functools.cache
    def ledger() -> aioredis.Redis:
        client: aioredis.Redis = aioredis.Redis.from_url(
            os.environ[env_var],
            socket_timeout=10,
            socket_connect_timeout=5,
            max_connections=2**31,  # uncapped, as in redis-py 5 (6+ caps at 100)
        )
        return client

    return ledger


def client_call(url: str, prefix: str, method: str, *args: Any, **kwargs: Any) -> Any:
    """Run one :class:`worker.Client` call on a fresh connection:
    ``client_call(url, prefix, "broadcast", "pricing", data)``, ``…, "enqueue", "task", 1)``."""

    async def call() -> Any:
        client = await Client.connect(url, key_prefix=prefix)
        try:
            return await getattr(client, method)(*args, **kwargs)
        finally:
            await client.close()

    return asyncio.run(call())
