"""The console's guard: the token, same-origin actions, and the headers every response gets.

- The token travels only in a request header (``Authorization: Bearer <token>`` or
  ``X-Worker-Token``), never in a cookie or a URL: a page on another origin cannot make the
  browser attach it, so actions are safe from cross-site request forgery without a CSRF token.
  It is compared with :func:`hmac.compare_digest`, as bytes (a header that is not UTF-8 is
  just a wrong token: 401).
- A wrong token is logged (client address and path, never the token) and counted per client
  address: after :data:`MAX_FAILURES` within :data:`FAILURE_WINDOW_S` seconds that client gets
  429 (``Retry-After``) for every API request, right token or not, until the window moves on;
  guessing is held to that rate.
- Every action (a POST) needs the token, whatever ``WORKER_WEB_AUTH`` says; viewing (the JSON
  API) needs it unless viewing was opened explicitly. The page itself (HTML, script, style)
  holds no data and is served to anyone; it asks for the token.
- An action must be JSON (``Content-Type: application/json``, which a cross-origin form cannot
  send without a CORS preflight this server never grants) and, when the browser says where it
  comes from (``Origin``, ``Sec-Fetch-Site``), come from the console's own origin.
- Every response forbids framing and sniffing and allows scripts and styles only from the
  console itself (no inline script: data can never become code).
"""

from __future__ import annotations

import hmac
import math
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import structlog
from aiohttp import web

log = structlog.get_logger("worker.web")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: Longest operator name kept (``X-Worker-Operator``).
MAX_NAME = 64
#: Wrong tokens one client address may present per :data:`FAILURE_WINDOW_S` seconds.
MAX_FAILURES = 10
FAILURE_WINDOW_S = 60.0
#: Client addresses whose failures are remembered (the oldest is forgotten first).
MAX_CLIENTS = 10_000

HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}


class Failures:
    """Wrong tokens per client address over the last :data:`FAILURE_WINDOW_S` seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, client: str) -> deque[float]:
        times = self._seen.get(client)
        if times is None:
            return deque()
        horizon = self.clock() - FAILURE_WINDOW_S
        while times and times[0] <= horizon:
            times.popleft()
        if not times:
            del self._seen[client]
        return times

    def retry_after(self, client: str) -> float | None:
        """Seconds until ``client`` may try again, or ``None`` if it may now."""
        times = self._recent(client)
        if len(times) < MAX_FAILURES:
            return None
        return max(1.0, times[-MAX_FAILURES] + FAILURE_WINDOW_S - self.clock())

    def add(self, client: str) -> int:
        """Count one wrong token from ``client``; the failures in the window."""
        times = self._recent(client)
        times.append(self.clock())
        self._seen[client] = times
        self._seen.move_to_end(client)
        while len(self._seen) > MAX_CLIENTS:
            self._seen.popitem(last=False)
        return len(times)


@dataclass(frozen=True)
class Guard:
    """``token``: the console's token (``None``: none configured, so no action is allowed);
    ``view_needs_token``: whether reading the API needs it too."""

    token: str | None
    view_needs_token: bool = True
    failures: Failures = field(default_factory=Failures, compare=False)

    def presented(self, request: web.Request) -> Literal["none", "right", "wrong"]:
        """Whether the request carries no token, the token, or another one."""
        given = request.headers.get("X-Worker-Token")
        auth = request.headers.get("Authorization", "")
        if given is None and auth[:7].lower() == "bearer ":
            given = auth[7:].strip()
        if not given:
            return "none"
        if self.token is None:
            return "wrong"
        # aiohttp hands bytes that are not UTF-8 over as surrogates: compare the raw bytes
        raw = given.encode("utf-8", "surrogateescape")
        return "right" if hmac.compare_digest(raw, self.token.encode()) else "wrong"

    def valid(self, request: web.Request) -> bool:
        """Whether the request carries the token."""
        return self.token is not None and self.presented(request) == "right"

    def check(self, request: web.Request) -> None:
        """Raise the HTTP error a request to the API deserves, if any."""
        action = request.method not in ("GET", "HEAD", "OPTIONS")
        if request.method == "OPTIONS":
            raise _error(web.HTTPMethodNotAllowed, "no cross-origin requests", method="OPTIONS")
        if action or self.view_needs_token:
            self._throttle(request)
        if action:
            if self.token is None:
                raise _error(
                    web.HTTPForbidden,
                    "actions are disabled: the console runs without WORKER_WEB_TOKEN",
                )
            if not _same_origin(request):
                raise _error(web.HTTPForbidden, "cross-origin request refused")
            if request.content_type != "application/json":
                raise _error(web.HTTPUnsupportedMediaType, "actions take application/json")
            if not self.valid(request):
                raise _error(web.HTTPUnauthorized, "this action needs the console's token")
        elif self.view_needs_token and not self.valid(request):
            raise _error(web.HTTPUnauthorized, "the console needs its token")

    def _throttle(self, request: web.Request) -> None:
        """429 for a client over its wrong-token budget; counts and logs a wrong token."""
        client = request.remote or "?"
        wait = self.failures.retry_after(client)
        if wait is not None:
            raise _too_many(wait)
        if self.token is None or self.presented(request) != "wrong":
            return
        n = self.failures.add(client)
        log.warning(
            "console token refused"
            if n < MAX_FAILURES
            else f"console token refused; client held off for {FAILURE_WINDOW_S:.0f} s",
            client=client,
            method=request.method,
            path=request.path,
            failures=n,
            window_s=FAILURE_WINDOW_S,
        )


def _too_many(wait: float) -> web.HTTPTooManyRequests:
    wait = math.ceil(wait)
    return web.HTTPTooManyRequests(
        text=f'{{"error": "too many wrong tokens from this address; retry in {wait:.0f} s"}}',
        content_type="application/json",
        headers={"Retry-After": str(wait)},
    )


def operator(request: web.Request) -> str:
    """Who the operator says they are (``X-Worker-Operator``), printable and short."""
    name = request.headers.get("X-Worker-Operator", "")
    clean = "".join(ch for ch in name if ch.isprintable()).strip()[:MAX_NAME]
    return clean or "anonymous"


def _same_origin(request: web.Request) -> bool:
    """False when the browser says the request comes from another site or origin."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("Origin")
    if origin is None:
        return True  # not a browser, or a same-origin GET-like request: the token decides
    host = request.headers.get("Host", "")
    return origin in (f"http://{host}", f"https://{host}")


def _error(
    kind: type[web.HTTPException], message: str, method: str | None = None
) -> web.HTTPException:
    body = f'{{"error": "{message}"}}'
    if kind is web.HTTPMethodNotAllowed:
        return web.HTTPMethodNotAllowed(
            method or "", ["GET", "POST"], text=body, content_type="application/json"
        )
    return kind(text=body, content_type="application/json")


@web.middleware
async def secure_headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Adds :data:`HEADERS` to every response (errors included); API answers are not cached."""
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        response = exc
    except Exception as exc:  # a bug must not answer a traceback without the headers
        log.error("console request failed", path=request.path, error=type(exc).__name__)
        response = web.HTTPInternalServerError(
            text='{"error": "internal error (logged)"}', content_type="application/json"
        )
    response.headers.update(HEADERS)
    if "/api/" in request.path:
        response.headers["Cache-Control"] = "no-store"
    if isinstance(response, web.HTTPException):
        raise response
    return response
