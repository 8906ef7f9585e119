"""The console's guard: the token, same-origin actions, and the headers every response gets.

- The token travels only in a request header (``Authorization: Bearer <token>`` or
  ``X-Worker-Token``), never in a cookie or a URL: a page on another origin cannot make the
  browser attach it, so actions are safe from cross-site request forgery without a CSRF token.
  It is compared with :func:`hmac.compare_digest`, as bytes (a header that is not UTF-8 is
  just a wrong token: 401).
- The token is compared first, and a request with the right one is never held off. Wrong
  tokens draw on one budget for the whole console, whatever address they come from
  (:class:`Failures`: a burst of :data:`MAX_FAILURES`, then :data:`FAILURES_PER_S` a second):
  within it a wrong token is a 401 and a log line (client address and path, never the
  token); beyond it a 429 (``Retry-After``) and one line a minute with the count. Keying on
  the address held every operator behind one ingress or ``kubectl port-forward`` off with the
  guesser, and let a guesser rotating addresses through. A 429 still tells a guesser the guess
  was wrong (the right token would have passed): what makes guessing hopeless is the token
  (at least 16 characters; a generated one has 256 bits); the budget keeps the log and the
  work per guess bounded and shows the attempt.
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import structlog
from aiohttp import web

log = structlog.get_logger("worker.web")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: Longest operator name kept (``X-Worker-Operator``).
MAX_NAME = 64
#: Wrong tokens answered (401, logged) in a burst, from any address together...
MAX_FAILURES = 10
#: ...and per second after it; the rest get 429.
FAILURES_PER_S = 1.0
#: Seconds between the lines that count the wrong tokens answered 429.
HELD_LOG_EVERY_S = 60.0

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
    """The console's budget of wrong tokens, one for every address: a bucket of
    :data:`MAX_FAILURES` refilled at :data:`FAILURES_PER_S`."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        burst: int = MAX_FAILURES,
        per_s: float = FAILURES_PER_S,
    ) -> None:
        self.clock = clock
        self.burst = burst
        self.per_s = per_s
        self._level = float(burst)
        self._at = clock()
        #: wrong tokens answered 429 since the last line that counted them
        self.held = 0
        self._held_logged = -math.inf

    def take(self) -> float | None:
        """Spend one wrong token: ``None`` when within the budget, else the seconds until the
        next one would be."""
        now = self.clock()
        self._level = min(float(self.burst), self._level + (now - self._at) * self.per_s)
        self._at = now
        if self._level >= 1.0:
            self._level -= 1.0
            return None
        self.held += 1
        return (1.0 - self._level) / self.per_s

    def held_line_due(self) -> bool:
        """Whether to log the count of held-off wrong tokens now (once a
        :data:`HELD_LOG_EVERY_S`)."""
        now = self.clock()
        if now - self._held_logged < HELD_LOG_EVERY_S:
            return False
        self._held_logged = now
        return True


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
        presented = self.presented(request)  # first: the right token is never held off
        if presented == "wrong" and self.token is not None and (action or self.view_needs_token):
            self._wrong(request)
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
            if presented != "right":
                raise _error(web.HTTPUnauthorized, "this action needs the console's token")
        elif self.view_needs_token and presented != "right":
            raise _error(web.HTTPUnauthorized, "the console needs its token")

    def _wrong(self, request: web.Request) -> None:
        """Spend a wrong token: logged within the budget (the caller answers 401), 429 beyond."""
        wait = self.failures.take()
        if wait is None:
            log.warning(
                "console token refused",
                client=request.remote or "?",
                method=request.method,
                path=request.path,
            )
            return
        if self.failures.held_line_due():
            log.warning(
                "console token refused: more wrong tokens than the console answers "
                f"({MAX_FAILURES} at once, {FAILURES_PER_S:g} a second, from any address); "
                "the rest get 429 (the right token still passes)",
                held=self.failures.held,
                client=request.remote or "?",
            )
            self.failures.held = 0
        raise _too_many(wait)


def _too_many(wait: float) -> web.HTTPTooManyRequests:
    wait = max(1, math.ceil(wait))
    return web.HTTPTooManyRequests(
        text=f'{{"error": "too many wrong tokens; retry in {wait:.0f} s"}}',
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
