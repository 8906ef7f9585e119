"""The primary of a Sentinel set: redis-py's Sentinel pool, which also leaves a primary the
Sentinels no longer name while it still serves (a ``SENTINEL FAILOVER``), asked in the
background every :data:`MASTER_CHECK_S`; :func:`worker.storage.connection.connect_redis` makes
it for a ``redis+sentinel://`` URL."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.sentinel import MasterNotFoundError, SentinelConnectionPool
from redis.asyncio.sentinel import Sentinel as _RedisSentinel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["MASTER_CHECK_S", "Sentinel", "SentinelPool"]

#: How often a Sentinel pool asks the Sentinels who the primary is while its connections stay
#: up (a background question, never on a command's path).
MASTER_CHECK_S = 1.0


class Sentinel(_RedisSentinel):
    """Its "no primary found" says why each Sentinel could not be asked (redis-py 7+ keeps
    only ``network:ConnectionError``, not a TLS refusal's ``CERTIFICATE_VERIFY_FAILED``)."""

    async def discover_master(self, service_name: str) -> Any:
        try:
            return await super().discover_master(service_name)
        except MasterNotFoundError:
            why: dict[str, None] = {}
            for sentinel in self.sentinels:
                try:
                    await sentinel.ping()
                except (RedisConnectionError, RedisTimeoutError) as exc:
                    why[f"{type(exc).__name__}: {exc}"] = None
            if not why:
                raise
            text = f"No master found for {service_name!r}: {'; '.join(why)}"
            raise MasterNotFoundError(text) from None


class SentinelPool(SentinelConnectionPool):
    """redis-py's Sentinel pool, which asks the Sentinels for the primary on every new
    connection and drops a connection whose write a demoted primary refuses; this one also
    leaves a primary that was *deposed while it still serves*: a ``SENTINEL FAILOVER``, or
    Sentinels that lost sight of a primary the workers still reach. Such a primary takes writes
    until the Sentinels reconfigure it (10-20 s measured), and a replica still following it may
    confirm them; they are all lost. So every :data:`MASTER_CHECK_S` (in the background) the
    pool asks the Sentinels, and a connection to any other address is dropped when next taken
    from the pool; it reconnects to the primary named now. Closing the pool also closes its
    connections to the Sentinels."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._asked_at = float("-inf")
        self._asking: asyncio.Task[None] | None = None

    async def ensure_connection(self, connection: AbstractConnection) -> None:
        self._ask_sentinels()
        named = self.master_address
        if (
            named is not None
            and connection.is_connected
            and (getattr(connection, "host", None), getattr(connection, "port", None)) != named
        ):
            await connection.disconnect()  # to a deposed primary: connect to the named one
        await super().ensure_connection(connection)

    def _ask_sentinels(self) -> None:
        now = time.monotonic()
        if now - self._asked_at < MASTER_CHECK_S or (self._asking and not self._asking.done()):
            return
        self._asked_at = now
        self._asking = asyncio.get_running_loop().create_task(self._ask())

    async def _ask(self) -> None:
        """Ask the Sentinels in turn, each over a connection of its own closed right after
        (nothing outlives the question, even a cancelled one); the first answer counts. A new
        address drops the idle connections; no answer keeps the address known (the commands
        fail or succeed on their own)."""
        manager = self.sentinel_manager
        for known in list(manager.sentinels):
            where = known.connection_pool.connection_kwargs
            sentinel = Redis(host=where["host"], port=where["port"], **manager.sentinel_kwargs)
            try:
                addr = await sentinel.execute_command(  # type: ignore[no-untyped-call]
                    "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name
                )
            except Exception:  # this Sentinel cannot say: ask the next
                continue
            finally:
                with contextlib.suppress(Exception):
                    await sentinel.aclose()
            if not addr:
                continue
            host, port = (x.decode() if isinstance(x, bytes) else str(x) for x in addr)
            named = (host, int(port))
            if self.master_address is not None and named != self.master_address:
                self.master_address = named
                await super().disconnect(inuse_connections=False)  # idle ones, to the old
            return

    async def disconnect(self, inuse_connections: bool = True) -> None:
        if inuse_connections and self._asking is not None and not self._asking.done():
            self._asking.cancel()  # a full close: no question left running
            await asyncio.wait([self._asking])
        await super().disconnect(inuse_connections)
        if inuse_connections:  # a full close (not the idle sweep after a failover)
            for sentinel in self.sentinel_manager.sentinels:
                with contextlib.suppress(Exception):
                    await sentinel.aclose()
