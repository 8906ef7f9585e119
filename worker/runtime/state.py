"""What one worker process is doing, as the heartbeat and the health server read it: its
identity, its groups of components and the flags the runtime flips. The runtime keeps it up
to date; components see it only through :class:`~worker.core.views.ProcessView`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from worker.core.clock import Clock
from worker.core.component import Component, Group
from worker.core.views import LeaseReading
from worker.settings import Settings


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
    lease: LeaseReading | None = None
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
