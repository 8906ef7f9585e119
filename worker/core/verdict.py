"""What a doctor check answers (:class:`Check`), the thresholds it judges by (:class:`Limits`)
and the phrases the checks share: the doctor's vocabulary, which the duty kinds' own checks
(:mod:`worker.core.dutykinds`) speak too."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from worker.core.redisurl import Replication


class _Settings(Protocol):
    """What :meth:`Limits.from_settings` reads of :class:`worker.settings.Settings`."""

    @property
    def orphan_stale_s(self) -> float: ...
    @property
    def allow_eviction(self) -> bool: ...
    def replication(self) -> Replication: ...


Status = Literal["ok", "warn", "fail"]
MARKS: dict[str, str] = {"ok": "✓", "warn": "!", "fail": "✗"}


@dataclass(frozen=True)
class Check:
    """One line of the checklist: ``name``, its verdict, a one-line ``summary``, optional
    ``details`` lines (the offending instances, jobs…) and machine-readable ``data``."""

    name: str
    status: Status
    summary: str
    details: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status != "fail"


@dataclass(frozen=True)
class Limits:
    """Thresholds. ``stale_s``: a heartbeat older than this is stale (default: the orphan
    bound, after which the leader re-queues the instance's jobs); ``max_skew_s``: how far an
    instance's clock may be from the Redis server's; ``max_lag_s``: how long the oldest due
    job or poll item may wait; ``tick_grace_s``: how late a due tick may be before its job
    counts as overdue."""

    stale_s: float = 10.0
    max_skew_s: float = 1.0
    max_lag_s: float = 60.0
    tick_grace_s: float = 30.0
    allow_eviction: bool = False
    #: the WAIT policy the workers run with (``durability`` judges the primary against it)
    replication: Replication = field(default_factory=Replication)

    @classmethod
    def from_settings(cls, settings: _Settings) -> Limits:
        return cls(
            stale_s=settings.orphan_stale_s,
            allow_eviction=settings.allow_eviction,
            replication=settings.replication(),
        )


def num(count: int, noun: str, plural: str | None = None) -> str:
    """``3 instances``, ``1 instance`` (``plural`` where it is not ``noun`` + s)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def iso(at_ms: Any) -> str | None:
    """A time in ms as ISO 8601 UTC to the second (``None`` stays ``None``)."""
    if at_ms is None:
        return None
    return dt.datetime.fromtimestamp(int(at_ms) / 1000, dt.UTC).isoformat(timespec="seconds")


def ago(at_ms: Any, now_ms: int) -> str:
    """How long before ``now_ms`` a time was, as ``12s ago``."""
    return "?" if at_ms is None else f"{max(0.0, (now_ms - int(at_ms)) / 1000):.0f}s ago"
