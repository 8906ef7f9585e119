"""Narrow views components get instead of the runtime: the lease and the process.

Oban's ``Peer.leader?/1`` is the model: components ask "am I leading, with which lock value?"
and report a refused fenced write with one call; the heartbeat and the health server read what
the process is doing through :class:`ProcessView` (implemented by :class:`ProcessState`, which
the runtime keeps up to date). Nothing here holds the runtime itself.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Protocol

from worker.clock import Clock
from worker.component import Component, Group
from worker.ids import LockValue
from worker.settings import Settings


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


class _Lease(Protocol):
    def is_leading(self) -> bool: ...

    @property
    def epoch(self) -> int | None: ...

    def lease_age(self) -> float | None: ...


@dataclass
class ProcessState:
    """The :class:`ProcessView` of one worker process: its identity, its groups of components
    and the flags the runtime flips (ready, shutting down)."""

    settings: Settings
    instance_id: str
    clock: Clock
    enabled: list[str]
    disabled: list[str]
    groups: dict[str, Group] = field(default_factory=dict)
    lease: _Lease | None = None
    ready: bool = False
    shutting_down: bool = False
    started_at: float = 0.0

    def component(self, name: str) -> Component | None:
        return next((c for g in self.groups.values() for c in g.components if c.name == name), None)

    def describe(self) -> dict[str, Any]:
        lease, consumer = self.lease, self.component("consumer")
        age = lease.lease_age() if lease is not None else None
        return {
            "components": self.enabled,
            "health_port": getattr(self.component("health-server"), "port", None),
            "is_leader": bool(lease is not None and lease.is_leading()),
            "epoch": lease.epoch if lease is not None else None,
            "lease_age_s": round(age, 3) if age is not None else None,
            "in_flight": getattr(consumer, "in_flight", 0),
            "ready": self.ready and not self.unready_reasons(),
            "unready": self.unready_reasons(),
            "uptime_s": round(self.clock.monotonic() - self.started_at, 1),
            "health": self.health_summary(),
        }

    def health_summary(self) -> dict[str, str]:
        """One word per running component for the heartbeat record: ``ok``, ``overdue``,
        ``crash-looping``, or its state when at rest or backing off."""
        now, out = self.clock.monotonic(), {}
        for c in (c for g in self.groups.values() for c in g.components):
            h = c.health
            if not h.active:
                continue
            if h.crash_looping(now):
                out[c.name] = "crash-looping"
            elif h.overdue(now):
                out[c.name] = "overdue"
            else:
                out[c.name] = "ok" if h.state == "running" else h.state
        return out

    def identity(self) -> dict[str, Any]:
        s = self.settings
        return {
            "instance_id": self.instance_id,
            "instance_name": s.instance_name,
            "role": s.role,
            "plan": {"enabled": self.enabled, "disabled": self.disabled},
            "settings": s.redacted(),
        }

    def unready_reasons(self) -> list[str]:
        active = [c for g in self.groups.values() for c in g.components if c.health.active]
        return [r for c in active for r in c.health.not_ready()]

    def warnings(self) -> list[str]:
        active = [c for g in self.groups.values() for c in g.components if c.health.active]
        return [w for c in active for w in c.health.warnings]

    def component_health(self) -> dict[str, dict[str, Any]]:
        now = self.clock.monotonic()
        errors = self.settings.status_show_errors  # error texts can carry job data
        return {
            c.name: c.health.snapshot(now, errors=errors)
            for g in self.groups.values()
            for c in g.components
        }
