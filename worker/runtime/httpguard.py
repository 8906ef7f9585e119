"""What the framework's HTTP listeners (the health server, the console) refuse at the door.

- **A Host they do not serve** (DNS rebinding: a page on ``evil.example`` whose name is made to
  resolve to 127.0.0.1 is same-origin with the attacker, so the browser lets it read the
  answers). A request is served when its ``Host`` is an IP literal (a rebinding needs a
  name), ``localhost`` or ``*.localhost`` (browsers resolve those themselves), the name the
  server was bound to, or a configured name (``WORKER_HEALTH_ALLOWED_HOSTS``,
  ``WORKER_WEB_ALLOWED_HOSTS``; ``*`` turns the check off). Anything else: 421, logged once
  per name.
- **A client that never finishes its request headers** (slowloris): closed
  :data:`HEADER_TIMEOUT_S` after it connected (the console: :data:`BROWSER_HEADER_TIMEOUT_S`).
  Each connection serves one request (``Connection: close``), so every request is under that
  deadline.
- **More than** :data:`MAX_CONNECTIONS` open connections per listener, so sockets cannot
  exhaust the process' file descriptors: at the limit, the oldest connection that has not
  sent its request yet makes room for the new one (a flood of slow clients churns among
  itself while a probe, which sends its request at once, is served); only when every
  connection is busy serving a request is the new one closed. Logged once a minute.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, cast

import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware

log = structlog.get_logger("worker.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


#: Seconds a client has, from connecting, to send its request headers.
HEADER_TIMEOUT_S = 5.0
#: The same for the console: a browser opens sockets ahead of need and may leave one unused
#: for up to 10 s (Chromium), which must not be cut just as it sends a request on it.
BROWSER_HEADER_TIMEOUT_S = 15.0
#: Open connections one listener accepts; beyond, a new connection is closed at once.
MAX_CONNECTIONS = 100
#: Distinct refused Host names remembered (each is logged once).
_MAX_REMEMBERED = 1000


def parse_hosts(raw: str | Iterable[str]) -> frozenset[str]:
    """``"a.example, b.example"`` -> the lower-case names (ports and trailing dots dropped)."""
    items = raw.split(",") if isinstance(raw, str) else raw
    return frozenset(n for n in (_name(i.strip()) for i in items) if n)


def _name(host: str) -> str:
    """The host part of a ``Host`` header: ``[::1]:80`` -> ``::1``, ``A.example.:80`` ->
    ``a.example``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    name, sep, port = host.rpartition(":")
    if sep and port.isdigit() and ":" not in name:
        host = name
    return host.rstrip(".")


def host_allowed(header: str | None, allowed: frozenset[str]) -> bool:
    """Whether a request with this ``Host`` header may be served (see module docstring)."""
    if header is None:
        return True  # HTTP/1.0 without Host: not a browser, so not a rebinding
    if "*" in allowed:
        return True
    name = _name(header)
    if not name:
        return False
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    return name == "localhost" or name.endswith(".localhost") or name in allowed


def allowed_hosts(configured: str, bound: str) -> frozenset[str]:
    """The configured names plus the name the listener was bound to (if it is a name)."""
    return parse_hosts(configured) | parse_hosts([bound])


def host_guard(allowed: frozenset[str], *, open_paths: Iterable[str] = ()) -> Middleware:
    """Middleware answering 421 to a request whose Host is not allowed (``open_paths``:
    exact paths served whatever the Host, e.g. probes whose bodies hold no data)."""
    exempt = frozenset(open_paths)
    refused: set[str] = set()

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        header = request.headers.get("Host")
        if request.path in exempt or host_allowed(header, allowed):
            return await handler(request)
        shown = "".join(c for c in (header or "") if c.isprintable())[:200]
        if shown not in refused and len(refused) < _MAX_REMEMBERED:
            refused.add(shown)
            log.warning(
                "request refused: unknown Host header (DNS rebinding?); list the names this "
                "server is reached by in the *_ALLOWED_HOSTS setting",
                host=shown,
                path=request.path,
                client=request.remote,
            )
        raise web.HTTPMisdirectedRequest(
            text=json.dumps({"error": f"this server does not serve Host {shown!r}"}),
            content_type="application/json",
        )

    return guard


@web.middleware
async def one_request(request: web.Request, handler: Handler) -> web.StreamResponse:
    """``Connection: close`` on every answer: each connection is under the header deadline."""
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        exc.force_close()
        raise
    response.force_close()
    return response


class _Limit:
    """Open connections of one listener, those still sending their headers (oldest first),
    and when a refusal was last logged."""

    def __init__(self, limit: int, header_timeout_s: float, what: str) -> None:
        self.limit = limit
        self.header_timeout_s = header_timeout_s
        self.what = what
        self.open = 0
        self.pending: dict[_Guarded, None] = {}  # insertion-ordered: the oldest first
        self.shed = 0
        self.timed_out = 0
        self._logged = 0.0

    def make_room(self) -> bool:
        """At the limit, close the oldest connection still sending its headers (a slow or
        idle client; a real one sends its headers at once) so a new one fits; ``False`` when
        every connection is serving a request."""
        if self.open < self.limit:
            return True
        if not self.pending:
            self._note()
            return False
        oldest = next(iter(self.pending))
        oldest.drop()
        self._note()
        return True

    def _note(self) -> None:
        self.shed += 1
        now = time.monotonic()
        if now - self._logged >= 60.0:
            self._logged = now
            log.warning(
                f"{self.what}: {self.limit} connections open; closing the oldest that has not "
                "sent its request (or the new one, if all are busy)",
                shed_total=self.shed,
            )


class _Guarded(asyncio.Protocol):
    """Wraps the aiohttp protocol of one connection: closes it when its request headers are
    not complete within the deadline, or when room is needed while they are not."""

    def __init__(self, make: Callable[[], asyncio.Protocol], limit: _Limit) -> None:
        self.make = make
        self.limit = limit
        self.inner: asyncio.Protocol | None = None  # made once the connection is admitted
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.tail = b""
        self.counted = False  # holds one of the limit's places

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        if not self.limit.make_room():
            self.transport.abort()
            return
        self.limit.open += 1
        self.counted = True
        self.limit.pending[self] = None
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.limit.header_timeout_s, self._too_slow)
        self.inner = self.make()
        self.inner.connection_made(transport)

    def _too_slow(self) -> None:
        self.timer = None
        self.limit.timed_out += 1
        self.drop()

    def drop(self) -> None:
        """Close the connection now (a FIN: a client sees it before it would reuse the
        socket); its place is free at once."""
        self._headers_done()
        self._release()
        if self.transport is not None:
            self.transport.close()

    def _release(self) -> None:
        if self.counted:
            self.counted = False
            self.limit.open -= 1

    def _headers_done(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.limit.pending.pop(self, None)

    def data_received(self, data: bytes) -> None:
        if self.inner is None:
            return
        if self.timer is not None:
            seen = self.tail + data
            if b"\r\n\r\n" in seen:
                self._headers_done()
            self.tail = seen[-3:]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_done()
        self._release()
        inner, self.inner = self.inner, None
        if inner is not None:
            inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()


class GuardedSite(web.SockSite):
    """A :class:`aiohttp.web.SockSite` whose connections are bounded in number and in the
    time to send their headers (see module docstring)."""

    def __init__(
        self,
        runner: web.BaseRunner,
        sock: Any,
        *,
        what: str,
        max_connections: int = MAX_CONNECTIONS,
        header_timeout_s: float = HEADER_TIMEOUT_S,
    ) -> None:
        super().__init__(runner, sock)
        self.limit = _Limit(max_connections, header_timeout_s, what)

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        server = self._runner.server
        assert server is not None
        limit = self.limit

        def factory() -> asyncio.Protocol:
            return _Guarded(server, limit)

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(factory, sock=self._sock, backlog=self._backlog)
