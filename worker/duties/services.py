"""Long-running services (e.g. an IMAP IDLE mailbox listener): definition and component.

``singleton`` services run in the leader's group (one cluster-wide); ``per_process`` ones run
in every process; ``per_key`` ones run once per key cluster-wide (see :mod:`worker.duties.keyed`).
The function gets ``(ctx, stop)`` (``per_key``: ``(ctx, stop, key)``) and must return soon
after ``stop`` is set; blocking calls belong in ``asyncio.to_thread`` so they never freeze the
loop.

Health is progress: a service declared with ``sla_s`` must report progress within that many
seconds, or ``/healthz`` fails on the process running it. It reports by calling
``ctx.alive()`` (each loop gets a context bound to its own health: the service's, or for
``per_key`` the key loop's), or, written as an async generator, by yielding::

    @app.service(sla_s=60)
    async def mailbox(ctx, stop):
        while not stop.is_set():
            await fetch_new_mail()
            yield            # progress: same as ctx.alive()
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from worker.core.clock import Clock
from worker.core.component import Component
from worker.core.views import ContextView, LeaderView

Cardinality = Literal["singleton", "per_process", "per_key"]
#: ``async def fn(ctx, stop[, key])``, or an async generator whose every yield reports progress.
ServiceFn = Callable[..., Any]
#: Keys of a per_key service: a fixed collection, or ``(ctx) -> keys`` (sync or async; ``ctx``
#: the job context, a :class:`worker.Context`),
#: re-read every round so keys can come and go (e.g. mailboxes configured in a database).
ServiceKeys = Iterable[str] | Callable[[Any], Any]


class LeaseStop(asyncio.Event):
    """A singleton service's ``stop``: set when the component is stopped, and it *reads* as
    set (``is_set()``) the moment its lease is no longer certainly valid by this process's
    own clock (the renew deadline passed). After a freeze longer than the lease (a starved
    CPU, a blocked loop, ``SIGSTOP``) the thawed loop may run the service's next step before
    the elector's step-down; the service's own check, ``while not stop.is_set()``, then ends
    it instead of acting beside the next holder. What it saw stands: the leadership is
    declared lost at once (``LeaderView.lost``), so the lease never counts again."""

    def __init__(self, leader: LeaderView, epoch: int) -> None:
        super().__init__()
        self._leader = leader
        self._epoch = epoch

    def is_set(self) -> bool:
        if super().is_set():
            return True
        leader = self._leader
        if leader.epoch != self._epoch:
            return True  # another lease (or none): this one's group is being stopped
        if leader.is_leading():
            return False
        leader.lost("the lease's renew deadline passed (seen by a singleton service)")
        return True


@dataclass(frozen=True)
class ServiceDef:
    """A long-running loop. ``singleton``: ``fn(ctx, stop)`` on the leader only;
    ``per_process``: ``fn(ctx, stop)`` in every process; ``per_key``: ``fn(ctx, stop, key)``
    once per key cluster-wide, keys spread across all processes (see :mod:`worker.duties.keyed`).
    ``sla_s``: each loop must report progress (``ctx.alive()`` or a yield) within this many
    seconds to count as live (``None``: alive is enough)."""

    name: str
    fn: ServiceFn
    cardinality: Cardinality = "singleton"
    keys: ServiceKeys | None = None
    sla_s: float | None = None


async def run_service(fn: ServiceFn, context: ContextView, *args: Any) -> None:
    """Run a service function to its end: a coroutine is awaited; an async generator is
    iterated, each yield reporting progress through ``context.alive()``."""
    result = fn(context, *args)
    if inspect.isasyncgen(result):
        try:
            async for _ in result:
                context.alive()
        finally:
            await result.aclose()
    elif isinstance(result, Awaitable):
        await result


class Service(Component):
    """Runs one user service until stopped; the supervisor restarts it if it raises.

    A singleton service gets the lease (``leader``): it starts only once the lease has settled
    (a previous holder that lost its lease uncleanly has certainly stopped its copy), runs
    with the lease's epoch as its ``ctx.fencing_token()``, and its ``stop`` is set the moment
    leadership is in doubt (the leadership stops its group).
    """

    def __init__(
        self,
        service: ServiceDef,
        context: ContextView,
        clock: Clock,
        leader: LeaderView | None = None,
    ) -> None:
        super().__init__(f"service:{service.name}", clock, sla_s=service.sla_s)
        self.service = service
        self.context = context.bound(self.alive)
        self.leader = leader

    def alive(self) -> None:
        """The service made progress (``ctx.alive()``)."""
        self.health.ok(self.clock.monotonic())

    async def run(self, stop: asyncio.Event) -> None:
        if self.leader is not None:
            self.health.state = "waiting"  # owes no progress until the lease has settled
            try:
                if not await self.leader.settled(stop):
                    return
            finally:
                if self.health.state == "waiting":
                    self.health.state = "running"
        context = self.context
        if self.leader is not None:
            epoch = self.leader.epoch  # read with no await since settled(): this lease's
            if epoch is None:
                return
            context = context.under(epoch)
            bound = LeaseStop(self.leader, epoch)
            relay = asyncio.ensure_future(_follow(stop, bound))
            try:
                await self._run(context, bound)
            finally:
                relay.cancel()
            return
        await self._run(context, stop)

    async def _run(self, context: ContextView, stop: asyncio.Event) -> None:
        self.health.started = self.clock.monotonic()
        self.alive()
        await run_service(self.service.fn, context, stop)


async def _follow(stop: asyncio.Event, bound: asyncio.Event) -> None:
    """Set ``bound`` once ``stop`` is set (a stopped component's waiters wake)."""
    await stop.wait()
    bound.set()
