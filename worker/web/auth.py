"""The console's guard: the token, same-origin actions, and the headers every response gets.

- The token travels only in a request header (``Authorization: Bearer <token>`` or
  ``X-Worker-Token``), never in a cookie or a URL: a page on another origin cannot make the
  browser attach it, so actions are safe from cross-site request forgery without a CSRF token.
  It is compared with :func:`hmac.compare_digest`.
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: Longest operator name kept (``X-Worker-Operator``).
MAX_NAME = 64

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


@dataclass(frozen=True)
class Guard:
    """``token``: the console's token (``None``: none configured, so no action is allowed);
    ``view_needs_token``: whether reading the API needs it too."""

    token: str | None
    view_needs_token: bool = True

    def valid(self, request: web.Request) -> bool:
        """Whether the request carries the token."""
        if self.token is None:
            return False
        given = request.headers.get("X-Worker-Token")
        auth = request.headers.get("Authorization", "")
        if given is None and auth[:7].lower() == "bearer ":
            given = auth[7:].strip()
        if not given:
            return False
        return hmac.compare_digest(given.encode(), self.token.encode())

    def check(self, request: web.Request) -> None:
        """Raise the HTTP error a request to the API deserves, if any."""
        action = request.method not in ("GET", "HEAD", "OPTIONS")
        if request.method == "OPTIONS":
            raise _error(web.HTTPMethodNotAllowed, "no cross-origin requests", method="OPTIONS")
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
    response.headers.update(HEADERS)
    if "/api/" in request.path:
        response.headers["Cache-Control"] = "no-store"
    if isinstance(response, web.HTTPException):
        raise response
    return response
