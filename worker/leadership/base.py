"""What every leadership implementation shares: the lease state, transitions and listeners.

A :class:`Leadership` only elects and steps down; what runs while leading is not its business.
Whatever must start on election and stop on losing the lease registers a
:class:`LeadershipListener` (:class:`~worker.leadership.maintainer.LeaderWork` starts the
singleton group), as river's ``QueueMaintainerLeader`` listens to its elector. "Am I leader?"
never raises: in doubt the answer is no.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

import structlog

from worker.core.clock import Clock
from worker.core.component import Component
from worker.core.ids import EPOCH_LIMIT, LockValue
from worker.core.metrics import Metrics

log = structlog.get_logger("worker.leader")

NAME = "leader-election"


@dataclass(frozen=True)
class LeaderTiming:
    """Lease timings in seconds; ``renew_interval < renew_deadline < ttl``."""

    ttl_s: float = 10.0
    renew_interval_s: float = 2.0
    renew_deadline_s: float = 6.0
    poll_interval_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.renew_interval_s < self.renew_deadline_s < self.ttl_s:
            raise ValueError("leader timing must satisfy renew_interval < renew_deadline < ttl")


class LeadershipListener(Protocol):
    """Told of every transition of a :class:`Leadership`, in order."""

    def elected(self, lock: LockValue) -> None:
        """The lease was acquired (never called again after :meth:`retire`)."""

    async def stepped_down(self, lock: LockValue, reason: str) -> None:
        """The lease was lost or given up: return once whatever ran under it has stopped."""

    async def retire(self) -> None:
        """Shutdown: stop for good."""


class Leadership(Component):
    """The lease state every implementation shares; implements
    :class:`~worker.core.views.LeaderView`. Transitions are announced to the registered
    :class:`LeadershipListener` s (:meth:`listen`)."""

    def __init__(
        self,
        clock: Clock,
        *,
        metrics: Metrics | None = None,
        sla_s: float | None = None,
    ) -> None:
        super().__init__(NAME, clock, sla_s=sla_s)
        self.metrics = metrics
        self.listeners: list[LeadershipListener] = []
        self._lock: LockValue | None = None
        self._lost = asyncio.Event()
        self._lost_reason = ""
        self._acquired_at: float | None = None
        self._settled_at: float | None = None
        self._retired = False
        #: The highest epoch this process has seen: its next acquisition goes above it, so
        #: epochs never go backwards, not even when Redis loses its data.
        self.floor = 0

    def listen(self, listener: LeadershipListener) -> None:
        """Tell ``listener`` of every election and step-down from now on."""
        self.listeners.append(listener)

    # -- LeaderView ---------------------------------------------------------------------------
    @property
    def lock(self) -> LockValue | None:
        return self._lock

    @property
    def epoch(self) -> int | None:
        return self._lock.epoch if self._lock is not None else None

    def is_leading(self) -> bool:
        return self._lock is not None and not self._lost.is_set() and self._fresh()

    def _fresh(self) -> bool:
        """Whether the lease is certainly still valid by this process's own clock."""
        return True

    def lost(self, reason: str) -> None:
        if self._lock is not None and not self._lost.is_set():
            self._lost_reason = reason
            self._lost.set()

    async def settled(self, stop: asyncio.Event) -> bool:
        """Wait out the safety gap of this lease (see ``election.ACQUIRE``): ``True`` once
        singleton services may start, ``False`` if stopped or no longer leading first."""
        settled_at = self._settled_at
        if settled_at is not None:
            remaining = settled_at - self.clock.monotonic()
            if remaining > 0 and await self.clock.wait(stop, remaining):
                return False
        return self.is_leading() and not stop.is_set()

    def note_epoch(self, epoch: int) -> None:
        """Remember an epoch read from this process's own database (the lock, a refused
        campaign's holder), never one heard on a channel. Out of range (``< 0`` or ``>=
        2^53``): ignored. The script the floor goes to (``election.ACQUIRE``) also checks it
        against the server's clock and names a floor it ignores (:meth:`floor_refused`)."""
        if 0 <= epoch < EPOCH_LIMIT:
            self.floor = max(self.floor, epoch)

    def floor_refused(self, known: int = 0) -> None:
        """The lease script ignored this process's floor (far ahead of the server's clock:
        not an epoch it issued): forget it, keep ``known`` (an epoch just read and checked)."""
        self.floor = max(0, min(known, EPOCH_LIMIT - 1))

    # -- introspection ------------------------------------------------------------------------
    def lease_age(self) -> float | None:
        if self._acquired_at is None or self._lock is None:
            return None
        return self.clock.monotonic() - self._acquired_at

    # -- transitions --------------------------------------------------------------------------
    def _elected(self, lock: LockValue, gap_s: float = 0.0) -> None:
        self._lock = lock
        self.note_epoch(lock.epoch)
        self._acquired_at = self.clock.monotonic()
        self._settled_at = self._acquired_at + gap_s
        self._lost = asyncio.Event()
        self.health.extra.update(is_leader=True, epoch=lock.epoch)
        log.info("leadership acquired", epoch=lock.epoch)
        if gap_s > 0:
            log.warning(
                "the previous lease was not released cleanly (expired, deleted or lost with "
                "Redis's data): singleton services wait until its holder has certainly stopped",
                epoch=lock.epoch,
                wait_s=round(gap_s, 3),
            )
        if self.metrics is not None:
            self.metrics.is_leader.set(1)
            self.metrics.leader_epoch.set(lock.epoch)
            self.metrics.leader_transitions.labels("acquired").inc()
        if not self._retired:
            for listener in self.listeners:
                listener.elected(lock)

    def _forget(self) -> LockValue | None:
        lock, self._lock, self._acquired_at = self._lock, None, None
        self._settled_at = None
        self.health.extra.update(is_leader=False, epoch=None)
        if self.metrics is not None:
            self.metrics.is_leader.set(0)
            self.metrics.leader_epoch.set(0)
        return lock

    async def _step_down(self, reason: str, *, planned: bool = False) -> LockValue | None:
        """Forget the lease and wait for the listeners to stop what ran under it; returns the
        lock given up."""
        lock = self._forget()
        if lock is None:
            return None
        self.health.extra["last_loss"] = reason
        if planned:
            log.info("stepping down", epoch=lock.epoch, reason=reason)
        else:
            log.warning("leadership lost; stepping down", epoch=lock.epoch, reason=reason)
        if self.metrics is not None:
            self.metrics.leader_transitions.labels("lost").inc()
        for listener in self.listeners:
            await listener.stepped_down(lock, reason)
        return lock

    async def retire(self) -> None:
        """Shutdown, step one: start no leader-only work again and stop what runs."""
        self._retired = True
        for listener in self.listeners:
            await listener.retire()

    async def release(self) -> None:
        """Shutdown, last step: give the lease up so a standby takes over at once."""
