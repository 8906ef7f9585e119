"""Start-up checks that turn an unusable environment into one line and exit code 2.

- :func:`~worker.storage.ready.wait_for_redis`: Redis answers within
  ``WORKER_REDIS_CONNECT_TIMEOUT_S``;
- :func:`check_redis_contract`: Redis must not evict keys (``maxmemory-policy noeviction``):
  an evicted lease is a second leader, an evicted job is a lost job; with a WAIT policy, the
  primary should have the replicas it waits for (a warning: one may be resyncing);
- :func:`check_app_identity`: no live instance of *another* app uses this key prefix (two
  apps on one prefix share a queue and a leader lock, and each runs the other's jobs as
  unknown functions);
- :func:`bind_health`: the health server's socket is bound before any component starts,
  so a configured port in use fails start-up instead of crash-looping the health component
  (the default port, taken locally by another worker, moves to a free one).
"""

from __future__ import annotations

import errno
import socket
from typing import Any

import structlog
from redis.exceptions import NoPermissionError, ResponseError

from worker.core.errors import ConfigError
from worker.core.redisurl import Replication
from worker.settings import Settings
from worker.storage import Store, server
from worker.storage import keys as K
from worker.storage.server import read_eviction_policy

#: The only ``maxmemory-policy`` under which no key is ever evicted.
NOEVICTION = "noeviction"
ALLOW_EVICTION = "WORKER_ALLOW_EVICTION"
_log = structlog.get_logger(__name__)


def eviction_verdict(policy: str | None, allow_eviction: bool) -> str:
    """One phrase for ``status``: what the policy means for this deployment."""
    if policy is None:
        return "unknown (not readable with these credentials)"
    if policy == NOEVICTION:
        return "ok"
    if allow_eviction:
        return f"eviction allowed by {ALLOW_EVICTION}"
    return f"VIOLATES the operating contract: workers refuse to start (needs {NOEVICTION!r})"


async def check_replicas(redis: Any, replication: Replication) -> list[str]:
    """With a WAIT policy, warn when the primary has fewer connected replicas than it asks
    for: every durable write (lease, ticks, enqueues) would fail until enough are back. An
    adaptive policy (``auto``) never fails that way; its first durable write says whether it
    runs degraded (:mod:`worker.core.durability`)."""
    if not replication.enabled or replication.adaptive:
        return []
    try:
        info = await server.replication_info(redis)
    except ResponseError as exc:
        return [f"cannot read INFO replication ({exc}); WORKER_REDIS_WAIT_REPLICAS unchecked"]
    have = int(info.get("connected_slaves", 0) or 0)
    if have >= replication.replicas:
        return []
    return [
        f"WORKER_REDIS_WAIT_REPLICAS={replication.replicas} but the primary has {have} "
        "connected replica(s): leadership, ticks and enqueues fail (NotReplicated) until "
        "enough replicas are back; set WORKER_REDIS_WAIT_REPLICAS=auto to go on without them"
    ]


async def check_redis_contract(
    redis: Any, settings: Settings, replication: Replication | None = None
) -> list[str]:
    """Check the server's eviction policy (and, with a WAIT policy, its replicas); return
    warnings to log.

    Raises :class:`ConfigError` when keys can be evicted, unless ``WORKER_ALLOW_EVICTION``.
    """
    warnings = await check_replicas(redis, replication) if replication is not None else []
    return warnings + await _check_eviction(redis, settings)


async def _check_eviction(redis: Any, settings: Settings) -> list[str]:
    policy, source = await read_eviction_policy(redis)
    if policy is None:
        return [
            f"cannot read Redis maxmemory-policy: {source}; make sure it is {NOEVICTION!r} "
            "(an evicted lease is a second leader, an evicted job is lost)"
        ]
    if policy == NOEVICTION:
        return []
    if not settings.allow_eviction:
        raise ConfigError(
            f"Redis maxmemory-policy is {policy!r}; the worker needs {NOEVICTION!r} (an evicted "
            "lease is a second leader, an evicted job is lost). "
            f"Set {ALLOW_EVICTION}=true to run anyway."
        )
    return [
        f"Redis maxmemory-policy is {policy!r}, not {NOEVICTION!r}: keys may be evicted (a "
        f"second leader, lost jobs); running anyway because {ALLOW_EVICTION}=true"
    ]


async def check_key_permissions(store: Store) -> None:
    """Refuse to start, with one line, when the Redis user may not read one of the app's key
    families (its prefix, arq's per-job keys of its job ids): an ACL user set up for another
    prefix, or with the per-job patterns missing (docs/guarantees.md, Redis operating contract).
    Called once per queue shard (``WORKER_QUEUE_SHARDS``): each shard's prefix is checked."""
    prefix = store.keys.prefix
    what = f"WORKER_KEY_PREFIX {prefix!r}"
    if "#" in prefix:  # a queue shard's prefix: the rules must cover the shards too
        what = f"WORKER_QUEUE_SHARDS: the queue shard {prefix!r}"
    probe = f"{prefix}acl-probe"
    for key in (probe, *(arq + probe for arq in (K.ARQ_JOB, K.ARQ_IN_PROGRESS, K.ARQ_RESULT))):
        try:
            await server.touch(store.redis, key)
        except NoPermissionError as exc:
            raise ConfigError(
                f"{what}: the Redis user may not use {key!r} "
                f"({exc}); give it the ACL rules of docs/guarantees.md (Redis operating contract) "
                "for this prefix"
            ) from None


async def check_app_identity(store: Store, app_name: str) -> None:
    """Refuse to start when live instances (heartbeat record not expired) of another app use
    this key prefix: :class:`ConfigError` naming the prefix, the other apps and this one.

    Instances of older versions (no app name in their record) are not counted. Two apps that
    start at the same instant can both pass; ``status`` shows every app on the prefix.
    """
    others = {name: n for name, n in (await store.live_apps()).items() if name != app_name}
    if not others:
        return
    users = ", ".join(f"app {name!r} ({n})" for name, n in sorted(others.items()))
    raise ConfigError(
        f"WORKER_KEY_PREFIX {store.keys.prefix!r} is in use by live instances of {users}; "
        f"this is app {app_name!r} — give each app its own WORKER_KEY_PREFIX"
    )


def bind_listeners(host: str, port: int, backlog: int = 128) -> list[socket.socket]:
    """Bind and listen on every address ``host`` resolves to; :class:`ConfigError` naming
    ``WORKER_HEALTH_HOST`` or ``WORKER_HEALTH_PORT`` if that is impossible."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        return _listen(host, port, backlog)
    except OSError as exc:
        raise ConfigError(_bind_error(where, exc)) from None


#: How many ports after a taken default port :func:`bind_health` tries.
FREE_PORT_TRIES = 20


def bind_health(
    host: str, port: int, *, strict: bool, backlog: int = 128
) -> tuple[list[socket.socket], int]:
    """Bind the health server's sockets; return them and the port.

    ``strict`` (the port was configured): a taken port is a :class:`ConfigError` (exit 2).
    Otherwise (the default port, a local run) the next free one of the following
    :data:`FREE_PORT_TRIES` is taken, so a second local process does not clash with the first.
    """
    try:
        return _listen(host, port, backlog), port
    except OSError as exc:
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if strict or exc.errno != errno.EADDRINUSE or not port:
            raise ConfigError(_bind_error(where, exc)) from None
        first = exc
    for candidate in range(port + 1, min(port + FREE_PORT_TRIES, 65535) + 1):
        try:
            return _listen(host, candidate, backlog), candidate
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise ConfigError(_bind_error(f"{host}:{candidate}", exc)) from None
    raise ConfigError(
        _bind_error(where, first) + f" (and the next {FREE_PORT_TRIES}); set WORKER_HEALTH_PORT"
    )


def _listen(host: str, port: int, backlog: int) -> list[socket.socket]:
    """Bind and listen on every address of ``host``; ``OSError`` (``socket.gaierror`` for an
    unknown host) when any fails, with every socket closed."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _, addr in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)
            sock.listen(backlog)
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks


def _bind_error(where: str, exc: OSError) -> str:
    if isinstance(exc, socket.gaierror):
        return f"WORKER_HEALTH_HOST: cannot listen on {where}: unknown host ({exc.strerror})"
    if exc.errno == errno.EADDRINUSE:
        return f"WORKER_HEALTH_PORT: cannot listen on {where}: address already in use"
    if exc.errno == errno.EACCES:
        return f"WORKER_HEALTH_PORT: cannot listen on {where}: permission denied"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"WORKER_HEALTH_HOST: cannot listen on {where}: not an address of this machine"
    return f"WORKER_HEALTH_HOST: cannot listen on {where}: {exc.strerror or exc}"
