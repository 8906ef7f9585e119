"""One :class:`worker.Client` call from synchronous code (a sync test, a bench step)."""

from __future__ import annotations

import asyncio
from typing import Any

from worker.client import Client


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
