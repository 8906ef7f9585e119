"""The operator side learns duty kinds from the kinds (:mod:`worker.duties.kinds`).

A kind listed there is read into the cluster snapshot, shown by ``status`` (JSON and text),
judged by the doctor and paused by the operator's actions without any other edit; and no kind
is named by hand in more than a few operator-side files (the guard below).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from worker import App
from worker.client import Client
from worker.core.dutykinds import Kind, RowContext, Snapshot, table
from worker.core.kindcolumns import Column, field
from worker.core.verdict import Check, Limits
from worker.duties import kinds
from worker.ops import doctor, snapshot, status
from worker.ops.actions import Actor, Operations
from worker.web import api

ROOT = Path(__file__).resolve().parents[2]
#: The operator side: what reads, shows, judges and acts on the duties, and the kinds' list.
OPERATOR_SIDE = ("worker/ops", "worker/web", "worker/cli")
REGISTRY = ROOT / "worker/duties/kinds.py"
MAX_FILES = 8


def own_modules(kind: Kind) -> set[Path]:
    """The modules that declare ``kind`` (where its description's functions live)."""
    parts: tuple[Callable[..., Any], ...] = (kind.read, kind.rows, kind.render, *kind.checks)
    return {Path(inspect.getfile(f)).resolve() for f in parts}


def files_naming(kind: Kind) -> list[str]:
    """Operator-side production files (and the kinds' list) naming ``kind`` as a word, its
    own modules left out."""
    word = re.compile(rf"\b{re.escape(kind.name)}\b")
    files = [REGISTRY]
    for wing in OPERATOR_SIDE:
        files += [p for p in (ROOT / wing).rglob("*") if p.suffix in {".py", ".js", ".html"}]
    own = own_modules(kind)
    return sorted(
        str(p.relative_to(ROOT))
        for p in files
        if p.resolve() not in own and word.search(p.read_text(encoding="utf-8"))
    )


@pytest.mark.parametrize("kind", kinds.KINDS, ids=lambda k: k.name)
def test_no_duty_kind_is_named_in_more_than_a_few_operator_side_files(kind: Kind) -> None:
    named = files_naming(kind)
    assert len(named) <= MAX_FILES, (
        f"the {kind.name!r} duty kind is named in {len(named)} operator-side files (at most "
        f"{MAX_FILES}): {named}. A duty kind describes itself with a worker.core.dutykinds.Kind "
        "in its own module (its snapshot state, status rows and table, doctor checks, pause "
        "and trigger) and is listed in worker/duties/kinds.py; the snapshot, status, doctor, "
        "actions, CLI and console iterate over that list instead of naming it."
    )


# -- a new kind, listed only in worker.duties.kinds ---------------------------------------------
async def _read(store: Any, app: Any, now_ms: int) -> dict[str, int]:
    return {name: 7 for name in app.periodics}  # pretend: one "gadget" per periodic job


def _rows(state: dict[str, int], app: Any, at: RowContext) -> list[dict[str, Any]]:
    return [{"name": n, "count": c, "paused": at.is_paused("gadget", n)} for n, c in state.items()]


def _render(rows: list[dict[str, Any]], at: str) -> list[str]:
    return ["", *table(["GADGET", "COUNT"], [[r["name"], r["count"]] for r in rows])]


def _check(snap: Snapshot, app: Any, limits: Limits) -> Check:
    return Check("gadgets", "ok", f"{len(snap.duties['gadget'])} gadgets")


GADGET = Kind(
    name="gadget",
    noun="gadget",
    plural="gadgets",
    status_key="gadgets",
    declared=lambda app: app.periodics,
    read=_read,
    rows=_rows,
    render=_render,
    pause_effect="gadgets idle",
    checks=(_check,),
    columns=(Column("gadget", lambda r, now: r["name"]), field("count", "num")),
)


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Client]:
    c = await Client.connect(redis_url, key_prefix="kinds:")
    yield c
    await c.close()


async def test_a_kind_listed_in_the_kinds_is_read_shown_judged_and_paused(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kinds, "KINDS", (*kinds.KINDS, GADGET))
    app = App("kinds")

    @app.periodic(every=60)
    async def tidy(ctx: Any) -> None: ...

    store = client.store
    ops = Operations(client, app, Actor.local())
    assert (await ops.pause("gadget", "tidy")).ok
    assert not (await ops.pause("gadget", "nope")).ok

    snap = await snapshot.read(store, app)
    assert snap.duties["gadget"] == {"tidy": 7}
    doc = status.view(snap, app)
    assert doc["gadgets"] == [{"name": "tidy", "count": 7, "paused": True}]
    assert "GADGET" in status.render(doc) and "tidy    7" in status.render(doc)
    report = doctor.judge(snap, app, Limits())
    assert [c.summary for c in report.checks if c.name == "gadgets"] == ["1 gadgets"]
    (table,) = [t for t in api.duty_tables(doc, snap.now_ms) if t["kind"] == "gadget"]
    assert (table["id"], table["title"], table["headers"]) == (
        "gadgets",
        "Gadgets",
        ["gadget", "count"],
    )
    assert table["pausable"] and not table["triggerable"]
    (row,) = table["rows"]
    assert (row["name"], row["paused"]) == ("tidy", True)
    assert row["cells"][1] == {"text": "7", "class": "num", "title": ""}


def test_per_key_services_have_a_console_table() -> None:
    """Each per_key service is a row of the console's duties: its processes and how many keys
    run, which instance runs each key in the cell's hover title (before: no table at all)."""
    from worker.web import api

    doc = {
        "per_key_services": [{"name": "feeds", "processes": 3, "keys": {"b": "w-2", "a": "w-1"}}]
    }
    (table,) = [t for t in api.duty_tables(doc, 0) if t["kind"] == "per_key"]
    assert table["headers"] == ["service", "processes", "keys running"]
    assert not table["pausable"] and not table["triggerable"]
    (row,) = table["rows"]
    assert row["name"] == "feeds"
    assert row["cells"][1]["text"] == "3"
    assert row["cells"][2] == {"text": "2", "class": "num", "title": "a on w-1, b on w-2"}
