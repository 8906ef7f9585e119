"""examples/outbox's app with a relay that holds each batch it read for
``OUTBOX_HOLD_S`` seconds before moving it (logged ``outbox rows held``): the window a test
freezes the relay in, after its read and before its Redis write."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import structlog
from outbox.app import app

from worker.duties.outbox import OutboxRelay

__all__ = ["app"]

HOLD_S = float(os.environ.get("OUTBOX_HOLD_S", "0"))
_read = OutboxRelay.read


async def _held_read(self: OutboxRelay, conn: Any) -> list[tuple[Any, ...]]:
    rows = await _read(self, conn)
    if rows and HOLD_S:
        structlog.get_logger("tests.outbox").info(
            "outbox rows held", rows=len(rows), token=self.token
        )
        await asyncio.sleep(HOLD_S)
    return rows


OutboxRelay.read = _held_read  # type: ignore[method-assign]
