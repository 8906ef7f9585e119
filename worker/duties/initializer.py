"""Initializers, whole: once per cluster per version, resumable from a fenced checkpoint.

The user's async generator yields ``(cursor, items)`` batches. Each batch's items go into the
poller's shard queues together with the checkpoint in one fenced script, so a leader that dies
mid-way leaves either the whole batch or none of it, and the next leader resumes after the
last written batch instead of starting over. A finished version never runs again; a new
version starts from the beginning.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from worker.core.clock import Clock, ms
from worker.core.component import Component
from worker.core.dutykinds import Kind, RowContext, table
from worker.core.kindcolumns import Cell, Column, field
from worker.core.metrics import Metrics
from worker.core.views import ContextView
from worker.polls import PollerDef
from worker.storage.store import FencedStore, Store

log = structlog.get_logger("worker.initializer")

#: When an item is due: epoch seconds or an aware datetime (absolute), or a timedelta from now.
Due = float | dt.datetime | dt.timedelta
InitBatch = tuple[str, Mapping[str, Due] | None]
#: ``fn(ctx, cursor)``, ``ctx`` the process's job context (a :class:`worker.Context`)
InitFn = Callable[[Any, str | None], AsyncGenerator[InitBatch, None]]


@dataclass(frozen=True)
class InitializerDef:
    """Runs once per cluster per ``version`` on the leader, resumable from its checkpoint.

    The function is an async generator ``fn(ctx, cursor)`` starting after ``cursor`` (``None``
    on a fresh run) and yielding ``(next_cursor, items)``: ``items`` maps poll items to when
    they are due for ``poller`` — an absolute time (epoch seconds or an aware ``datetime``; 0 =
    due now) or a delay from now (a ``timedelta``: ``{card: timedelta(seconds=30)}``) — or is
    ``None`` when the batch did its own (idempotent) writes. Each batch and its checkpoint are
    written atomically.
    """

    name: str
    fn: InitFn
    version: str
    poller: str | None = None


class Initializer(Component):
    """Runs one initializer to completion (leader only), then finishes."""

    def __init__(
        self,
        initializer: InitializerDef,
        poller: PollerDef | None,
        context: ContextView,
        store: FencedStore,
        clock: Clock,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(f"initializer:{initializer.name}", clock)
        self.init = initializer
        self.poller = poller
        self.context = context
        self.store = store
        self.metrics = metrics

    async def run(self, stop: asyncio.Event) -> None:
        i = self.init
        progress = await self.store.init_begin(i.name, i.version, ms(self.clock.time()))
        if progress.done:
            log.info("initializer already done for this version", version=i.version)
            self.health.extra.update(done=True, version=i.version)
            return
        cursor = progress.cursor
        self.health.extra.update(done=False, version=i.version, items=progress.items)
        if cursor is not None:
            log.info(
                "initializer resuming from checkpoint",
                version=i.version,
                cursor=cursor,
                batches=progress.batches,
                items=progress.items,
            )
        else:
            log.info("initializer starting", version=i.version)
        total = progress.items
        gen = i.fn(self.context, cursor)
        try:
            async for next_cursor, batch in gen:
                if stop.is_set():
                    return
                total += await self._write(cursor, str(next_cursor), batch or {}, last=False)
                cursor = str(next_cursor)
                self.health.ok(self.clock.monotonic())
                self.health.extra["items"] = total
        finally:
            await gen.aclose()
        if stop.is_set():
            return
        await self._write(cursor, cursor or "", {}, last=True)
        self.health.extra["done"] = True
        log.info("initializer done", version=i.version, items=total)

    async def _write(
        self, cursor: str | None, next_cursor: str, items: Mapping[str, Due], *, last: bool
    ) -> int:
        rows: list[tuple[str, int, str]] = []
        if items:
            if self.poller is None:
                raise ValueError(
                    f"initializer {self.init.name!r} yielded items but declares no poller"
                )
            now = self.clock.time()
            keys = self.store.keys
            for item, due in items.items():
                if isinstance(due, dt.timedelta):
                    due = now + due.total_seconds()
                elif isinstance(due, dt.datetime):
                    due = due.timestamp()
                shard = keys.poll_shard(self.poller.name, self.poller.shard_of(str(item)))
                rows.append((shard, ms(float(due) if due else now), str(item)))
        added = await self.store.checkpoint(
            self.init.name,
            self.init.version,
            cursor,
            next_cursor,
            last=last,
            now_ms=ms(self.clock.time()),
            items=rows,
        )
        if self.metrics is not None:
            self.metrics.init_items.labels(self.init.name).inc(added)
        return added


# -- the operator side's view of initializers (see worker.core.dutykinds) ----------------------
async def _read(store: Store, app: Any, now_ms: int) -> dict[str, dict[str, str]]:
    """Each initializer's state hash."""
    return {i.name: await store.init_state(i.name) for i in app.initializers.values()}


def _rows(state: dict[str, dict[str, str]], app: Any, at: RowContext) -> list[dict[str, Any]]:
    out = []
    for init in app.initializers.values():
        st, version = state.get(init.name, {}), init.version
        out.append(
            {
                "name": init.name,
                "version": version,
                "stored_version": st.get("version"),
                "done": st.get("done") == "1" and st.get("version") == version,
                "batches": int(st.get("batches", 0)),
                "items": int(st.get("items", 0)),
                "cursor": st.get("cursor") or None,
            }
        )
    return out


def _render(rows: list[dict[str, Any]], at: str) -> list[str]:
    if not rows:
        return []
    head = ["INITIALIZER", "VERSION", "DONE", "BATCHES", "ITEMS", "CURSOR"]
    cells = [
        [
            i["name"],
            i["version"],
            "yes" if i["done"] else "no",
            i["batches"],
            i["items"],
            i["cursor"],
        ]
        for i in rows
    ]
    return ["", *table(head, cells)]


COLUMNS = (
    Column("initializer", lambda r, now: r["name"]),
    field("version"),
    field("stored_version"),
    field("batches", "num"),
    field("items", "num"),
    field("cursor"),
    Column(
        "done",
        lambda r, now: Cell("done", "good") if r["done"] else Cell("in progress", "warn"),
    ),
)


KIND = Kind(
    name="initializer",
    noun="initializer",
    plural="initializers",
    status_key="initializers",
    declared=lambda app: app.initializers,
    read=_read,
    rows=_rows,
    render=_render,
    columns=COLUMNS,
)
