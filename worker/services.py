"""Long-running services (e.g. an IMAP IDLE listener, seed 001): definition and component.

``singleton`` services run in the leader's group (one cluster-wide); ``per_process`` ones run
in every process; ``per_key`` ones run once per key cluster-wide (see :mod:`worker.keyed`).
The function gets ``(ctx, stop)`` (``per_key``: ``(ctx, stop, key)``) and must return soon
after ``stop`` is set; blocking calls belong in ``asyncio.to_thread`` so they never freeze the
loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from worker.clock import Clock
from worker.component import Component
from worker.context import Context
from worker.views import LeaderView

Cardinality = Literal["singleton", "per_process", "per_key"]
ServiceFn = Callable[..., Awaitable[None]]
#: Keys of a per_key service: a fixed collection, or ``(ctx) -> keys`` (sync or async),
#: re-read every round so keys can come and go (e.g. mailboxes configured in a database).
ServiceKeys = Iterable[str] | Callable[[Context], Any]


@dataclass(frozen=True)
class ServiceDef:
    """A long-running loop. ``singleton``: ``fn(ctx, stop)`` on the leader only;
    ``per_process``: ``fn(ctx, stop)`` in every process; ``per_key``: ``fn(ctx, stop, key)``
    once per key cluster-wide, keys spread across all processes (see :mod:`worker.keyed`)."""

    name: str
    fn: ServiceFn
    cardinality: Cardinality = "singleton"
    keys: ServiceKeys | None = None


class Service(Component):
    """Runs one user service until stopped; the supervisor restarts it if it raises.

    A singleton service gets the lease (``leader``): it starts only once the lease has settled
    (a previous holder that lost its lease uncleanly has certainly stopped its copy), and its
    ``stop`` is set the moment leadership is in doubt (the leadership stops its group).
    """

    def __init__(
        self, service: ServiceDef, context: Context, clock: Clock, leader: LeaderView | None = None
    ) -> None:
        super().__init__(f"service:{service.name}", clock)
        self.service = service
        self.context = context
        self.leader = leader

    async def run(self, stop: asyncio.Event) -> None:
        if self.leader is not None and not await self.leader.settled(stop):
            return
        self.health.ok(self.clock.monotonic())
        await self.service.fn(self.context, stop)
