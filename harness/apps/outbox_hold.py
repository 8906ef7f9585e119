"""examples/outbox's app with a relay that holds each batch for ``OUTBOX_HOLD_S`` seconds,
logged ``outbox rows held``: the window a test freezes the relay in. ``OUTBOX_HOLD_IN``:
``read`` (default: after its read, before its Redis write) or ``delete`` (after its Redis
write, inside its delete transaction, holding the fence row's lock)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import structlog
from outbox.app import app

from worker.duties.outbox import OutboxRelay
from worker.outbox import schema as Q

__all__ = ["app"]

HOLD_S = float(os.environ.get("OUTBOX_HOLD_S", "0"))
HOLD_IN = os.environ.get("OUTBOX_HOLD_IN", "read")
log = structlog.get_logger("tests.outbox")
_read = OutboxRelay.read


async def _held_read(self: OutboxRelay, conn: Any) -> list[tuple[Any, ...]]:
    rows = await _read(self, conn)
    if rows and HOLD_S:
        log.info("outbox rows held", rows=len(rows), token=self.token)
        await asyncio.sleep(HOLD_S)
    return rows


async def _held_remove(self: OutboxRelay, conn: Any, ids: list[int]) -> None:
    """:meth:`OutboxRelay.remove` with the hold between the fence and the delete."""
    async with conn.transaction():
        await self._fence(conn)
        log.info("outbox rows held", rows=len(ids), token=self.token)
        await asyncio.sleep(HOLD_S)
        await conn.execute(Q.DELETE, (ids,))


if HOLD_IN == "delete":
    OutboxRelay.remove = _held_remove  # type: ignore[method-assign]
else:
    OutboxRelay.read = _held_read  # type: ignore[method-assign]
