"""Narrow views components get instead of the runtime: the lease and the process.

Oban's ``Peer.leader?/1`` is the model: components ask "am I leading, with which lock value?"
and report a refused fenced write with one call; the heartbeat and the health server read what
the process is doing through :class:`ProcessView` (implemented by
:class:`~worker.runtime.state.ProcessState`, which the runtime keeps up to
date); the duties that run app code hand it the process's job context through
:class:`ContextView` (implemented by :class:`~worker.context.Context`). Nothing here holds the
runtime itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol, Self

from worker.core.ids import LockValue


class LeaderView(Protocol):
    """The lease as a component sees it (implemented by every leadership implementation)."""

    @property
    def lock(self) -> LockValue | None:
        """The lock value this process holds, or ``None`` when it does not lead."""

    @property
    def epoch(self) -> int | None:
        """The epoch of the lease this process holds, or ``None``."""

    def is_leading(self) -> bool:
        """``True`` while this process holds the lease. Cheap; never raises; in doubt (a
        refused write, another leader announced, its renew deadline passed), no."""

    def lost(self, reason: str) -> None:
        """Report that a fenced write was refused: step down at once (idempotent)."""

    async def settled(self, stop: asyncio.Event) -> bool:
        """Wait until singleton services may start on this lease (the previous holder has
        certainly stopped); ``False`` if ``stop`` was set or leadership ended first."""


class ProcessView(Protocol):
    """What the heartbeat publishes and the health server serves about this process."""

    @property
    def ready(self) -> bool:
        """``True`` once started, ``False`` from the moment shutdown was requested."""

    @property
    def shutting_down(self) -> bool: ...

    def describe(self) -> dict[str, Any]:
        """State: components, leadership, in-flight jobs, readiness, uptime."""

    def identity(self) -> dict[str, Any]:
        """Who this is: instance id and name, role, plan, settings (secrets masked)."""

    def component_health(self) -> dict[str, dict[str, Any]]:
        """Each component's health snapshot by name."""

    def unready_reasons(self) -> list[str]:
        """Why running components hold the process unready (failing dependency checks, Redis
        unavailable)."""

    def warnings(self) -> list[str]:
        """Problems running components report without failing a probe (stale periodic jobs)."""


class LeaseReading(Protocol):
    def is_leading(self) -> bool: ...

    @property
    def epoch(self) -> int | None: ...

    def lease_age(self) -> float | None: ...


class ContextView(Protocol):
    """The process's job context as the duties that run app code see it (services, per-key
    loops, initializers, dependency checks): they hand it to the app's functions, a copy bound
    to their own health (:meth:`bound`), under a lease's epoch for a singleton's run
    (:meth:`under`), and report progress through it (:meth:`alive`)."""

    def alive(self) -> None: ...

    def bound(self, progress: Callable[[], None]) -> Self: ...

    def under(self, epoch: int) -> Self: ...
