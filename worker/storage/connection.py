"""Connections to Redis: one URL parser and one factory for a single server, a Sentinel-managed
primary, or the node of a Redis Cluster that serves the app's hash slot.

Every connection the framework opens (lease, consumer, broadcast listener, client, command
line, ``Client.from_env``) is made by :func:`connect_redis` from a :class:`RedisTarget`, the
parsed ``WORKER_REDIS_URL``:

- ``redis://``, ``rediss://``, ``unix://`` — one server (redis-py's own URL parsing);
- ``redis+sentinel://[user:password@]host1:26379,host2:26379/<master name>[/<db>]`` (and
  ``rediss+sentinel://`` for TLS) — the primary a set of Sentinels names. The user and password
  in the URL are the data nodes' (ACL); the Sentinels' own credentials come from
  ``?sentinel_username=…&sentinel_password=…`` or ``WORKER_SENTINEL_USERNAME`` /
  ``WORKER_SENTINEL_PASSWORD``. The pool asks the Sentinels for the primary on every new
  connection and every second, and drops connections to one they no longer name, so after a
  failover every process finds the new primary by itself;
- ``redis+cluster://[user:password@]host1:7000,host2:7001`` (``rediss+cluster://``) — Redis
  Cluster. Every key of one app lives in one hash slot (a hash-tagged ``WORKER_KEY_PREFIX``
  such as ``{shop}:``), so the app talks to the one primary that serves that slot, over plain
  connections: transactions, scripts, pub/sub and blocking reads work as on a single server.
  Each new connection asks the cluster (``CLUSTER SLOTS``) who serves the slot; a ``MOVED``
  for the app's slot (failover, resharding) drops the connection and the next one asks again.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.connection import Connection, SSLConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from worker.core.redisurl import DISCOVERY_TIMEOUT_S, RedisTarget, parse_redis_url
from worker.storage import resharding
from worker.storage.packing import Packing, packing
from worker.storage.sentinel import Sentinel, SentinelPool

__all__ = ["SlotPool", "connect_redis", "connect_shards"]

# -- connection pools -----------------------------------------------------------------------


class _SlotConnection(Packing, Connection):
    """A connection to whichever cluster primary serves the pool's hash slot, asked anew on
    every (re)connect. It remembers the commands whose replies it has not read yet, so that
    one redirected by a migration of the slot (``ASK``, ``TRYAGAIN``, ``MOVED``) is sent again
    in place (:mod:`worker.storage.resharding`); after a ``MOVED`` it reconnects at its next use."""

    def __init__(self, **kwargs: Any) -> None:
        self.slot_pool: SlotPool = kwargs.pop("slot_pool")
        super().__init__(**kwargs)
        #: (command, inside MULTI) per reply not read yet
        self._unread: deque[tuple[tuple[Any, ...], bool]] = deque()
        self._multi = False
        self._moved = False
        self._connecting = False

    async def connect(self) -> None:
        await self._to_owner(super().connect)

    async def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        """redis-py 6+ connects through this (``send_packed_command`` calls it, not
        :meth:`connect`): it too asks who serves the slot first."""
        base = super().connect_check_health
        await self._to_owner(lambda: base(*args, **kwargs))

    async def _to_owner(self, connect: Callable[[], Awaitable[Any]]) -> None:
        """``connect()`` to the primary serving the slot, asked anew; the handshake's
        replies are its own (the commands not yet answered wait for theirs)."""
        if self.is_connected or self._connecting:  # redis-py 6+: connect() nests the other
            await connect()
            return
        self._connecting = True
        pending, self._unread = self._unread, deque()
        try:
            self.host, self.port = await self.slot_pool.owner()
            await connect()
        finally:
            self._unread = pending
            self._connecting = False

    async def disconnect(self, *args: Any, **kwargs: Any) -> None:  # redis-py 7+ adds error=
        self._unread.clear()
        self._multi = self._moved = False
        await super().disconnect(*args, **kwargs)

    def pack_command(self, *args: Any) -> list[bytes]:
        name = str(args[0]).upper() if args else ""
        if name == "MULTI":
            self._multi = True
        self._unread.append((args, self._multi))
        if name in ("EXEC", "DISCARD"):
            self._multi = False
        return super().pack_command(*args)

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if self._moved:  # the slot has a new owner: connect to it
            pending = self._unread
            await self.disconnect()
            self._unread = pending
        await super().send_packed_command(command, check_health)

    async def read_response(
        self,
        disable_decoding: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 - redis-py's signature
        *,
        disconnect_on_error: bool = True,
        push_request: bool | None = False,
    ) -> Any:
        try:
            reply = await super().read_response(
                disable_decoding=disable_decoding,
                timeout=timeout,
                disconnect_on_error=disconnect_on_error,
                push_request=push_request,
            )
        except ResponseError as exc:
            sent = self._unread.popleft() if self._unread and timeout is None else None
            return await self.slot_pool.explain(self, exc, sent, disable_decoding)
        if timeout is not None:  # a pub/sub read: no command of it is ever sent again
            self._unread.clear()
        elif self._unread:
            self._unread.popleft()
        return reply


class _SlotSSLConnection(_SlotConnection, SSLConnection):
    pass


class SlotPool(ConnectionPool):
    """Connections to the primary serving one hash slot of a Redis Cluster (see module doc)."""

    def __init__(
        self,
        seeds: Sequence[tuple[str, int]],
        slot: int,
        *,
        seed_kwargs: dict[str, Any],
        ssl: bool = False,
        **kwargs: Any,
    ) -> None:
        kwargs["connection_class"] = _SlotSSLConnection if ssl else _SlotConnection
        super().__init__(**kwargs)
        self.connection_kwargs["slot_pool"] = weakref.proxy(self)
        self.slot = slot
        self.seeds = list(dict.fromkeys(seeds))
        self.known: list[tuple[str, int]] = list(self.seeds)
        self.seed_kwargs = seed_kwargs
        self.address: tuple[str, int] | None = None
        self.detour = resharding.Detour(slot, self.connection_kwargs, ssl)

    async def owner(self) -> tuple[str, int]:
        """The address of the primary serving :attr:`slot`, asked of the nodes in turn."""
        errors = []
        for host, port in list(self.known):
            node = Redis(host=host, port=port, **self.seed_kwargs)
            try:
                layout = await node.execute_command("CLUSTER SLOTS")  # type: ignore[no-untyped-call]
            except Exception as exc:
                errors.append(f"{host}:{port}: {type(exc).__name__}: {exc}")
                continue
            finally:
                with contextlib.suppress(Exception):
                    await node.aclose()
            found = self._learn(layout, host)
            if found is not None:
                if self.address != found:
                    self.address = found
                    await self.disconnect(inuse_connections=False)  # idle ones to the old owner
                return found
            errors.append(f"{host}:{port}: slot {self.slot} not served")
        raise RedisConnectionError(
            f"no cluster node names the primary of slot {self.slot} ({'; '.join(errors)})"
        )

    def _learn(self, layout: Any, asked: str) -> tuple[str, int] | None:
        found = None
        for entry in layout or []:
            start, end, *nodes = entry
            for i, node in enumerate(nodes):
                host = node[0].decode() if isinstance(node[0], bytes) else str(node[0])
                address = (host or asked, int(node[1]))
                if address not in self.known:
                    self.known.append(address)
                if i == 0 and int(start) <= self.slot <= int(end):
                    found = address
        return found

    async def _now(self) -> tuple[str, int]:
        return self.address or await self.owner()

    async def explain(
        self,
        conn: _SlotConnection,
        exc: ResponseError,
        sent: tuple[tuple[Any, ...], bool] | None,
        raw: bool,
    ) -> Any:
        """The reply of a command the server answered with ``exc``: a redirection about this
        pool's slot sends the command again (:class:`worker.storage.resharding.Detour`) unless it
        was
        inside a transaction; anything else is raised as it came."""
        text = resharding.error_text(exc)
        kind = resharding.redirection(text, self.slot)
        if kind == "MOVED":
            self.address = None  # the next connection asks who serves the slot now
            conn._moved = True
        if kind is not None and sent is not None and not sent[1]:
            return await self.detour.resend(text, sent[0], self._now, asked=str(conn.host), raw=raw)
        head = text.split(" ", 1)[0]
        if head in ("MOVED", "ASK") and kind is None:
            raise ResponseError(
                f"{text}: a key outside the app's hash slot {self.slot}; in Redis Cluster every "
                "key must carry the hash tag of WORKER_KEY_PREFIX"
            )
        if kind in ("MOVED", "ASK", "TRYAGAIN") or head == "CLUSTERDOWN":
            await conn.disconnect()
            raise RedisConnectionError(text)
        raise exc

    async def disconnect(self, inuse_connections: bool = True) -> None:
        await super().disconnect(inuse_connections)
        if inuse_connections:
            await self.detour.close()


#: ``max_connections`` of a pool without a cap (redis-py 5's own default).
UNCAPPED = 2**31


def connect_redis(
    target: RedisTarget | str,
    *,
    queue_name: str,
    socket_timeout_s: float | None = 10.0,
    max_connections: int | None = None,
    client_name: str | None = None,
) -> Redis:
    """A ``redis.asyncio.Redis`` for ``target``: a single server, the primary of a Sentinel
    set, or the cluster primary serving ``queue_name``'s hash slot (every key of an app shares
    it). ``client_name`` shows in ``CLIENT LIST``."""
    if isinstance(target, str):
        target = parse_redis_url(target)
    common: dict[str, Any] = {
        "socket_connect_timeout": 5,
        "socket_timeout": socket_timeout_s,
        "health_check_interval": 30,
        # None: not capped, on every redis-py (6 and later cap an async pool at 100 by default)
        "max_connections": UNCAPPED if max_connections is None else max_connections,
    }
    if not target.url.startswith("unix:"):
        common["socket_keepalive"] = True
    if client_name:
        common["client_name"] = client_name
    pool: ConnectionPool
    if target.kind == "single":
        tls_single = {"ssl_check_hostname": target.check_hostname} if target.ssl else {}
        pool = ConnectionPool.from_url(target.url, **common, **tls_single)
    else:
        auth = {"username": target.username, "password": target.password}
        tls: dict[str, Any] = dict(target.ssl_options)
        if target.ssl:
            tls["ssl_check_hostname"] = target.check_hostname
        discovery = {
            "socket_connect_timeout": DISCOVERY_TIMEOUT_S,
            "socket_timeout": DISCOVERY_TIMEOUT_S,
            # no retries (redis-py 6+ retries 3 times with backoff by default): the next node
            # or Sentinel is the retry, and a dead one first in the list must cost one refusal
            "retry": Retry(NoBackoff(), 0),
            **({"ssl": True, **tls} if target.ssl else {}),
        }
        if target.kind == "sentinel":
            creds = {"username": target.sentinel_username, "password": target.sentinel_password}
            manager = Sentinel(  # type: ignore[no-untyped-call]
                list(target.nodes), sentinel_kwargs={**discovery, **creds}
            )
            pool = SentinelPool(
                target.service, manager, db=target.db, is_master=True, ssl=target.ssl,
                **auth, **tls, **common,
            )  # fmt: skip
        else:
            slot = key_slot(queue_name.encode())
            pool = SlotPool(
                target.nodes, slot, seed_kwargs={**discovery, **auth}, ssl=target.ssl,
                **auth, **tls, **common,
            )  # fmt: skip
    pool.connection_class = packing(pool.connection_class)
    return Redis(connection_pool=pool)


def connect_shards(
    target: RedisTarget | str,
    prefixes: Sequence[str],
    *,
    queue_name: str,
    **kwargs: Any,
) -> tuple[Redis, ...]:
    """One client per queue shard (``WORKER_QUEUE_SHARDS``; ``prefixes`` home first, as
    :func:`worker.storage.shards.shard_prefixes` gives them): on Redis Cluster each shard's
    own client to the primary serving its slot (the home one for ``queue_name``, the app's
    default queue); on one server or a Sentinel primary the same client for every shard."""
    if isinstance(target, str):
        target = parse_redis_url(target)
    home = connect_redis(target, queue_name=queue_name, **kwargs)
    if target.kind != "cluster" or len(prefixes) == 1:
        return (home,) * len(prefixes)
    tail = queue_name[len(prefixes[0]) :]  # "queue": every shard's default queue
    rest = (connect_redis(target, queue_name=p + tail, **kwargs) for p in prefixes[1:])
    return (home, *rest)
