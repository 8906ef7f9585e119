"""What the operator side knows of a kind of duty, declared by the kind itself.

A duty kind (periodic jobs, pollers, initializers, per-key services) describes itself with one
:class:`Kind`: its name, how the cluster snapshot reads its state, its rows in ``status`` (the
JSON document and the text table), the doctor's checks of it, whether an operator pauses it
and what pausing does, and how an operator runs one now. Each duty module declares its own;
:data:`worker.duties.kinds.KINDS` lists them in the order ``status`` shows them, and the
snapshot, ``status``, the doctor, the actions, the CLI and the console iterate over that list
instead of naming each kind.

Also the small formatting helpers the kinds' rows and tables share with ``status``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from worker.core.kindcolumns import Column
from worker.core.verdict import Check, Limits


@dataclass(frozen=True)
class RowContext:
    """What a kind's ``status`` rows see besides its own state: the snapshot's "now" (the
    server's clock, ms), the paused duty names and the instances' ``status`` rows."""

    now_ms: int
    paused: set[str]
    instances: list[dict[str, Any]]

    def is_paused(self, kind: str, name: str) -> bool:
        return f"{kind}:{name}" in self.paused

    def instance_name(self, instance_id: str) -> Any:
        """The name of a live or stale instance (its id when none is recorded)."""
        rows = self.instances
        return next((i.get("name") for i in rows if i.get("id") == instance_id), instance_id)


class Snapshot(Protocol):
    """What a kind's doctor checks read of the cluster snapshot
    (:class:`worker.ops.snapshot.ClusterSnapshot`): "now" and each kind's state by kind name."""

    @property
    def now_ms(self) -> int: ...
    @property
    def duties(self) -> dict[str, Any]: ...


#: ``(snapshot, app, limits) -> Check``: one of the doctor's checks of the kind
Checker = Callable[[Snapshot, Any, Limits], Check]
#: ``(store, app, now_ms) -> state``: the kind's part of the cluster snapshot (read-only)
Reader = Callable[[Any, Any, int], Awaitable[Any]]
#: ``(state, app, context) -> rows``: the kind's rows of the ``status`` document
Rows = Callable[[Any, Any, RowContext], list[dict[str, Any]]]
#: ``(rows, at) -> lines``: the kind's part of ``status``'s text (``at``: the document's time)
Render = Callable[[list[dict[str, Any]], str], list[str]]
#: ``(client, declaration) -> job id``: run one now (``None``: a run for now is already queued)
Trigger = Callable[[Any, Any], Awaitable[str | None]]


@dataclass(frozen=True)
class Kind:
    """One duty kind as the operator side sees it.

    ``name`` is the kind in duty names (``<name>:<duty>``: the paused set, ``pause``/``resume``)
    and the key of its state in the snapshot; ``noun``/``plural`` name one and several in
    messages; ``status_key`` is its rows' key in the ``status`` document. ``declared`` gives
    an app's declarations of this kind by name. ``pause_effect``: what pausing one does (``None``:
    it cannot be paused). ``trigger``: run one now (``None``: it cannot be), ``trigger_effect``
    what a run now is and leaves (in the CLI's help). ``checks``: the
    doctor's checks of this kind, run in the order of the kinds, then of this tuple.
    ``columns``: its table in the console, one row per ``status`` row (none: not shown there;
    the console adds a state column and the buttons the kind allows).
    """

    name: str
    noun: str
    plural: str
    status_key: str
    declared: Callable[[Any], Mapping[str, Any]]
    read: Reader
    rows: Rows
    render: Render
    pause_effect: str | None = None
    trigger: Trigger | None = None
    trigger_effect: str = ""
    checks: tuple[Checker, ...] = ()
    columns: tuple[Column, ...] = ()

    @property
    def pausable(self) -> bool:
        return self.pause_effect is not None

    @property
    def title(self) -> str:
        """The heading of its table: ``Periodic jobs``."""
        return self.plural[:1].upper() + self.plural[1:]


def iso(at_ms: int | None) -> str | None:
    """A server time (ms) as an ISO 8601 UTC string, to the second."""
    if at_ms is None:
        return None
    return dt.datetime.fromtimestamp(at_ms / 1000, dt.UTC).isoformat(timespec="seconds")


def lag(head_ms: int | None, now_ms: int) -> float | None:
    """How long the oldest due entry of a sorted set (its lowest score) has waited, in
    seconds; ``None`` when nothing is due."""
    if head_ms is None or head_ms > now_ms:
        return None
    return round((now_ms - head_ms) / 1000, 1)


def ago(at_iso: str | None, now_iso: str) -> str | None:
    if at_iso is None:
        return None
    delta = dt.datetime.fromisoformat(now_iso) - dt.datetime.fromisoformat(at_iso)
    return f"{max(0, round(delta.total_seconds()))}s ago"


def table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    """A plain-text table: a header line, a rule, a line per row (``None`` shows as ``-``)."""
    cells = [[("-" if c is None else str(c)) for c in r] for r in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)
    ]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [
        fmt.format(*headers),
        fmt.format(*("-" * w for w in widths)),
        *(fmt.format(*r) for r in cells),
    ]


def either(words: list[str]) -> str:
    """``a, b or c``: the kinds' nouns in a sentence."""
    return " or ".join(w for w in (", ".join(words[:-1]), words[-1] if words else "") if w)


def by_name(kinds: tuple[Kind, ...], name: str) -> Kind | None:
    return next((k for k in kinds if k.name == name), None)
