"""Workflows as the console shows them: the newest kept, by state, and one in full with its
graph (each step's depth, and the graph as text).

A read model over :meth:`Store.list_workflows <worker.storage.workflows.WorkflowOps.list_workflows>`
and :meth:`~worker.storage.workflows.WorkflowOps.read_workflow`, what ``worker workflows`` and
``worker workflow`` print. Results come from Redis: each is shown as text (JSON, or its ``repr``)
and cut at :data:`MAX_TEXT` characters; one that cannot be decoded (a pickle record: the console
never unpickles) shows as ``undecodable``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from worker.core.serializer import Deserialize, json_loads, msgpack_loads
from worker.core.workflow import WorkflowInfo
from worker.storage.store import Store

#: The states a workflow is in.
STATES = ("running", "done", "failed", "cancelled")
#: Workflows per list by default, and at most.
LIMIT, MAX_LIMIT = 100, 1000
#: Longest result or error text shown.
MAX_TEXT = 2000
#: Steps listed in full (the graph text covers them all).
MAX_STEPS = 1000


class Undecodable:
    """A result the console could not decode."""


def _text(value: Any) -> str:
    try:
        out = json.dumps(value, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError):
        out = repr(value)
    return out if len(out) <= MAX_TEXT else out[:MAX_TEXT] + "…"


def _refused(blob: bytes) -> Any:
    raise ValueError("pickle records are never unpickled by the console")


def deserializer(name: str) -> Deserialize:
    """What the console decodes results with: the workers' serializer, except that a pickle
    record is never decoded (it would run code from Redis)."""
    return {"json": json_loads, "msgpack": msgpack_loads}.get(name, _refused)


def _safe(deserialize: Deserialize) -> Deserialize:
    def read(blob: bytes) -> Any:
        try:
            return deserialize(blob)
        except Exception:
            return {"value": Undecodable()}

    return read


async def list_workflows(
    store: Store, state: str | None = None, limit: int = LIMIT
) -> list[dict[str, Any]]:
    """The newest ``limit`` workflows kept, in ``state`` (one of :data:`STATES`) or any state,
    newest first: ``{"id", "state", "created_ms"}``. A bad state or limit is a ``ValueError``."""
    if state is not None and state not in STATES:
        raise ValueError(f"state: one of {', '.join(STATES)}")
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit: 1 to {MAX_LIMIT}")
    rows = await store.list_workflows(limit if state is None else min(10 * limit, 10 * MAX_LIMIT))
    shown = [r for r in rows if state is None or r[1] == state][:limit]
    return [{"id": w, "state": s, "created_ms": c} for w, s, c in shown]


def depths(parents: Sequence[Sequence[int]]) -> list[int]:
    """Each step's depth in the graph (pure): 0 for a root, else one more than its deepest
    parent's (a parent always has a smaller index)."""
    out: list[int] = []
    for ps in parents:
        out.append(1 + max((out[p] for p in ps), default=-1))
    return out


def graph_text(info: WorkflowInfo) -> str:
    """The graph as text (pure): one line per step, ``index function [state] <- parents``,
    indented by depth; a run of steps alike (same function, state and parents: a group's
    members) is one line with its count."""
    level = depths([s.parents for s in info.steps])
    lines: list[str] = []
    i, steps = 0, info.steps
    while i < len(steps):
        s, j = steps[i], i + 1
        while j < len(steps) and (steps[j].function, steps[j].state, steps[j].parents) == (
            s.function, s.state, s.parents
        ):  # fmt: skip
            j += 1
        name = f"{i}" if j == i + 1 else f"{i}-{j - 1} ({j - i}×)"
        after = " <- " + ", ".join(str(p) for p in s.parents) if s.parents else ""
        after = after if len(after) <= 80 else after[:77] + "…"
        lines.append(f"{'  ' * level[i]}{name} {s.function} [{s.state}]{after}")
        i = j
    return "\n".join(lines)


async def workflow_detail(
    store: Store, workflow_id: str, deserialize: Deserialize
) -> dict[str, Any] | None:
    """One workflow in full, ``None`` when unknown or expired: its state, each step's
    (function, state, job id, parents, depth, result and error as text) and the graph as text."""
    info = await store.read_workflow(workflow_id, _safe(deserialize))
    if info is None:
        return None
    level = depths([s.parents for s in info.steps])
    steps = [
        {
            "index": s.index,
            "function": s.function,
            "state": s.state,
            "job_id": s.job_id,
            "parents": list(s.parents),
            "depth": level[s.index],
            "result": None
            if s.state != "done"
            else "undecodable"
            if isinstance(s.result, Undecodable)
            else _text(s.result),
            "error": None if s.error is None else s.error[:MAX_TEXT],
        }
        for s in info.steps[:MAX_STEPS]
    ]
    counts: dict[str, int] = {}
    for s in info.steps:
        counts[s.state] = counts.get(s.state, 0) + 1
    return {
        "id": info.id,
        "state": info.state,
        "on_failure": info.on_failure,
        "created_ms": info.created_ms,
        "size": len(info.steps),
        "counts": counts,
        "steps": steps,
        "graph": graph_text(info),
    }
