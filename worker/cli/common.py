"""What every command shares: the one-line failure, the event loop, logging, the admin target."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Coroutine
from typing import Any, NoReturn, TypeVar

from worker.app import App
from worker.core.terminal import say
from worker.settings import Settings

T = TypeVar("T")
EXIT_CONFIG = 2


def fail(message: str) -> NoReturn:
    """One line on stderr (``worker: error: …``) and exit 2."""
    say(f"worker: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_CONFIG)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on uvloop when it is installed, else the default loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on CPython/Linux
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def setup_logging(settings: Settings) -> None:
    """Logging of a long-lived command (``run``, ``web``)."""
    from worker.core.logs import configure_logging

    # Lines from the main task say component=runtime; each component's task rebinds its name.
    configure_logging(
        settings.log_level,
        settings.log_format,
        role=settings.role,
        instance=settings.instance_name,
        component="runtime",
    )
    logging.captureWarnings(True)


async def admin_target(settings: Settings, what: str) -> tuple[Settings, App]:
    """The Redis (configured, else the local embedded server) and the app (the one the live
    instances run, unless ``--app``) that a long-lived admin command works on."""
    from worker.ops import admin

    async with admin.connect(settings, what) as a:
        app = await admin.resolve_app(settings, a.store)
    admin.flush_notes()
    return settings.model_copy(update={"redis_url": a.url}), app
