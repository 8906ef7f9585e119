"""Process settings: ``WORKER_*`` environment variables, an optional TOML file, CLI overrides.

Precedence, highest first: command-line flags, environment, the TOML file named by
``WORKER_CONFIG_FILE``, defaults. Invalid values raise :class:`ConfigError` carrying one line
that names the variable and the accepted values; the CLI prints it and exits with code 2.
"""

from __future__ import annotations

import difflib
import os
import re
import socket
import tomllib
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from worker.core.errors import ConfigError
from worker.core.ids import hash_tag
from worker.core.redisurl import (
    URL_PASSWORD_HINT,
    RedisTarget,
    Replication,
    mask_url,
    parse_redis_url,
)

__all__ = [
    "URL_PASSWORD_HINT",
    "Settings",
    "check_redis_url",
    "load_settings",
    "mask_url",
]

Role = Literal["all", "leader", "consumer"]
ROLES: tuple[Role, ...] = ("all", "leader", "consumer")
ENV_PREFIX = "WORKER_"
DEMO_APP = "worker.demo:app"

#: Upper bound of every interval, TTL and timeout (1 day): larger values overflow the
#: millisecond arithmetic (PX, ZADD scores) or make a process wait "forever".
DAY_S = 86_400.0
#: Upper bound of a job's timeout and of how long its result is kept (7 days).
WEEK_S = 7 * DAY_S
#: ``key_prefix`` / ``instance_name``: no whitespace, no glob (``* ? [``) or Cluster hash-tag
#: (``{ }``) characters, which would break SCAN patterns and key slots.
#: Fixed waits of ``Runtime._shutdown`` (see :meth:`Settings.worst_case_shutdown_s`).
SHUTDOWN_LEADERSHIP_STOP_S = 2.0
SHUTDOWN_RELEASE_S = 2.0
SHUTDOWN_WORK_SLACK_S = 5.0
SHUTDOWN_INFRA_STOP_S = 2.0
SHUTDOWN_DEREGISTER_S = 2.0  # each of the two deregistrations
#: ``WORKER_TRACING=otel`` without the OpenTelemetry API installed.
OTEL_MISSING = (
    "WORKER_TRACING=otel needs the OpenTelemetry API: pip install 'fenced-worker[otel]' "
    "(or set WORKER_TRACING=off)"
)
SAFE_NAME = re.compile(r"[A-Za-z0-9._:-]+")
#: Shortest console token accepted (``WORKER_WEB_TOKEN``).
MIN_TOKEN_CHARS = 16
SAFE_NAME_CHARS = "A-Z a-z 0-9 . _ : -"
#: ``key_prefix`` may start with one Redis Cluster hash tag, ``{shop}:``: every key of the app
#: then lives in one hash slot (required with a ``redis+cluster://`` URL).
SAFE_PREFIX = re.compile(r"(\{[A-Za-z0-9._:-]+\})?[A-Za-z0-9._:-]*")


def default_instance_name() -> str:
    """``<hostname>-<pid>``: unique per process, readable in logs and ``status``."""
    return f"{socket.gethostname()}-{os.getpid()}"


def check_redis_url(url: str, name: str = "WORKER_REDIS_URL") -> None:
    """Raise ``ValueError`` (one line, password masked) unless the framework can use ``url``
    (see :func:`worker.core.redisurl.parse_redis_url`)."""
    parse_redis_url(url, name)


class Settings(BaseSettings):
    """Everything a worker process can be configured with (see docs/configuration.md)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="ignore",
        validate_default=True,
        # inf / nan / 1e309 parse as floats but break every timer and ms conversion
        allow_inf_nan=False,
    )

    # -- identity and wiring ------------------------------------------------------------------
    role: Role = Field("all", description="all | leader | consumer")
    instance_name: str = Field(default_factory=default_instance_name, min_length=1, max_length=128)
    redis_url: str | None = Field(
        None, description="redis://, rediss://, unix://, redis+sentinel:// or redis+cluster:// URL"
    )
    redis_url_file: str | None = Field(None, description="file holding the Redis URL (a Secret)")
    app: str = Field(DEMO_APP, description="pkg.module:attr naming the App to run")
    processes: int = Field(1, ge=1, le=64, description="worker processes this command runs")
    key_prefix: str = Field("worker:", min_length=1, max_length=64)
    queue_shards: int = Field(
        1, ge=1, le=64, description="slots the app's job queue is split over (Cluster)"
    )
    redis_connect_timeout_s: float = Field(10.0, gt=0, le=DAY_S)
    allow_eviction: bool = False
    sentinel_username: str | None = Field(None, description="ACL user of the Sentinels")
    sentinel_password: str | None = Field(None, description="password of the Sentinels")
    redis_wait_replicas: Annotated[int, Field(ge=0, le=64)] | Literal["auto"] = Field(
        "auto",
        description="replicas confirming a durable write (WAIT); auto: with a Sentinel or "
        "Cluster URL the attached ones, up to 1 (none attached: go on, degraded); a number: "
        "strict",
    )
    redis_wait_timeout_s: float = Field(0.5, gt=0, le=60)

    # -- logs ---------------------------------------------------------------------------------
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    # -- consumer -----------------------------------------------------------------------------
    concurrency: int = Field(100, ge=1, le=10_000)
    duty_slots: int = Field(
        4, ge=0, le=1000, description="slots for duty jobs only, beside concurrency (0: no lane)"
    )
    sync_threads: int = Field(10, ge=1, le=1000, description="threads for plain def jobs")
    poll_delay_s: float = Field(0.05, gt=0, le=60)
    idle_poll_max_s: float = Field(1.0, gt=0, le=60)
    idle_poll_subscribed_s: float = Field(
        30.0, gt=0, le=3600, description="idle fallback look while wake-ups are subscribed"
    )
    unannounced_look_s: float = Field(
        0.5, ge=0, le=60, description="the leader's look for due jobs nobody announced (0: off)"
    )
    outbox_dsn: SecretStr | None = Field(
        None, description="PostgreSQL DSN of the outbox table the leader relays (unset: off)"
    )
    job_timeout_s: float = Field(300.0, gt=0, le=WEEK_S)
    max_tries: int = Field(5, ge=1)
    keep_result_s: float = Field(3600.0, ge=0, le=WEEK_S)
    serializer: Literal["msgpack", "json", "pickle"] = "msgpack"
    max_payload_bytes: int = Field(4 * 1024 * 1024, ge=1024, le=512 * 1024 * 1024)
    #: Largest broadcast payload: refused at publish (one clear error), skipped when received
    #: (a broadcast reaches every process of every role and stays in the topic's history).
    max_broadcast_bytes: int = Field(1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    queues: str = Field("", pattern=r"^[A-Za-z0-9_.-]*(,[A-Za-z0-9_.-]+)*$")

    job_hook_timeout_s: float = Field(5.0, gt=0, le=DAY_S)
    tracing: Literal["off", "otel"] = Field("off", description="off | otel (OpenTelemetry)")
    # -- recent job ends (what `python -m worker jobs` and the console list) ------------------
    failures_keep: int = Field(1000, ge=1, le=1_000_000, description="recent failures kept")
    failures_keep_s: float = Field(
        86_400.0, gt=0, le=WEEK_S, description="recent failures kept at most this long"
    )
    done_keep: int = Field(1000, ge=1, le=1_000_000, description="recent completions kept")

    # -- dead letters -------------------------------------------------------------------------
    dead_letter_max: int = Field(10_000, ge=1, le=10_000_000)
    dead_letter_payload_bytes: int = Field(65_536, ge=0, le=16 * 1024 * 1024)

    # -- shutdown -----------------------------------------------------------------------------
    shutdown_timeout_s: float = Field(30.0, ge=0, le=DAY_S)
    drain_delay_s: float = Field(5.0, ge=0, le=DAY_S)
    stop_grace_s: float = Field(5.0, gt=0, le=DAY_S)

    # -- health server ------------------------------------------------------------------------
    health_host: str = "127.0.0.1"
    health_port: int = Field(8080, ge=0, le=65535)
    status_show_errors: bool = False
    health_allowed_hosts: str = Field("", description="Host names served besides IPs/localhost")

    # -- operator console (python -m worker web) ----------------------------------------------
    web_host: str = "127.0.0.1"
    web_port: int = Field(8090, ge=0, le=65535)
    web_token: SecretStr | None = None
    web_token_file: str | None = None
    web_auth: bool = True
    web_allowed_hosts: str = Field("", description="Host names served besides IPs/localhost")
    web_allow_remote_no_auth: bool = False

    # -- leadership ---------------------------------------------------------------------------
    leader_election: Literal["redis", "static"] = "redis"
    leader_ttl_s: float = Field(10.0, gt=0, le=DAY_S)
    leader_renew_interval_s: float = Field(2.0, gt=0, le=DAY_S)
    leader_renew_deadline_s: float = Field(6.0, gt=0, le=DAY_S)
    leader_poll_interval_s: float = Field(1.0, gt=0, le=DAY_S)

    # -- registry and orphan recovery ---------------------------------------------------------
    heartbeat_interval_s: float = Field(4.0, gt=0, le=DAY_S)
    orphan_stale_s: float = Field(10.0, gt=0, le=DAY_S)

    # -- supervision --------------------------------------------------------------------------
    restart_backoff_base_s: float = Field(0.5, gt=0, le=DAY_S)
    restart_backoff_cap_s: float = Field(30.0, gt=0, le=DAY_S)

    # -- event loop watchdog ------------------------------------------------------------------
    #: a beat this late means a blocked loop (capped so the watchdog acts before the renew
    #: deadline and the orphan bound: ``watchdog.blocked_threshold_s``)
    loop_blocked_s: float = Field(2.0, gt=0, le=DAY_S)

    @field_validator("instance_name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not SAFE_NAME.fullmatch(value):
            raise ValueError(
                f"use only {SAFE_NAME_CHARS} (whitespace, glob and hash-tag characters break "
                "SCAN patterns and Redis Cluster slots)"
            )
        return value

    @field_validator("key_prefix")
    @classmethod
    def _safe_prefix(cls, value: str) -> str:
        if not SAFE_PREFIX.fullmatch(value) or value == "{}":
            raise ValueError(
                f"use only {SAFE_NAME_CHARS}, optionally after one leading Redis Cluster hash "
                "tag such as {shop}: (whitespace and glob characters break SCAN patterns)"
            )
        return value

    @model_validator(mode="after")
    def _check_relations(self) -> Settings:
        if not (self.leader_renew_interval_s < self.leader_renew_deadline_s < self.leader_ttl_s):
            raise ValueError(
                "WORKER_LEADER_RENEW_INTERVAL_S < WORKER_LEADER_RENEW_DEADLINE_S < "
                "WORKER_LEADER_TTL_S must hold (got "
                f"{self.leader_renew_interval_s} / {self.leader_renew_deadline_s} / "
                f"{self.leader_ttl_s})"
            )
        if self.orphan_stale_s < 2 * self.heartbeat_interval_s:
            raise ValueError(
                "WORKER_ORPHAN_STALE_S must be at least twice WORKER_HEARTBEAT_INTERVAL_S (got "
                f"{self.orphan_stale_s} < 2 x {self.heartbeat_interval_s})"
            )
        self._check_processes()
        if self.queue_shards > 1 and hash_tag(self.key_prefix) is None:
            raise ValueError(
                f"WORKER_QUEUE_SHARDS={self.queue_shards} needs a hash-tagged "
                f"WORKER_KEY_PREFIX such as {{{self.key_prefix.strip(':{}') or 'app'}}}: "
                f"(got {self.key_prefix!r}): each shard is one Redis Cluster hash slot"
            )
        self._resolve_redis_url()
        if self.wait_replicas() and not (
            self.redis_wait_timeout_s < self.leader_renew_deadline_s / 2
        ):
            raise ValueError(
                "WORKER_REDIS_WAIT_TIMEOUT_S must be below half of "
                "WORKER_LEADER_RENEW_DEADLINE_S (the lease connection's socket timeout; got "
                f"{self.redis_wait_timeout_s} >= {self.leader_renew_deadline_s} / 2)"
            )
        self._resolve_web_token()
        if self.tracing == "otel" and not _have_otel():
            raise ValueError(OTEL_MISSING)
        if not re.fullmatch(r"[\w.-]+(:[\w.]+)?", self.app) or ":" not in self.app:
            raise ValueError(
                f"WORKER_APP: {self.app!r} is not of the form package.module:attribute"
            )
        return self

    @property
    def health_port_explicit(self) -> bool:
        """``WORKER_HEALTH_PORT`` (or ``--health-port``, or the config file) names the port: a
        taken port then fails start-up. Left at the default, a taken 8080 moves to a free one."""
        return "health_port" in self.model_fields_set

    def _check_processes(self) -> None:
        """``--processes N``: every child is instance ``<name>-<i>`` on health port
        ``base + i`` (see :mod:`worker.runtime.processes`), and each is a separate leader
        candidate."""
        n = self.processes
        if n == 1:
            return
        if self.leader_election == "static" and self.role != "consumer":
            raise ValueError(
                f"WORKER_PROCESSES={n} with WORKER_LEADER_ELECTION=static would make every "
                "process a leader; use WORKER_LEADER_ELECTION=redis (or one process)"
            )
        if self.health_port and self.health_port + n - 1 > 65535:
            raise ValueError(
                f"WORKER_HEALTH_PORT + WORKER_PROCESSES - 1 must be at most 65535 (process i "
                f"listens on {self.health_port} + i; got {self.health_port + n - 1})"
            )
        if len(self.instance_name) + len(f"-{n - 1}") > 128:
            raise ValueError(
                f"WORKER_INSTANCE_NAME: at most {128 - len(f'-{n - 1}')} characters with "
                f"WORKER_PROCESSES={n} (process i is named <name>-<i>)"
            )

    def _resolve_redis_url(self) -> None:
        """Read ``redis_url_file`` (a mounted Secret) and check the URL redis-py will get."""
        name = "WORKER_REDIS_URL"
        if self.redis_url_file:
            if self.redis_url:
                raise ValueError(
                    "WORKER_REDIS_URL and WORKER_REDIS_URL_FILE are both set; set only one"
                )
            self.redis_url = _read_url_file(self.redis_url_file)
            name = "WORKER_REDIS_URL_FILE"
        if not self.redis_url:
            self.redis_url = None
            if self.sentinel_username or self.sentinel_password:
                raise ValueError(
                    "WORKER_SENTINEL_USERNAME/WORKER_SENTINEL_PASSWORD are set without a "
                    "redis+sentinel:// WORKER_REDIS_URL"
                )
            return
        target = parse_redis_url(
            self.redis_url,
            name,
            sentinel_username=self.sentinel_username,
            sentinel_password=self.sentinel_password,
        )
        if target.kind == "cluster" and hash_tag(self.key_prefix) is None:
            raise ValueError(
                f"WORKER_KEY_PREFIX: {self.key_prefix!r} has no hash tag; with a "
                "redis+cluster:// URL every key of the app must share one hash slot: use a "
                "prefix such as {" + self.key_prefix.strip(":") + "}:"
            )

    def redis_target(self) -> RedisTarget | None:
        """The parsed Redis URL with the Sentinel credentials (``None``: no URL set)."""
        if not self.redis_url:
            return None
        return parse_redis_url(
            self.redis_url,
            "WORKER_REDIS_URL_FILE" if self.redis_url_file else "WORKER_REDIS_URL",
            sentinel_username=self.sentinel_username,
            sentinel_password=self.sentinel_password,
        )

    def wait_replicas(self) -> int:
        """Replicas a durable write waits for at most: ``WORKER_REDIS_WAIT_REPLICAS``, where
        ``auto`` is 1 with a Sentinel or Cluster URL (there are replicas to fail over to; only
        the attached ones are waited for) and 0 otherwise."""
        if self.redis_wait_replicas != "auto":
            return self.redis_wait_replicas
        scheme = self.redis_url.split("://")[0] if self.redis_url else ""
        return 1 if scheme.endswith(("+sentinel", "+cluster")) else 0

    def replication(self) -> Replication:
        """The ``WAIT`` policy of durable writes (see :class:`worker.core.redisurl.Replication`):
        ``auto`` waits for the attached replicas (adaptive), a number is strict."""
        return Replication(
            self.wait_replicas(),
            ms_round(self.redis_wait_timeout_s),
            adaptive=self.redis_wait_replicas == "auto",
        )

    def _resolve_web_token(self) -> None:
        """Read ``web_token_file`` (a mounted Secret); a token must be long enough to guess
        at no better than by chance."""
        name = "WORKER_WEB_TOKEN"
        if self.web_token_file:
            if self.web_token is not None:
                raise ValueError("WORKER_WEB_TOKEN and WORKER_WEB_TOKEN_FILE are both set; set one")
            self.web_token = SecretStr(
                _read_secret_file(self.web_token_file, "WORKER_WEB_TOKEN_FILE")
            )
            name = "WORKER_WEB_TOKEN_FILE"
        if self.web_token is None:
            return
        token = self.web_token.get_secret_value()
        if len(token) < MIN_TOKEN_CHARS or token != token.strip():
            raise ValueError(
                f"{name}: the token must be at least {MIN_TOKEN_CHARS} characters without "
                "surrounding whitespace (e.g. python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))')"
            )

    def worst_case_shutdown_s(self) -> float:
        """Longest a graceful shutdown can take, SIGTERM to exit, for this role: the steps
        of ``Runtime._shutdown`` at their limits. A container's grace period (Kubernetes
        ``terminationGracePeriodSeconds``, compose ``stop_grace_period``) must exceed it, or
        SIGKILL cuts in-flight jobs and the lease release short."""
        total = (
            self.drain_delay_s
            + self.shutdown_timeout_s
            + SHUTDOWN_WORK_SLACK_S  # the work group gets shutdown timeout + this
            + SHUTDOWN_INFRA_STOP_S  # health server and heartbeat
            + 2 * SHUTDOWN_DEREGISTER_S
        )
        if self.role != "consumer":
            total += self.stop_grace_s + SHUTDOWN_LEADERSHIP_STOP_S + SHUTDOWN_RELEASE_S
        return total

    def redacted(self) -> dict[str, Any]:
        """Settings as a dict safe to log or expose (Redis password masked)."""
        data = self.model_dump()
        data["redis_url"] = mask_url(self.redis_url)
        if self.sentinel_password is not None:
            data["sentinel_password"] = "***"
        data["web_token"] = "***" if self.web_token is not None else None
        return data

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = os.environ.get(f"{ENV_PREFIX}CONFIG_FILE")
        if path:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)


def _have_otel() -> bool:
    """OpenTelemetry's API can be imported (``WORKER_TRACING=otel`` needs it)."""
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        return False
    return True


def ms_round(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def load_settings(**overrides: Any) -> Settings:
    """Build :class:`Settings`; ``overrides`` (CLI flags) win over env and file.

    Raises :class:`ConfigError` with a one-line message on any invalid input.
    """
    path = os.environ.get(f"{ENV_PREFIX}CONFIG_FILE")
    if path:
        _check_config_file(path)
    clean = {k: v for k, v in overrides.items() if v is not None}
    if clean.get("redis_url"):
        clean["redis_url_file"] = None  # an explicit --redis-url wins over a URL file
    try:
        return Settings(**clean)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc, clean)) from None
    except ValueError as exc:  # e.g. TOML syntax errors
        raise ConfigError(f"WORKER_CONFIG_FILE: {exc}") from None


def _check_config_file(path: str) -> None:
    """The TOML file exists, parses, and names only real settings (a typo is not ignored)."""
    if not os.path.isfile(path):
        raise ConfigError(f"WORKER_CONFIG_FILE: no such file {path!r}")
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"WORKER_CONFIG_FILE: {path}: {exc}") from None
    known = list(Settings.model_fields)
    for key in data:
        if key not in known:
            match = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
            hint = f"did you mean {match[0]!r}?" if match else "config/worker.toml lists them all"
            raise ConfigError(f"WORKER_CONFIG_FILE: unknown setting {key!r}; {hint}")


def _read_url_file(path: str) -> str:
    return _read_secret_file(path, "WORKER_REDIS_URL_FILE")


def _read_secret_file(path: str, name: str) -> str:
    """The stripped text of a mounted secret file; ``ValueError`` naming ``name``."""
    try:
        with open(path, encoding="utf-8") as f:
            value = f.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ValueError(f"{name}: cannot read {path!r}: {reason}") from None
    if not value:
        raise ValueError(f"{name}: {path!r} is empty")
    return value


def env_names() -> set[str]:
    """Every environment variable the settings read (``WORKER_<FIELD>`` + the config file)."""
    return {f"{ENV_PREFIX}{name.upper()}" for name in Settings.model_fields} | {
        f"{ENV_PREFIX}CONFIG_FILE"
    }


def likely_typos(environ: Mapping[str, str] | None = None) -> list[str]:
    """``WORKER_*`` variables that are not settings but look like one (a typo is otherwise
    silently ignored). Only close matches are reported: Kubernetes injects unrelated
    ``WORKER_SERVICE_HOST``-style variables for a Service named ``worker``."""
    known = env_names()
    out = []
    for name in sorted(environ if environ is not None else os.environ):
        upper = name.upper()
        if upper.startswith(ENV_PREFIX) and upper not in known:
            match = difflib.get_close_matches(upper, known, n=1, cutoff=0.85)
            if match:
                out.append(f"{name} is not a setting; did you mean {match[0]}?")
    return out


def _one_line(exc: ValidationError, overrides: dict[str, Any]) -> str:
    err = exc.errors()[0]
    loc = [str(p) for p in err.get("loc", ()) if p != "__root__"]
    msg = str(err.get("msg", "invalid value"))
    msg = msg.removeprefix("Value error, ")
    if not loc:
        return msg
    field = loc[0]
    name = f"{ENV_PREFIX}{field.upper()}"
    if field in overrides:
        name = f"--{field.replace('_', '-')} ({name})"
    value = err.get("input")
    shown = mask_url(value) if field == "redis_url" and isinstance(value, str) else value
    if field == "sentinel_password" and value is not None:
        shown = "***"
    if field == "web_token":
        shown = "***"  # never echo a secret
    return f"{name}: invalid value {shown!r}; {msg[0].lower()}{msg[1:]}"
