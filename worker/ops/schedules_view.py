"""Run-time schedules in ``status`` and the console: one row per stored schedule, beside the
app's code schedules (the ``periodic`` rows)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from worker.core.ids import duty
from worker.duties.schedules import KIND
from worker.ops.model import ClusterSnapshot


def _iso(at_ms: int | None) -> str | None:
    if at_ms is None:
        return None
    return dt.datetime.fromtimestamp(at_ms / 1000, dt.UTC).isoformat(timespec="seconds")


def rows(snap: ClusterSnapshot) -> list[dict[str, Any]]:
    """``status``'s ``schedules`` (pure): each schedule's definition, its newest planned tick
    (enqueued, or skipped by its policy), its next tick and the ticks skipped for overlap."""
    out = []
    for name in sorted(snap.schedules):
        spec = snap.schedules[name]
        last = snap.schedule_last.get(name)
        upcoming = spec.schedule.next(max(snap.now_ms, last or -1))
        out.append(
            {
                **spec.as_dict(),
                "schedule": spec.describe(),
                "last_tick": _iso(last),
                "last_tick_ms": last,
                "next_tick": _iso(upcoming),
                "next_tick_ms": upcoming,
                "overlaps_skipped": snap.schedule_overlaps.get(name, 0),
                "paused": duty(KIND, name) in snap.paused,
            }
        )
    return out


def table(status: dict[str, Any], render: Any) -> list[str]:
    """The ``SCHEDULE`` table of ``status``'s text (``render``: its table maker)."""
    found = status.get("schedules") or []
    if not found:
        return []
    head = ["SCHEDULE", "TASK", "WHEN", "LAST TICK", "NEXT TICK", "OVERLAP", "SKIPPED"]
    body = [
        [s["name"] + (" (PAUSED)" if s.get("paused") else ""), s["task"], s["schedule"],
         s["last_tick"] or "never", s["next_tick"], s["overlap"], s["overlaps_skipped"]]
        for s in found
    ]  # fmt: skip
    return ["", *render(head, body)]
