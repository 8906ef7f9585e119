"""The app manifest: what an app declares, as plain data in Redis, so that admin commands
(``status``, ``doctor``, ``trigger``, ``pause``) describe the app that is actually running.

Every process writes its app's manifest at start (``<prefix>apps``: app name -> JSON). An admin
command without ``--app`` rebuilds a *described* :class:`~worker.app.App` from it: the same
names, schedules, shard counts, versions and queues, with functions that refuse to run. So a
second terminal needs only the Redis URL, and never describes another app by mistake.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, NoReturn

from worker.app import App
from worker.core.errors import ConfigError
from worker.core.jobdefs import JobDef
from worker.core.schedule import Cron, Every, Schedule
from worker.duties.checks import HealthCheckDef
from worker.duties.initializer import InitBatch, InitializerDef
from worker.duties.periodic import PeriodicDef
from worker.duties.services import ServiceDef
from worker.polls import PollerDef
from worker.version import __version__

#: Bumped when the manifest's shape changes incompatibly; older readers ignore newer shapes.
FORMAT = 1


def manifest(app: App, *, written_ms: int) -> dict[str, Any]:
    """``app`` as JSON-able data (no functions, no secrets)."""
    return {
        "format": FORMAT,
        "name": app.name,
        "version": __version__,
        "written_ms": written_ms,
        "queues": app.queue_names(),
        "tasks": [
            {"name": j.name, "queue": j.queue, **({"fair": True} if j.fair else {})}
            for j in app.tasks.values()
        ],
        "periodics": [
            {
                "name": p.name,
                "schedule": _schedule(p.schedule),
                "catch_up": p.catch_up,
                "catch_up_limit": p.catch_up_limit,
                "catch_up_window_s": p.catch_up_window_s,
                "timeout_s": p.timeout_s,
                "queue": p.queue,
                "max_staleness_s": p.max_staleness_s,
            }
            for p in app.periodics.values()
        ],
        "pollers": [
            {
                "name": p.name,
                "task": p.task,
                "shards": p.shards,
                "batch_size": p.batch_size,
                "interval_s": p.interval_s,
            }
            for p in app.pollers.values()
        ],
        "initializers": [
            {"name": i.name, "version": i.version, "poller": i.poller}
            for i in app.initializers.values()
        ],
        "services": [
            {"name": s.name, "cardinality": s.cardinality, "sla_s": s.sla_s}
            for s in app.services.values()
        ],
        "health_checks": [
            {"name": c.name, "timeout_s": c.timeout_s, "interval_s": c.interval_s}
            for c in app.health_checks.values()
        ],
        "broadcast_topics": sorted({b.topic for b in app.broadcasts}),
    }


def dumps(app: App, *, written_ms: int) -> str:
    return json.dumps(manifest(app, written_ms=written_ms), separators=(",", ":"))


@dataclass(frozen=True)
class Described:
    """An app as its manifest describes it, and when that was written."""

    app: App
    version: str
    written_ms: int


def describe(data: dict[str, Any]) -> Described:
    """Rebuild a described :class:`App` from a manifest; :class:`ConfigError` if unreadable."""
    try:
        if int(data.get("format", 0)) != FORMAT:
            raise ValueError(f"manifest format {data.get('format')!r}")
        app = App(str(data["name"]), queues=tuple(data["queues"]))
        for t in data["tasks"]:
            fair = t.get("fair") is True  # status shows a fair queue's flow keys
            app.tasks[t["name"]] = JobDef(t["name"], _not_here, queue=t["queue"], fair=fair)
        for p in data["periodics"]:
            app.periodics[p["name"]] = PeriodicDef(
                p["name"],
                _not_here,
                _parse_schedule(p["schedule"]),
                p["catch_up"],
                int(p["catch_up_limit"]),
                p["timeout_s"],
                p["catch_up_window_s"],
                queue=p["queue"],
                max_staleness_s=p["max_staleness_s"],
            )
        for p in data["pollers"]:
            app.pollers[p["name"]] = PollerDef(
                p["name"], p["task"], int(p["shards"]), int(p["batch_size"]), p["interval_s"]
            )
        for i in data["initializers"]:
            app.initializers[i["name"]] = InitializerDef(
                i["name"], _no_batches, i["version"], poller=i["poller"]
            )
        for s in data["services"]:
            app.services[s["name"]] = ServiceDef(
                s["name"], _not_here, s["cardinality"], sla_s=s["sla_s"]
            )
        for c in data["health_checks"]:
            app.health_checks[c["name"]] = HealthCheckDef(
                c["name"], _not_here, c["timeout_s"], c["interval_s"]
            )
        return Described(app, str(data.get("version", "?")), int(data.get("written_ms", 0)))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"the app manifest in Redis is unreadable ({exc}); pass --app") from None


def _schedule(schedule: Schedule) -> dict[str, Any]:
    if isinstance(schedule, Every):
        return {"every_ms": schedule.period_ms, "offset_ms": schedule.offset_ms}
    if isinstance(schedule, Cron):
        seconds = {} if schedule.seconds is None else {"seconds": schedule.seconds}
        return {"cron": schedule.expr, "tz": schedule.tz_name, **seconds}
    return {"describe": schedule.describe()}


def _parse_schedule(data: dict[str, Any]) -> Schedule:
    if "every_ms" in data:
        return Every(int(data["every_ms"]), int(data.get("offset_ms", 0)))
    if "cron" in data:
        seconds = data.get("seconds")
        return Cron(
            str(data["cron"]), str(data["tz"]), seconds=None if seconds is None else str(seconds)
        )
    raise ValueError(f"unknown schedule {data!r}")


_NOT_HERE = "this app was described from its manifest in Redis; it cannot run here"


async def _not_here(*_: Any, **__: Any) -> NoReturn:
    raise RuntimeError(_NOT_HERE)


async def _no_batches(*_: Any) -> AsyncGenerator[InitBatch, None]:
    raise RuntimeError(_NOT_HERE)
    yield  # an async generator, as initializers are
