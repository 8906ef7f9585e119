"""Structured logging: JSON off a TTY, readable on one; role, instance, component on every line.

Standard-library records (arq, redis-py, aiohttp) go through the same processors, so they are
JSON too and carry the component bound in the asyncio task that emitted them.

Secrets: every string in a line (the event text, values at any depth, exception texts and
formatted tracebacks) has Redis URL passwords and ``password=`` arguments masked before it
is rendered, and the rendered line is masked once more as a safety net.

Control characters: a readable (console) line is for a terminal, so every string in it has
its escape sequences and bidirectional controls shown as visible escapes
(:func:`worker.core.terminal.safe`): a job's exception text or traceback cannot retitle or clear
the terminal, write its clipboard (OSC 52) or reverse the text around it. A JSON line
escapes them by JSON's own rules.
"""

from __future__ import annotations

import hashlib
import logging
import re
import sys
import traceback
from typing import Any

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from worker.core.redisurl import mask_url
from worker.core.terminal import safe

#: A Redis URL inside free text: up to whitespace, a quote, ``<>`` or a JSON escape.
_URL = re.compile(r"(?i)\b(?:rediss?(?:\+(?:sentinel|cluster))?|unix)://[^\s'\"<>\\]*")
#: ``password=value``: quoted ('x', "x", or JSON-escaped \"x\") or up to a delimiter.
_PASSWORD_ARG = re.compile(
    r"(?i)(\b(?:[a-z]+_)*password=)(\"[^\"]*\"|'[^']*'|\\\"[^\"\\]*\\\"|[^&\s,;)'\"\\]*)"
)


#: Longest error text or reason kept whole in a log line, a dead letter or a result.
TEXT_CHARS = 2000


def capped(text: str, limit: int = TEXT_CHARS) -> str:
    """``text`` when at most ``limit`` characters, else its first ``limit`` characters and
    how long it was with its sha256 (a 20 MB exception message costs 2 KB where it goes)."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode(errors="backslashreplace")).hexdigest()
    return f"{text[:limit]}… [cut: {len(text)} characters in all, sha256 {digest}]"


def mask_text(text: str) -> str:
    """``text`` with every Redis URL password and ``password=`` / ``*_password=`` (sentinel,
    ssl) argument replaced by ``***``."""
    if "://" in text:
        text = _URL.sub(lambda m: mask_url(m.group(0)), text)
    if "password=" in text.lower():
        text = _PASSWORD_ARG.sub(r"\1***", text)
    return text


#: Longest traceback kept (in a failure record, a trace span and a log line), in UTF-8 bytes:
#: its head and its tail (where the error was raised) are kept.
TRACEBACK_BYTES = 16 * 1024


def head_tail(text: str, limit: int = TRACEBACK_BYTES) -> str:
    """``text`` when at most ``limit`` UTF-8 bytes, else its head and tail around a marker
    saying how much was cut."""
    raw = text.encode(errors="backslashreplace")
    if len(raw) <= limit:
        return text
    half = (limit - 64) // 2
    head = raw[:half].decode(errors="ignore")
    tail = raw[-half:].decode(errors="ignore")
    return f"{head}\n… [{len(raw) - 2 * half} bytes cut] …\n{tail}"


def traceback_text(exc: BaseException) -> str:
    """``exc``'s formatted traceback, secrets masked, capped (:func:`head_tail`)."""
    text = "".join(traceback.format_exception(exc))
    return head_tail(mask_text(text))


def error_text(exc: BaseException) -> str:
    """``exc``'s message, secrets masked, capped (:func:`capped`): what a log line, a failure record
    and a trace span show of it."""
    return capped(mask_text(str(exc)))


def _mask(value: Any) -> Any:
    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, dict):
        return {k: _mask(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return type(value)(_mask(v) for v in value)
    if isinstance(value, BaseException):
        return mask_text(f"{type(value).__name__}: {value}")
    return value


def mask_secrets(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Processor: mask passwords in every string of the line (run after ``format_exc_info``,
    so the rendered traceback in ``exception`` is masked too)."""
    for key, value in event_dict.items():
        if not key.startswith("_"):  # structlog's own _record / _from_structlog
            event_dict[key] = _mask(value)
    return event_dict


def escape_controls(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Processor (console format): every string value with its control characters escaped
    (other values are rendered with ``repr``, which escapes them itself)."""
    for key, value in event_dict.items():
        if isinstance(value, str) and not key.startswith("_"):
            event_dict[key] = safe(value)
    return event_dict


def mask_rendered(_: WrappedLogger, __: str, line: Any) -> Any:
    """Final processor: mask the rendered line once more (values rendered with ``repr``)."""
    return mask_text(line) if isinstance(line, str) else line


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
        # tracebacks become text here, in both formats, so that mask_secrets sees them
        structlog.processors.format_exc_info,
        mask_secrets,
    ]
    renderer: Processor
    if use_json:
        renderer = structlog.processors.JSONRenderer()
    else:
        shared.append(escape_controls)  # the line goes to a terminal (its own colours stay)
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
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            renderer,
            mask_rendered,
        ],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # arq logs two INFO lines per job; per-job lines belong at DEBUG (-20 % throughput else).
    logging.getLogger("arq").setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(**bind)
