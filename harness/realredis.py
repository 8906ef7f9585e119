"""A real Redis-compatible server for tests: fixed TCP port, AOF on, restartable in place.

Wraps :class:`worker.runtime.embedded.EmbeddedServer`. The port and data directory stay the same
across
:meth:`RealRedis.restart`, so clients reconnect to the same URL and AOF data survives a stop or a
SIGKILL (``appendfsync always`` by default, so nothing acknowledged is lost).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import redis

from harness.ports import free_port
from worker.runtime.embedded import EmbeddedServer


class RealRedis:
    """One server process at ``redis://127.0.0.1:<port>/0`` with a data dir that outlives it."""

    def __init__(
        self,
        *,
        port: int | None = None,
        binary: str | None = None,
        extra_args: Sequence[str] = ("--appendfsync", "always"),
    ) -> None:
        self.port = port if port is not None else free_port()
        self.dir = tempfile.mkdtemp(prefix="worker-redis-test-", dir="/tmp")
        self._binary = binary
        self._extra_args = tuple(extra_args)
        self._server: EmbeddedServer | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._server.pid if self._server is not None else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    def start(self, timeout: float = 10.0) -> str:
        if self._server is None or not self._server.running:
            self._server = EmbeddedServer(
                binary=self._binary,
                port=self.port,
                unix_socket=False,
                appendonly=True,
                dir=self.dir,
                extra_args=self._extra_args,
            )
            self._server.start(timeout)
        return self.url

    def stop(self, timeout: float = 5.0) -> None:
        """Graceful shutdown (SIGTERM): the AOF is fsynced; the data dir stays."""
        if self._server is not None:
            self._server.stop(timeout)
            self._server = None

    def kill(self) -> None:
        """SIGKILL the server, as a crash would; the data dir stays."""
        if self._server is not None:
            self._server.kill()
            self._server = None

    def restart(self, down_for: float = 0.0, *, kill: bool = False) -> str:
        """Stop (or SIGKILL with ``kill=True``), stay down ``down_for`` seconds, start again."""
        if kill:
            self.kill()
        else:
            self.stop()
        if down_for > 0:
            time.sleep(down_for)
        return self.start()

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new sync client for this server (caller closes it)."""
        return redis.Redis.from_url(self.url, **kwargs)

    def flushall(self) -> None:
        with self.client() as c:
            c.flushall()

    def fresh_url(self) -> str:
        """Its URL, the server running (started again if a test stopped it) and emptied."""
        self.start()
        self.flushall()
        return self.url

    def close(self) -> None:
        """Stop the server and remove the data dir."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RealRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
