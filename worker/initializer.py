"""The initializer: once per cluster per version, resumable from a fenced checkpoint.

The user's async generator yields ``(cursor, items)`` batches. Each batch's items go into the
poller's shard queues together with the checkpoint in one fenced script, so a leader that dies
mid-way leaves either the whole batch or none of it, and the next leader resumes after the
last written batch instead of starting over. A finished version never runs again; a new
version starts from the beginning.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
from arq.connections import ArqRedis

from worker import keys as K
from worker.app import InitializerDef, PollerDef
from worker.clock import Clock, ms
from worker.component import Component
from worker.context import Context
from worker.fence import run_fenced
from worker.metrics import Metrics

log = structlog.get_logger("worker.initializer")


class Initializer(Component):
    """Runs one initializer to completion (leader only), then finishes."""

    def __init__(
        self,
        *,
        initializer: InitializerDef,
        poller: PollerDef | None,
        context: Context,
        redis: ArqRedis,
        keys: K.Keys,
        lock_value: Callable[[], str | None],
        epoch: Callable[[], int | None],
        metrics: Metrics | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.name = f"initializer:{initializer.name}"
        super().__init__(clock)
        self.init = initializer
        self.poller = poller
        self.context = context
        self.redis = redis
        self.keys = keys
        self.lock_value = lock_value
        self.epoch = epoch
        self.metrics = metrics
        self._begin = redis.register_script(K.INIT_BEGIN)
        self._checkpoint = redis.register_script(K.CHECKPOINT)

    async def run(self, stop: Any) -> None:
        state_key = self.keys.init_state(self.init.name)
        done, cursor_raw, batches, items = await run_fenced(
            self._begin,
            self.lock_value(),
            [self.keys.leader, state_key],
            [self.init.version, ms(self.clock.time()), self.epoch() or 0],
        )
        if _s(done) == "1":
            log.info("initializer already done for this version", version=self.init.version)
            self.health.extra.update(done=True, version=self.init.version)
            return
        cursor = _s(cursor_raw) or None
        self.health.extra.update(done=False, version=self.init.version, items=int(items))
        if cursor is not None:
            log.info(
                "initializer resuming from checkpoint",
                version=self.init.version,
                cursor=cursor,
                batches=int(batches),
                items=int(items),
            )
        else:
            log.info("initializer starting", version=self.init.version)
        total = int(items)
        gen = self.init.fn(self.context, cursor)
        try:
            async for next_cursor, batch in gen:
                if stop.is_set():
                    return
                added = await self._write(cursor, str(next_cursor), batch or {}, last=False)
                cursor = str(next_cursor)
                total += added
                self.health.ok(self.clock.monotonic())
                self.health.extra["items"] = total
        finally:
            await gen.aclose()
        if stop.is_set():
            return
        await self._write(cursor, cursor or "", {}, last=True)
        self.health.extra["done"] = True
        log.info("initializer done", version=self.init.version, items=total)

    async def _write(self, cursor: str | None, next_cursor: str, items: Any, *, last: bool) -> int:
        shard_keys: list[str] = []
        args: list[str | int] = [
            self.init.version,
            cursor or "",
            next_cursor,
            "1" if last else "0",
            ms(self.clock.time()),
        ]
        if items:
            if self.poller is None:
                raise ValueError(
                    f"initializer {self.init.name!r} yielded items but declares no poller"
                )
            now = self.clock.time()
            index: dict[int, int] = {}
            for item, due in items.items():
                shard = self.poller.shard_of(str(item))
                if shard not in index:
                    shard_keys.append(self.keys.poll_shard(self.poller.name, shard))
                    index[shard] = len(shard_keys) + 2  # KEYS index (1-based, after lock/state)
                args += [index[shard], ms(float(due) if due else now), str(item)]
        keys = [self.keys.leader, self.keys.init_state(self.init.name), *shard_keys]
        added, _batches = await run_fenced(self._checkpoint, self.lock_value(), keys, args)
        if self.metrics is not None:
            self.metrics.init_items.labels(self.init.name).inc(int(added))
        return int(added)


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
