"""The operator side's view of periodic jobs (see :mod:`worker.core.dutykinds`): their state in
the cluster snapshot, their ``status`` rows and table, the doctor's checks of their schedules
and successes, pausing and running one now.

Beside :mod:`worker.duties.periodic` (the jobs themselves), which it reads from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.core import verdict
from worker.core.dutykinds import Kind, RowContext, Snapshot, ago, iso, table
from worker.core.kindcolumns import Cell, Column, field, until
from worker.core.kindcolumns import ago as ago_ms
from worker.core.verdict import Check, Limits, num
from worker.duties.periodic import PeriodicDef, freshness, trigger
from worker.storage.periodic import PeriodicRuns
from worker.storage.store import Store

NAME = "periodic"


@dataclass(frozen=True)
class PeriodicState:
    """Each periodic job's planned tick (``last``: where planning resumes, a skipped slot
    included), how its runs ended (``runs``) and the newest tick enqueued as a job
    (``enqueued``; absent: none ever was)."""

    last: dict[str, int]
    runs: dict[str, PeriodicRuns]
    enqueued: dict[str, int]


async def _read(store: Store, app: Any, now_ms: int) -> PeriodicState:
    return PeriodicState(
        last=await store.periodic_last(),
        runs=await store.periodic_runs(),
        enqueued=await store.periodic_enqueued(),
    )


def _rows(state: PeriodicState, app: Any, at: RowContext) -> list[dict[str, Any]]:
    return [_row(state, pd, at) for pd in app.periodics.values()]


def _row(state: PeriodicState, pd: PeriodicDef, at: RowContext) -> dict[str, Any]:
    now = at.now_ms
    run = state.runs.get(pd.name)
    fresh = freshness(pd, run, now)
    last = state.enqueued.get(pd.name)
    upcoming = pd.schedule.next(now)
    return {
        "name": pd.name,
        "schedule": pd.schedule.describe(),
        # the newest tick enqueued as a job: None when none ever was (not the schedule's
        # previous slot, which a new job records as planned without running it)
        "last_tick": iso(last),
        "last_tick_ms": last,
        "last_tick_age_s": None if last is None else round((now - last) / 1000, 1),
        "next_tick": iso(upcoming),
        "next_tick_ms": upcoming,
        "last_success": _run_end(run.success if run else None),
        "last_failure": _run_end(run.failure if run else None),
        "failing_since": iso(run.failing_since_ms if run else None),
        "success_age_s": None if fresh.success_age_s is None else round(fresh.success_age_s, 1),
        "max_staleness_s": pd.max_staleness_s,
        "stale": fresh.stale,
        "catch_up": pd.catch_up,
        "queue": pd.queue,
        "paused": at.is_paused(NAME, pd.name),
    }


def _run_end(rec: dict[str, Any] | None) -> dict[str, Any] | None:
    """A recorded run end with readable times."""
    if rec is None:
        return None
    return {**rec, "at": iso(rec.get("at_ms")), "tick": iso(rec.get("tick_ms"))}


def _failure_cell(rec: dict[str, Any] | None, now_iso: str) -> str | None:
    if rec is None:
        return None
    return f"{ago(rec.get('at'), now_iso)} {rec.get('error') or '?'}"


def _render(rows: list[dict[str, Any]], at: str) -> list[str]:
    if not rows:
        return []
    head = ["PERIODIC", "SCHEDULE", "LAST TICK", "NEXT TICK", "LAST SUCCESS", "LAST FAILURE"]
    cells = [
        [
            p["name"] + (" (PAUSED)" if p.get("paused") else ""),
            p["schedule"],
            p["last_tick"] or "never",
            p["next_tick"],
            (ago((p.get("last_success") or {}).get("at"), at) or "-")
            + (" STALE" if p.get("stale") else ""),
            _failure_cell(p.get("last_failure"), at),
        ]
        for p in rows
    ]
    return ["", *table(head, cells)]


def check_periodic_schedule(snap: Snapshot, app: Any, limits: Limits) -> Check:
    """Every declared periodic job's last enqueued tick keeps up with its schedule (the leader
    records it within about a second of each tick)."""
    if not app.periodics:
        return Check("periodic-schedule", "ok", "no periodic jobs declared")
    late = []
    for job in app.periodics.values():
        last = snap.duties[NAME].last.get(job.name)
        due = job.schedule.latest(snap.now_ms)
        if last is None:
            late.append(f"{job.name}: no tick ever recorded (no leader has run this job)")
        elif last < due and snap.now_ms - due > limits.tick_grace_s * 1000:
            late.append(
                f"{job.name}: last tick {verdict.iso(last)}, the tick due at {verdict.iso(due)} is "
                f"{(snap.now_ms - due) / 1000:.0f}s late"
            )
    if late:
        return Check(
            "periodic-schedule",
            "fail",
            f"{len(late)} of {num(len(app.periodics), 'periodic job')} behind their schedule (is a "
            "leader running this app?)",
            late,
        )
    return Check(
        "periodic-schedule",
        "ok",
        f"{num(len(app.periodics), 'periodic job')} ticking on schedule",
    )


def check_periodic_success(snap: Snapshot, app: Any, limits: Limits) -> Check:
    """No periodic job's last success is older than its ``max_staleness``; jobs whose latest
    run failed are listed (a warning unless they are stale)."""
    if not app.periodics:
        return Check("periodic-success", "ok", "no periodic jobs declared")
    stale, failing = [], []
    for job in app.periodics.values():
        runs = snap.duties[NAME].runs.get(job.name)
        f = freshness(job, runs, snap.now_ms)
        failure = runs.failure if runs is not None else None
        success = runs.success if runs is not None else None
        last_failed = failure is not None and (
            success is None or int(failure.get("at_ms", 0)) > int(success.get("at_ms", 0))
        )
        error = (
            f"; last failure {verdict.ago(failure.get('at_ms'), snap.now_ms)} "
            f"({failure.get('error')}, "
            f"tick {verdict.iso(failure.get('tick_ms'))}, on {failure.get('instance')})"
            if failure is not None and last_failed
            else ""
        )
        if f.stale:
            stale.append(f"{job.name}: {f.explain(job.max_staleness_s)}{error}")
        elif last_failed:
            failing.append(f"{job.name}: latest run failed{error}")
    bounded = sum(1 for j in app.periodics.values() if j.max_staleness_s is not None)
    if stale:
        return Check(
            "periodic-success",
            "fail",
            f"{num(len(stale), 'periodic job')} not succeeded within max_staleness",
            stale + failing,
        )
    if failing:
        return Check(
            "periodic-success",
            "warn",
            f"{num(len(failing), 'periodic job')} failed on the latest run (within max_staleness)",
            failing,
        )
    return Check(
        "periodic-success",
        "ok",
        f"no periodic job failing or stale ({bounded} of {len(app.periodics)} declare "
        "max_staleness)",
    )


def _success(row: dict[str, Any], now: int) -> Cell:
    ok = row.get("last_success")
    stale = " · STALE" if row.get("stale") else ""
    text = ago_ms(ok.get("at_ms"), now) + stale if ok else "never"
    return Cell(text, "warn" if row.get("stale") else "", ok.get("at") or "" if ok else "")


def _failure(row: dict[str, Any], now: int) -> Cell:
    bad = row.get("last_failure")
    if not bad:
        return Cell(None)
    return Cell(
        f"{ago_ms(bad.get('at_ms'), now)} · {bad.get('error') or '?'}", "bad", bad.get("at") or ""
    )


COLUMNS = (
    Column("job", lambda r, now: r["name"]),
    field("schedule"),
    Column(
        "next tick", lambda r, now: Cell(until(r["next_tick_ms"], now), "", r["next_tick"] or "")
    ),
    Column(
        "last enqueued tick",
        lambda r, now: Cell(
            ago_ms(r["last_tick_ms"], now, "never"),
            "",
            r["last_tick"] or "no tick of it was ever enqueued",
        ),
        "last-tick",
    ),
    Column("last success", _success),
    Column("last failure", _failure),
    Column("catch-up", lambda r, now: r["catch_up"]),
)

KIND = Kind(
    name=NAME,
    noun="periodic job",
    plural="periodic jobs",
    status_key="periodic",
    declared=lambda app: app.periodics,
    read=_read,
    rows=_rows,
    render=_render,
    pause_effect="ticks are skipped, not caught up",
    trigger=trigger,
    trigger_effect="ctx.tick is now; its recorded last tick does not move",
    checks=(check_periodic_schedule, check_periodic_success),
    columns=COLUMNS,
)
