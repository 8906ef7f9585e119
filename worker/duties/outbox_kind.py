"""The operator side's view of the outbox relay (see :mod:`worker.core.dutykinds`): its report
in the cluster snapshot, its ``status`` row and table, the doctor's check (the database at
``WORKER_OUTBOX_DSN`` reachable from the leader, rows waiting, the oldest row's age), and
pausing it (``worker pause outbox:relay``: no row is moved, the rows wait in the table).

The relay (:mod:`worker.duties.outbox`) reports each round to Redis; a report that expired
means no leader runs a relay (``WORKER_OUTBOX_DSN`` unset on the workers, or no leader).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.core.dutykinds import Kind, RowContext, Snapshot, iso, table
from worker.core.kindcolumns import Cell, Column, duration
from worker.core.verdict import Check, Limits
from worker.storage.store import Store

NAME = "outbox"
#: The relay's one duty name (``outbox:relay``).
RELAY = "relay"
#: A report older than its interval plus this is stale (the relay stuck or gone).
STALE_GRACE_S = 15.0


@dataclass(frozen=True)
class OutboxState:
    """The relay's newest report (``None``: no relay reported recently)."""

    report: dict[str, Any] | None


async def _read(store: Store, app: Any, now_ms: int) -> OutboxState:
    return OutboxState(await store.outbox_report_read())


def _rows(state: OutboxState, app: Any, at: RowContext) -> list[dict[str, Any]]:
    rep, paused = state.report, at.is_paused(NAME, RELAY)
    if rep is None and not paused:
        return []
    rep = rep or {}
    at_ms = rep.get("at_ms") if isinstance(rep.get("at_ms"), int) else None
    return [
        {
            "name": RELAY,
            "reported": iso(at_ms),
            "report_age_s": None if at_ms is None else round((at.now_ms - at_ms) / 1000, 1),
            "token": rep.get("token"),
            "waiting": rep.get("waiting"),
            "more": bool(rep.get("more")),
            "oldest_age_s": rep.get("oldest_age_s"),
            "error": rep.get("error"),
            "interval_s": rep.get("interval_s"),
            "paused": paused,
        }
    ]


def _waiting(r: dict[str, Any]) -> str:
    if r.get("waiting") is None:
        return "-"
    return f"{r['waiting']}{'+' if r.get('more') else ''}"


def _render(rows: list[dict[str, Any]], at: str) -> list[str]:
    if not rows:
        return []
    head = ["OUTBOX RELAY", "REPORTED", "WAITING", "OLDEST", "TOKEN", "ERROR"]
    cells = [
        [
            r["name"] + (" (PAUSED)" if r.get("paused") else ""),
            "never" if r["report_age_s"] is None else f"{r['report_age_s']:.0f}s ago",
            _waiting(r),
            None if r.get("oldest_age_s") is None else f"{r['oldest_age_s']:.1f}s",
            r.get("token"),
            r.get("error"),
        ]
        for r in rows
    ]
    return ["", *table(head, cells)]


def check_outbox(snap: Snapshot, app: Any, limits: Limits) -> Check:
    """The relay reports (a leader runs it), reaches its database, and no row waits longer
    than ``max_lag_s``; paused, a warning."""
    rep = snap.duties[NAME].report
    if rep is None:
        return Check("outbox-relay", "ok", "no outbox relay reporting (WORKER_OUTBOX_DSN unset)")
    data = {k: rep.get(k) for k in ("waiting", "more", "oldest_age_s", "error", "token")}
    age_s = (snap.now_ms - int(rep.get("at_ms") or 0)) / 1000
    interval = float(rep.get("interval_s") or 1.0)
    waiting = f"{rep.get('waiting')}{'+' if rep.get('more') else ''} rows waiting"
    oldest = rep.get("oldest_age_s")
    if rep.get("error"):
        return Check(
            "outbox-relay", "fail",
            "the leader cannot reach the outbox database (WORKER_OUTBOX_DSN)",
            [str(rep["error"])], data,
        )  # fmt: skip
    if age_s > interval + STALE_GRACE_S:
        return Check(
            "outbox-relay", "warn",
            f"the outbox relay last reported {age_s:.0f}s ago (stuck, or leadership changing)",
            [], data,
        )  # fmt: skip
    if oldest is not None and oldest > limits.max_lag_s:
        return Check(
            "outbox-relay", "fail",
            f"{waiting}, the oldest {oldest:.0f}s (over {limits.max_lag_s:.0f}s): is the relay "
            "paused, or a row refused (see the leader's log)?",
            [], data,
        )  # fmt: skip
    detail = "" if oldest is None else f", the oldest {oldest:.1f}s"
    return Check("outbox-relay", "ok", f"outbox database reachable; {waiting}{detail}", [], data)


def _reported(row: dict[str, Any], now: int) -> Cell:
    age = row.get("report_age_s")
    stale = age is not None and age > float(row.get("interval_s") or 1.0) + STALE_GRACE_S
    text = "never" if age is None else f"{duration(age)} ago" + (" · STALE" if stale else "")
    return Cell(text, "warn" if stale or age is None else "", row.get("reported") or "")


COLUMNS = (
    Column("relay", lambda r, now: r["name"]),
    Column("reported", _reported),
    Column("rows waiting", lambda r, now: _waiting(r), "num waiting"),
    Column("oldest row", lambda r, now: duration(r.get("oldest_age_s")), "oldest"),
    Column("error", lambda r, now: Cell(r.get("error"), "bad" if r.get("error") else ""), "error"),
)


KIND = Kind(
    name=NAME,
    noun="outbox relay",
    plural="outbox relays",
    status_key="outbox",
    declared=lambda app: {RELAY: None},
    read=_read,
    rows=_rows,
    render=_render,
    pause_effect="no outbox row is moved into Redis; the rows wait in the table",
    checks=(check_outbox,),
    columns=COLUMNS,
)
