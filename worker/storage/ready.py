"""Waiting for Redis: ping until it answers, one line for refused credentials or a
certificate refused for its name, and a clear error naming the (masked) URL after the
timeout. The client and the worker process both wait through here before their first
command."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

import structlog
from redis.exceptions import AuthenticationError

from worker.core.clock import Clock
from worker.core.errors import ConfigError
from worker.core.redisurl import mask_url
from worker.storage import server

_log = structlog.get_logger(__name__)


async def wait_for_redis(redis: Any, url: str, timeout_s: float, clock: Clock) -> None:
    """Ping until Redis answers; :class:`ConfigError` naming the URL (masked) after
    ``timeout_s`` (a worker started before its Redis waits, a wrong URL fails start-up).

    Refused credentials fail at once (waiting does not fix a password). While Redis does not
    answer, one warning line per retry says so, at most one a second."""
    deadline = clock.monotonic() + timeout_s
    said = -1.0
    while True:
        try:
            # an attempt may take what is left (at least 5 s): a slow link's handshake (redis-py
            # 8 sends HELLO, CLIENT SETNAME and SETINFO, a health PING, then ours) may need it
            await server.ping(redis, max(5.0, deadline - clock.monotonic()))
            return
        except Exception as exc:
            auth = auth_failure(url, exc)
            if auth is not None:
                raise ConfigError(auth) from None
            now = clock.monotonic()
            if now >= deadline:
                raise ConfigError(
                    f"WORKER_REDIS_URL: cannot reach Redis at {mask_url(url)} within "
                    f"{timeout_s:g}s ({type(exc).__name__}: {exc}){_tls_hint(exc)}"
                ) from None
            if said < 0 or now - said >= 1.0:
                said = now
                _log.warning(
                    "Redis not reachable; retrying",
                    url=mask_url(url),
                    error=f"{type(exc).__name__}: {' '.join(str(exc).split())}",
                    gives_up_in_s=round(deadline - now),  # WORKER_REDIS_CONNECT_TIMEOUT_S
                )
            await clock.sleep(0.5)


def auth_failure(url: str, exc: BaseException) -> str | None:
    """The one line for credentials Redis refused (a wrong password, an unknown or disabled
    ACL user, a password required but not given), else ``None``."""
    text = str(exc)
    if not isinstance(exc, AuthenticationError) and not text.startswith(("WRONGPASS", "NOAUTH")):
        return None
    user = unquote(urlsplit(url).username or "") or "default"
    return (
        f"WORKER_REDIS_URL: authentication failed for user {user!r} at {mask_url(url)} "
        f"({' '.join(text.split())}); check the URL's user and password (or the ACL user)"
    )


def _tls_hint(exc: BaseException) -> str:
    """What to do about a certificate refused for its name (TLS URLs check it by default)."""
    text = str(exc)
    if "CERTIFICATE_VERIFY_FAILED" in text and "mismatch" in text:
        return (
            "; the server's certificate does not name the host in the URL: connect by a name "
            "it carries, or opt out with ?ssl_check_hostname=false"
        )
    return ""
