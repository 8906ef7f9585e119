"""What every admin command (``status``, ``dead``, ``doctor``, ``trigger``, ``pause``,
``resume``) settles first: which Redis and which app.

- **Redis**: ``WORKER_REDIS_URL`` (or ``--redis-url``, or ``WORKER_REDIS_URL_FILE``); without
  one, the private embedded server a local ``python -m worker`` started (it announces itself
  in this user's runtime directory, :mod:`worker.runtime.local`), said on stderr. Never a guess
  among
  several.
- **App**: ``--app`` / ``WORKER_APP`` when given (with a warning if the live instances run
  another app); otherwise the app the live instances run, rebuilt from the manifest they wrote
  (:mod:`worker.manifest`); with nothing running, the app that ran last. So a second terminal
  describes what is actually running, with nothing but the Redis URL.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from worker import arqcompat
from worker.app import App
from worker.core.errors import ConfigError
from worker.core.terminal import say
from worker.manifest import Described, describe
from worker.runtime import local
from worker.settings import Settings, mask_url
from worker.storage import Shards, Store, open_shards
from worker.storage import keys as K
from worker.storage.connection import connect_shards
from worker.storage.ready import auth_failure
from worker.storage.shards import shard_prefixes

_notes: list[str] = []


def note(message: str) -> None:
    """A line for the operator on stderr (stdout stays the command's output, e.g. JSON),
    printed by :func:`flush_notes` when the command has something to show: a command that
    fails prints its one error line only."""
    _notes.append(message)


def flush_notes() -> None:
    """Print the pending notes (which Redis, which app) on stderr."""
    for message in _notes:
        say(f"worker: {message}", file=sys.stderr)
    _notes.clear()


def redis_url(settings: Settings, what: str) -> str:
    """The Redis an admin command talks to: the configured URL, else the one local embedded
    server (announced by the ``python -m worker`` that started it)."""
    if settings.redis_url is not None:
        return settings.redis_url
    servers = local.discover("embedded")
    if not servers:
        raise ConfigError(
            f"WORKER_REDIS_URL is required for {what} (which Redis?): no local worker with an "
            "embedded server is running"
        )
    if len(servers) > 1:
        urls = ", ".join(f"{a.data.get('url')} (pid {a.pid})" for a in servers)
        raise ConfigError(
            f"WORKER_REDIS_URL is required for {what}: {len(servers)} local embedded servers "
            f"run, set it to one of {urls}"
        )
    found = servers[0]
    url = str(found.data["url"])
    note(f"using the embedded Redis of the local worker (pid {found.pid}): {url}")
    return url


@dataclass(frozen=True)
class Admin:
    """An open admin connection: the client, the key layout, the store."""

    redis: Redis
    keys: K.Keys
    store: Store
    url: str
    #: the app's queue shards (``WORKER_QUEUE_SHARDS``), home (:attr:`store`) first
    shards: Shards | None = None


@asynccontextmanager
async def connect(settings: Settings, what: str) -> AsyncIterator[Admin]:
    """A short-lived client for ``what``; Redis errors become one-line :class:`ConfigError`."""
    url = redis_url(settings, what)
    # the configured URL with its Sentinel credentials (redis+sentinel://, redis+cluster://)
    target = settings.redis_target() if url == settings.redis_url else url
    keys = K.Keys(settings.key_prefix)
    n, rep = settings.queue_shards, settings.replication()
    clients = connect_shards(
        target or url,
        shard_prefixes(keys.prefix, n),
        queue_name=keys.queue,
    )
    redis = clients[0]
    try:
        shards = Shards(open_shards(redis, keys, rep, n, clients))
        yield Admin(redis, keys, shards.home, url, shards)
    except (ConfigError, BrokenPipeError):  # BrokenPipeError: printing into a closed pipe
        raise
    except Exception as exc:
        raise ConfigError(
            auth_failure(url, exc)
            or f"{what}: cannot use Redis at {mask_url(url)}: {type(exc).__name__}: {exc}"
        ) from None
    finally:
        for c in {id(c): c for c in clients}.values():
            await c.aclose(close_connection_pool=True)


async def resolve_app(settings: Settings, store: Store) -> App:
    """The app to describe (see the module docstring); notes on stderr say which and why."""
    live = await store.live_apps()
    if "app" in settings.model_fields_set:  # --app, WORKER_APP or the config file named it
        app = arqcompat.load(settings.app)
        if live and app.name not in live:
            note(
                f"warning: --app {settings.app} is app {app.name!r}, but the live instances on "
                f"key prefix {store.keys.prefix!r} run {_names(live)}; describing {app.name!r} "
                "as asked"
            )
        return app
    manifests = await store.manifests()
    if live:
        name = max(live, key=lambda n: (live[n], n))
        if len(live) > 1:
            note(
                f"warning: live instances of several apps share key prefix "
                f"{store.keys.prefix!r}: {_names(live)}; describing {name!r} (--app to choose)"
            )
        if name in manifests:
            n = live[name]
            note(f"app {name!r}, as declared by its {_n(n, 'live instance')}")
            return describe(manifests[name]).app
        note(f"app {name!r} is running but wrote no manifest (an older version); pass --app")
        return App(name)
    readable = [d for d in map(_readable, manifests.values()) if d is not None]
    if readable:
        last = max(readable, key=lambda d: (d.written_ms, d.app.name))
        note(
            f"no live instances; app {last.app.name!r} as it last ran on key prefix "
            f"{store.keys.prefix!r} (--app to choose)"
        )
        return last.app
    note(
        f"no live instances and no app recorded on key prefix {store.keys.prefix!r}; "
        "showing what Redis holds (--app to describe an app's jobs)"
    )
    return App("?")


def _readable(data: dict[str, Any]) -> Described | None:
    try:
        return describe(data)
    except ConfigError:
        return None


def _n(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _names(counts: dict[str, int]) -> str:
    return ", ".join(f"{name!r} ({n})" for name, n in sorted(counts.items()))
