"""Long-running services (e.g. an IMAP IDLE listener, seed 001) as supervised components.

``singleton`` services run in the leader's group (one cluster-wide); ``per_process`` ones run
in every process. Either way the function gets ``(ctx, stop)`` and must return soon after
``stop`` is set; blocking calls belong in ``asyncio.to_thread`` so they never freeze the loop.
"""

from __future__ import annotations

import asyncio

from worker.app import ServiceDef
from worker.clock import Clock
from worker.component import Component
from worker.context import Context


class Service(Component):
    """Runs one user service until stopped; the supervisor restarts it if it raises."""

    def __init__(self, service: ServiceDef, context: Context, clock: Clock | None = None) -> None:
        self.name = f"service:{service.name}"
        super().__init__(clock)
        self.service = service
        self.context = context

    async def run(self, stop: asyncio.Event) -> None:
        self.health.ok(self.clock.monotonic())
        await self.service.fn(self.context, stop)
