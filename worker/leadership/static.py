"""The static leader: always leader, for single-node deployments and tests."""

from __future__ import annotations

import asyncio
from uuid import uuid4

import structlog

from worker.core.clock import Clock, ms
from worker.core.ids import LockValue
from worker.core.metrics import Metrics
from worker.leadership.base import Leadership
from worker.storage import Store

log = structlog.get_logger("worker.leader")


class StaticLeader(Leadership):
    """Always leader: for single-node deployments and tests (Oban's ``Isolated`` peer).

    It takes the lock unconditionally so the fenced scripts work unchanged, with a TTL it
    renews every ``ttl_s / 3`` (a killed static leader's lock expires). Two static leaders on
    one Redis fence each other out repeatedly: use it only where one process runs.
    """

    def __init__(
        self,
        store: Store,
        clock: Clock,
        *,
        metrics: Metrics | None = None,
        retry_s: float = 1.0,
        ttl_s: float = 10.0,
    ) -> None:
        super().__init__(clock, metrics=metrics)
        self.store = store
        self.retry_s = retry_s
        self.ttl_s = ttl_s
        self.token = uuid4().hex

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if self._lock is None:
                self._elected(await self.store.claim_static(self.token, ms(self.ttl_s)))
            elif not await self._renew(self._lock):
                self.lost("the static lease expired or was taken")
            self.health.ok(self.clock.monotonic())
            await self.clock.wait((stop, self._lost), self.ttl_s / 3)
            if self._lost.is_set() and not stop.is_set():
                await self._step_down(self._lost_reason or "fenced write refused")
                await self.clock.wait(stop, self.retry_s)

    async def _renew(self, lock: LockValue) -> bool:
        """Renew the lease; False only when it is no longer ours (errors: try again later)."""
        try:
            return bool(await self.store.renew_lock(lock, ms(self.ttl_s)))
        except Exception as exc:
            log.warning("static lease renew failed", error=f"{type(exc).__name__}: {exc}")
            return True

    async def release(self) -> None:
        lock = self._forget()
        if lock is None:
            return
        try:
            await self.store.release_lock(lock)
        except Exception as exc:
            log.warning("static lease release failed", error=str(exc))
