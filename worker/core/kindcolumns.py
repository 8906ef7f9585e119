"""A duty kind's table in the console, declared by the kind (:class:`Column` in its
:class:`worker.core.dutykinds.Kind`): each column's header and how a ``status`` row of the kind
shows in it (a :class:`Cell`: text, a class for the page's style, a hover title).

The console renders every kind's table from these (``/api/overview``'s ``duties``), with a
state column and Pause/Resume for a kind that pauses and Run now for one that runs one now:
the page names no kind. Ages are formatted against the snapshot's "now" (the server's clock),
as the page formats the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Cell:
    """One cell: its text (``None``: shown as ``–``), its class and its hover title."""

    text: Any
    css: str = ""
    title: str = ""


#: ``(row, now_ms) -> cell``: what a ``status`` row of the kind shows in a column
CellOf = Callable[[dict[str, Any], int], "Cell | Any"]


@dataclass(frozen=True)
class Column:
    """A column of a kind's console table: its header, its cell of a row, and the class every
    cell of it has (besides the cell's own)."""

    header: str
    cell: CellOf
    css: str = ""


def field(key: str, css: str = "") -> Column:
    """A column showing a row's ``key`` as it is (the header: ``key`` with spaces)."""
    return Column(key.replace("_", " "), lambda row, now: row.get(key), css)


def duration(s: float | None) -> str:
    """Seconds as the console shows them: ``4.2s``, ``12s``, ``3m 5s``, ``2h 10m``, ``1d 3h``."""
    if s is None:
        return "–"
    s = max(0.0, s)
    if s < 60:
        return f"{s:.1f}s" if s < 10 else f"{round(s)}s"
    if s < 3600:
        return f"{int(s // 60)}m {round(s % 60)}s"
    if s < 86400:
        return f"{int(s // 3600)}h {round((s % 3600) / 60)}m"
    return f"{int(s // 86400)}d {round((s % 86400) / 3600)}h"


def ago(at_ms: int | None, now_ms: int, never: str = "–") -> str:
    """How long ago a server time was (``never`` when there is none)."""
    return never if at_ms is None else f"{duration((now_ms - at_ms) / 1000)} ago"


def until(at_ms: int | None, now_ms: int) -> str:
    """``in 3m 5s`` (or ``… ago`` when past)."""
    if at_ms is None:
        return "–"
    s = (at_ms - now_ms) / 1000
    return f"in {duration(s)}" if s >= 0 else f"{duration(-s)} ago"


def cell_json(column: Column, row: dict[str, Any], now_ms: int) -> dict[str, Any]:
    """One cell of a row as the console's data: ``{"text", "class", "title"}``."""
    got = column.cell(row, now_ms)
    cell = got if isinstance(got, Cell) else Cell(got)
    text = "–" if cell.text is None else str(cell.text)
    css = " ".join(c for c in (column.css, cell.css) if c)
    return {"text": text, "class": css, "title": cell.title}
