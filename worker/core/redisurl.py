"""Redis URLs: the one parser of ``WORKER_REDIS_URL`` (one server, a Sentinel-managed primary,
a Redis Cluster node) into a :class:`RedisTarget`, the ``WAIT`` policy (:class:`Replication`)
and password masking for every text that shows a URL; :mod:`worker.storage.connection` opens the
connections.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from redis.connection import parse_url

from worker.core.durability import ReplicaView

Kind = Literal["single", "sentinel", "cluster"]

#: scheme -> (kind, TLS)
SCHEMES: dict[str, tuple[Kind, bool]] = {
    "redis": ("single", False),
    "rediss": ("single", True),
    "unix": ("single", False),
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
}
DEFAULT_PORT = {"sentinel": 26379, "cluster": 6379}
#: Query arguments of the Sentinel and Cluster forms (the single-server form takes redis-py's).
HA_QUERY = frozenset(
    {
        "sentinel_username",
        "sentinel_password",
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_check_hostname",
    }
)
#: ``ssl_check_hostname=`` values (redis-py's spelling of false; true as well, strictly).
_FALSE = frozenset({"0", "f", "false", "n", "no"})
_TRUE = frozenset({"1", "t", "true", "y", "yes"})
#: How long a Sentinel or a cluster seed node may take to answer a topology question.
DISCOVERY_TIMEOUT_S = 2.0
URL_PASSWORD_HINT = (
    "percent-encode special characters in a password (/ as %2F, # as %23, ? as %3F, "
    "@ as %40, % as %25)"
)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)(.*)$", re.S)
_QUERY_PASSWORD = re.compile(r"(?i)(\b(?:[a-z]+_)*password=)(\"[^\"]*\"|'[^']*'|[^&\s,;)]*)")
_SERVICE = re.compile(r"[A-Za-z0-9._-]+")


def mask_url(url: str | None) -> str:
    """Return ``url`` with any password replaced by ``***`` (safe to log or display).

    Works on the raw text, so it also masks URLs that do not parse: the user info ends at the
    *last* ``@`` (as in redis-py), so a password containing ``@``, ``/``, ``#`` or ``?`` is
    masked whole; ``password=``, ``sentinel_password=``, ``ssl_password=`` (any ``*_password=``)
    query arguments are masked too.
    """
    if not url:
        return ""
    masked = _QUERY_PASSWORD.sub(r"\1***", url)
    m = _SCHEME.match(masked)
    if m is None or "@" not in m.group(2):
        return masked
    scheme, rest = m.groups()
    userinfo, _, host = rest.rpartition("@")
    if ":" not in userinfo:
        return masked  # a user name without a password
    return f"{scheme}{userinfo.partition(':')[0]}:***@{host}"


@dataclass(frozen=True)
class Replication:
    """``WAIT`` policy: a write that must survive a primary failover counts as done only once
    ``replicas`` replicas confirmed it within ``timeout_ms`` (0 replicas: no ``WAIT``).
    ``adaptive`` (``WORKER_REDIS_WAIT_REPLICAS=auto``): only as many as are attached to the
    primary, up to ``replicas``; with none attached the write goes on, degraded (see
    :mod:`worker.core.durability`). ``view``: what the last round trip saw, shared by the stores
    of one process."""

    replicas: int = 0
    timeout_ms: int = 500
    adaptive: bool = False
    view: ReplicaView = field(default_factory=ReplicaView, compare=False, repr=False)

    @property
    def enabled(self) -> bool:
        return self.replicas > 0


@dataclass(frozen=True)
class RedisTarget:
    """A parsed Redis URL: which servers to talk to and how to authenticate.

    ``nodes`` are the Sentinels (``sentinel``) or the cluster's seed nodes (``cluster``);
    ``service`` is the Sentinel master name. Passwords never appear in :meth:`describe`.
    """

    url: str
    kind: Kind = "single"
    nodes: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    ssl: bool = False
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    ssl_options: tuple[tuple[str, str], ...] = ()
    #: TLS: the server's certificate must name the host connected to (on unless the URL says
    #: ``ssl_check_hostname=false``, or ``ssl_cert_reqs=none`` turns verification off)
    check_hostname: bool = False

    def describe(self) -> str:
        """The URL with its passwords masked."""
        return mask_url(self.url)

    def __repr__(self) -> str:
        return f"RedisTarget({self.describe()!r})"


def parse_redis_url(
    url: str,
    name: str = "WORKER_REDIS_URL",
    *,
    sentinel_username: str | None = None,
    sentinel_password: str | None = None,
) -> RedisTarget:
    """Parse ``url``; ``ValueError`` with one line (password masked) naming ``name`` unless
    redis-py can use it. ``sentinel_username`` / ``sentinel_password`` (the
    ``WORKER_SENTINEL_*`` settings) authenticate to Sentinels; the URL's own
    ``sentinel_password=`` argument may not be given as well."""
    shown = mask_url(url)
    scheme = urlsplit(url).scheme.lower()
    if scheme not in SCHEMES:
        raise ValueError(
            f"{name}: scheme {scheme or '(none)'!r} is not supported; use redis://, rediss://, "
            f"unix://, redis+sentinel:// or redis+cluster:// (got {shown!r})"
        )
    kind, ssl = SCHEMES[scheme]
    if kind == "single":
        _check_single(url, name, shown)
        if sentinel_username or sentinel_password:
            raise ValueError(
                f"{name}: WORKER_SENTINEL_USERNAME/WORKER_SENTINEL_PASSWORD are set but the URL "
                f"is not a redis+sentinel:// URL (got {shown!r})"
            )
        query = dict(parse_qsl(urlsplit(url).query, keep_blank_values=True))
        return RedisTarget(
            url, "single", ssl=ssl, check_hostname=ssl and _check_hostname(query, name, shown)
        )
    return _parse_ha(url, name, shown, kind, ssl, sentinel_username, sentinel_password)


def _check_single(url: str, name: str, shown: str) -> None:
    try:
        kwargs = parse_url(url)  # type: ignore[no-untyped-call]
        port = urlsplit(url).port
    except ValueError as exc:
        # redis-py's message can quote a fragment of a password that was not percent-encoded
        reason = "the port is not a number in 1-65535" if "Port" in str(exc) else str(exc)
        raise ValueError(f"{name}: invalid URL {shown!r}: {reason}; {URL_PASSWORD_HINT}") from None
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"{name}: invalid URL {shown!r}: the port must be 1-65535")
    path = urlsplit(url).path
    if urlsplit(url).scheme != "unix" and path.strip("/") and "db" not in kwargs:
        raise ValueError(
            f"{name}: invalid URL {shown!r}: the path must be a database number (/0); "
            f"{URL_PASSWORD_HINT}"
        )


def _parse_ha(
    url: str,
    name: str,
    shown: str,
    kind: Kind,
    ssl: bool,
    sentinel_username: str | None,
    sentinel_password: str | None,
) -> RedisTarget:
    def bad(reason: str) -> ValueError:
        return ValueError(f"{name}: invalid URL {shown!r}: {reason}")

    rest = url.split("://", 1)[1]
    rest, _, fragment = rest.partition("#")
    if fragment:
        raise bad(f"'#' must be percent-encoded; {URL_PASSWORD_HINT}")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, pw = userinfo.partition(":")
        username, password = unquote(user) or None, unquote(pw) if colon else None
    nodes: list[tuple[str, int]] = []
    for part in hostlist.split(","):
        host, port = _host_port(part.strip(), DEFAULT_PORT[kind], bad)
        nodes.append((host, port))
    options: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        if key not in HA_QUERY:
            raise bad(f"unknown query argument {key!r} (known: {', '.join(sorted(HA_QUERY))})")
        options[key] = value
    service, db = _service_and_db(kind, path, bad)
    if kind == "cluster" and db != 0:
        raise bad("Redis Cluster has only database 0")
    if kind == "cluster" and ("sentinel_username" in options or "sentinel_password" in options):
        raise bad("sentinel_* arguments belong to redis+sentinel:// URLs")
    if not ssl and ("ssl_cert_reqs" in options or "ssl_ca_certs" in options):
        raise bad(f"ssl_* arguments need TLS ({'rediss+' + kind}://)")
    if kind == "cluster" and (sentinel_username or sentinel_password):
        raise bad("WORKER_SENTINEL_USERNAME/WORKER_SENTINEL_PASSWORD are set for a cluster URL")
    given_creds = {"sentinel_username": sentinel_username, "sentinel_password": sentinel_password}
    for key, given in given_creds.items():
        if given is not None and key in options:
            raise bad(f"{key} is in the URL and in WORKER_{key.upper()}; set it in one place")
    check_hostname = ssl and _check_hostname(options, name, shown)
    ssl_options = tuple(
        sorted(
            (k, v) for k, v in options.items() if k.startswith("ssl_") and k != "ssl_check_hostname"
        )
    )
    return RedisTarget(
        url,
        kind,
        tuple(nodes),
        service,
        db,
        username,
        password,
        ssl,
        sentinel_username if sentinel_username is not None else options.get("sentinel_username"),
        sentinel_password if sentinel_password is not None else options.get("sentinel_password"),
        ssl_options,
        check_hostname,
    )


def _service_and_db(kind: Kind, path: str, bad: Any) -> tuple[str, int]:
    """The Sentinel master name (``sentinel`` only) and the database number of a URL's path."""
    segments = path.split("/") if path else []
    service, db = "", 0
    if kind == "sentinel":
        if not segments or not segments[0]:
            raise bad("name the Sentinel master after the hosts (…:26379/mymaster/0)")
        service = unquote(segments[0])
        if not _SERVICE.fullmatch(service):
            raise bad(f"master name {service!r}: use A-Z a-z 0-9 . _ -")
        segments = segments[1:]
    segments = [s for s in segments if s != ""]
    if len(segments) > 1 or (segments and not segments[0].isdigit()):
        where = "the master name" if kind == "sentinel" else "the hosts"
        raise bad(f"after {where} only a database number may follow (/0); {URL_PASSWORD_HINT}")
    if segments:
        db = int(segments[0])
    return service, db


def _check_hostname(query: dict[str, str], name: str, shown: str) -> bool:
    """Whether a TLS URL's connections check the certificate's host name: yes unless it says
    ``ssl_check_hostname=false`` or turns verification off (``ssl_cert_reqs=none``)."""
    unverified = query.get("ssl_cert_reqs", "required").lower() == "none"
    raw = query.get("ssl_check_hostname")
    if raw is None:
        return not unverified
    if raw.lower() not in _TRUE | _FALSE:
        raise ValueError(f"{name}: invalid URL {shown!r}: ssl_check_hostname must be true or false")
    if raw.lower() in _TRUE and unverified:
        raise ValueError(
            f"{name}: invalid URL {shown!r}: ssl_check_hostname=true needs the certificate "
            "verified (drop ssl_cert_reqs=none)"
        )
    return raw.lower() in _TRUE


def _host_port(text: str, default: int, bad: Any) -> tuple[str, int]:
    if not text:
        raise bad("a host is empty (hosts are separated by commas: h1:26379,h2:26379)")
    if text.startswith("["):  # [IPv6]:port
        host, _, tail = text[1:].partition("]")
        port_text = tail.removeprefix(":") if tail else ""
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon:
            host, port_text = text, ""
    if not host:
        raise bad(f"host {text!r} has no name")
    if port_text and (not port_text.isdigit() or not 1 <= int(port_text) <= 65535):
        raise bad(f"host {text!r}: the port must be a number in 1-65535; {URL_PASSWORD_HINT}")
    return host, int(port_text) if port_text else default
