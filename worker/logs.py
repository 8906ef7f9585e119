"""Structured logging: JSON off a TTY, readable on one; role, instance, component on every line.

Standard-library records (arq, redis-py, aiohttp) go through the same processors, so they are
JSON too and carry the component bound in the asyncio task that emitted them. Anything that
looks like a Redis URL password is masked before a line is written.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

_URL_PASSWORD = re.compile(r"((?:rediss?|unix)://[^:/@\s]*:)([^@\s]+)(@)")


def _mask(value: Any) -> Any:
    if isinstance(value, str) and "://" in value:
        return _URL_PASSWORD.sub(r"\1***\3", value)
    return value


def mask_secrets(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Processor: mask passwords in any URL-looking string value."""
    for key, value in event_dict.items():
        event_dict[key] = _mask(value)
    return event_dict


def configure_logging(
    level: str = "INFO",
    fmt: str = "auto",
    *,
    stream: Any = None,
    **bind: Any,
) -> None:
    """Configure structlog and the standard library once per process.

    ``fmt`` is ``json``, ``console`` or ``auto`` (console on a TTY, JSON otherwise). ``bind``
    values (role, instance) are attached to every line.
    """
    stream = stream or sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not stream.isatty())
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        mask_secrets,
    ]
    renderer: Processor
    if use_json:
        renderer = structlog.processors.JSONRenderer()
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=stream.isatty())

    structlog.configure(
        processors=[
            *shared,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # arq logs two INFO lines per job; per-job lines belong at DEBUG (PERFORMANCE.md).
    logging.getLogger("arq").setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(**bind)
