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
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from worker.errors import ConfigError

Role = Literal["all", "leader", "consumer"]
ROLES: tuple[Role, ...] = ("all", "leader", "consumer")
ENV_PREFIX = "WORKER_"
DEMO_APP = "worker.demo:app"


def default_instance_name() -> str:
    """``<hostname>-<pid>``: unique per process, readable in logs and ``status``."""
    return f"{socket.gethostname()}-{os.getpid()}"


def mask_url(url: str | None) -> str:
    """Return ``url`` with any password replaced by ``***`` (safe to log or display)."""
    if not url:
        return ""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<unparseable url>"
    netloc = parts.netloc
    if password is not None:
        # keep the host part verbatim (IPv6 brackets, port) and mask only the userinfo
        netloc = f"{parts.username or ''}:***@{netloc.rpartition('@')[2]}"
    # redis-py also accepts the password as a query argument (?password=...)
    query = re.sub(r"(?i)(^|&)(password=)[^&]*", r"\1\2***", parts.query)
    if netloc == parts.netloc and query == parts.query:
        return url
    if parts.netloc or url.startswith(f"{parts.scheme}://"):
        netloc = f"//{netloc}"  # urlunsplit would drop the empty authority of unix:///path
    tail = (f"?{query}" if query else "") + (f"#{parts.fragment}" if parts.fragment else "")
    return f"{parts.scheme}:{netloc}{parts.path}{tail}"


class Settings(BaseSettings):
    """Everything a worker process can be configured with (see README, "Configuration")."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="ignore",
        validate_default=True,
    )

    # -- identity and wiring ------------------------------------------------------------------
    role: Role = Field("all", description="all | leader | consumer")
    instance_name: str = Field(default_factory=default_instance_name, min_length=1)
    redis_url: str | None = Field(None, description="redis://, rediss:// or unix:// URL")
    app: str = Field(DEMO_APP, description="pkg.module:attr naming the App to run")
    key_prefix: str = Field("worker:", min_length=1)
    redis_connect_timeout_s: float = Field(10.0, gt=0)

    # -- logs ---------------------------------------------------------------------------------
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    # -- consumer (arq) -----------------------------------------------------------------------
    concurrency: int = Field(100, ge=1, le=10_000)
    poll_delay_s: float = Field(0.05, gt=0, le=60)
    idle_poll_max_s: float = Field(0.5, gt=0, le=60)
    job_timeout_s: float = Field(300.0, gt=0)
    max_tries: int = Field(5, ge=1)
    keep_result_s: float = Field(3600.0, ge=0)
    serializer: Literal["msgpack", "json", "pickle"] = "msgpack"

    # -- shutdown -----------------------------------------------------------------------------
    shutdown_timeout_s: float = Field(30.0, ge=0)
    drain_delay_s: float = Field(5.0, ge=0)
    stop_grace_s: float = Field(5.0, gt=0)

    # -- health server ------------------------------------------------------------------------
    health_host: str = "0.0.0.0"
    health_port: int = Field(8080, ge=0, le=65535)

    # -- leadership ---------------------------------------------------------------------------
    leader_election: Literal["redis", "static"] = "redis"
    leader_ttl_s: float = Field(10.0, gt=0)
    leader_renew_interval_s: float = Field(2.0, gt=0)
    leader_renew_deadline_s: float = Field(6.0, gt=0)
    leader_poll_interval_s: float = Field(1.0, gt=0)

    # -- registry and orphan recovery ---------------------------------------------------------
    heartbeat_interval_s: float = Field(2.0, gt=0)
    orphan_stale_s: float = Field(10.0, gt=0)

    # -- supervision --------------------------------------------------------------------------
    restart_backoff_base_s: float = Field(0.5, gt=0)
    restart_backoff_cap_s: float = Field(30.0, gt=0)

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
        if self.redis_url is not None:
            if not self.redis_url:
                self.redis_url = None
            else:
                scheme = urlsplit(self.redis_url).scheme
                if scheme not in ("redis", "rediss", "unix"):
                    raise ValueError(
                        f"WORKER_REDIS_URL: scheme {scheme or '(none)'!r} is not supported; "
                        "use redis://, rediss:// or unix:// (got "
                        f"{mask_url(self.redis_url)!r})"
                    )
        if not re.fullmatch(r"[\w.-]+(:[\w.]+)?", self.app) or ":" not in self.app:
            raise ValueError(
                f"WORKER_APP: {self.app!r} is not of the form package.module:attribute"
            )
        return self

    def redacted(self) -> dict[str, Any]:
        """Settings as a dict safe to log or expose (Redis password masked)."""
        data = self.model_dump()
        data["redis_url"] = mask_url(self.redis_url)
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


def load_settings(**overrides: Any) -> Settings:
    """Build :class:`Settings`; ``overrides`` (CLI flags) win over env and file.

    Raises :class:`ConfigError` with a one-line message on any invalid input.
    """
    path = os.environ.get(f"{ENV_PREFIX}CONFIG_FILE")
    if path and not os.path.isfile(path):
        raise ConfigError(f"WORKER_CONFIG_FILE: no such file {path!r}")
    clean = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings(**clean)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc, clean)) from None
    except ValueError as exc:  # e.g. TOML syntax errors
        raise ConfigError(f"WORKER_CONFIG_FILE: {exc}") from None


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
    return f"{name}: invalid value {shown!r}; {msg[0].lower()}{msg[1:]}"
