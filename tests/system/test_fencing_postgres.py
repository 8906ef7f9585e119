"""Fencing tokens guard writes outside Redis: examples/fencing_postgres run by two real
``python -m worker --role leader`` processes against a real PostgreSQL (started here with
``initdb``/``pg_ctl`` on a temporary directory) and the real Redis-compatible server.

The leader is SIGSTOPped past its lease right after a write, so it wakes up in the middle of
its next round (the pause of Kleppmann's fencing-token argument: between the lease check and
the write); the other takes over and writes; the old one resumes and tries its write with its
old token. With the fence, PostgreSQL refuses it; without (the example's flag), the stale row
lands after the new leader's — which shows the assertion can fail. Also: the epoch, the token,
goes above every earlier one after Redis lost all its data under fresh processes (no floor).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
import redis as redis_sync

from harness import ROOT, Spawn, WorkerProc, wait_until
from harness.docpages import page
from harness.postgres import Postgres
from worker.core.ids import LockValue
from worker.storage import keys as K

APP = "fencing_postgres.app:app"
#: Seconds of work per round: a pause right after a write lands in the next round's work.
WORK_S = "0.3"


def test_the_fencing_page_shows_the_example_this_file_runs() -> None:
    text = page("fencing")  # docs/fencing.md
    assert '--8<-- "examples/fencing_postgres/app.py"' in text
    assert "UPDATE fence SET token = $1 WHERE name = 'ledger' AND token <= $1;" in text
    source = (ROOT / "examples" / "fencing_postgres" / "app.py").read_text()
    assert '"UPDATE fence SET token = %s WHERE name = %s AND token <= %s"' in source


@dataclass(frozen=True)
class Row:
    seq: int
    token: int
    writer: str


def rows(dsn: str) -> list[Row]:
    with psycopg.connect(dsn) as conn:
        exists = conn.execute("SELECT to_regclass('ledger') IS NOT NULL").fetchone()
        if not exists or not exists[0]:
            return []
        found = conn.execute("SELECT seq, token, writer FROM ledger ORDER BY seq").fetchall()
    return [Row(*r) for r in found]


def refusals(proc: WorkerProc) -> list[dict[str, Any]]:
    return [e for e in proc.events() if e.get("event") == "fenced write refused"]


@dataclass
class Takeover:
    old: WorkerProc
    new: WorkerProc
    #: the new leader's first row
    first: Row
    dsn: str


def take_over(spawn: Spawn, pg: Postgres, name: str, *, unfenced: bool) -> Takeover:
    """Two leaders write the ledger; the one writing is SIGSTOPped right after a row (so in
    its next round's work) until the other has taken over and written, then resumed."""
    dsn = pg.database(name)
    env: dict[str, str | None] = {
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'examples'}",
        "FENCING_PG_DSN": dsn,
        "FENCING_WORK_S": WORK_S,
        "FENCING_UNFENCED": "1" if unfenced else None,
    }
    procs = {n: spawn("leader", name=n, app=APP, env=env) for n in (f"{name}-a", f"{name}-b")}
    written = wait_until(lambda: rows(dsn), 60, 0.05, what="the leader's first row")
    old = procs[written[0].writer]
    new = next(p for p in procs.values() if p is not old)
    seen = len(rows(dsn))
    wait_until(lambda: len(rows(dsn)) > seen, 20, 0.01, what="another row")
    old.pause()  # just after a commit: frozen in the next round's work, its token in hand
    try:
        mine = wait_until(
            lambda: [r for r in rows(dsn) if r.writer == new.name], 40, 0.05, what="takeover"
        )
    finally:
        old.resume()
    return Takeover(old, new, mine[0], dsn)


@pytest.mark.slow
def test_a_leader_paused_past_its_lease_cannot_write_after_its_successor(
    spawn: Spawn, postgres: Postgres, rsync: redis_sync.Redis
) -> None:
    t = take_over(spawn, postgres, "fenced", unfenced=False)
    # the old leader woke up mid-round and tried its write: refused by the fence
    refused = wait_until(lambda: refusals(t.old), 20, what="the old leader's refused write")
    old_token = refused[0]["token"]
    assert old_token < t.first.token, (old_token, t.first)
    ledger = rows(t.dsn)
    assert {r.token for r in ledger if r.writer == t.old.name} == {old_token}
    late = [r for r in ledger if r.writer == t.old.name and r.seq > t.first.seq]
    assert not late, f"the deposed leader's rows landed after its successor's first: {late}"
    # the service ended on it (no restart), and the new leader goes on writing
    ended = [e for e in t.old.events() if e.get("event") == "leadership lost; component stops"]
    assert any("refused token" in str(e.get("error")) for e in ended), t.old.log()
    wait_until(lambda: len(rows(t.dsn)) > len(ledger), 20, what="the new leader writes on")
    # the tokens are the leases' epochs
    keys = K.Keys(spawn.prefix)  # type: ignore[attr-defined]
    history = {int(h.split(b"|", 1)[0]) for h in rsync.lrange(keys.leader_history, 0, -1)}
    assert {old_token, t.first.token} <= history


@pytest.mark.slow
def test_without_the_fence_the_paused_leader_writes_after_its_successor(
    spawn: Spawn, postgres: Postgres
) -> None:
    """The same scenario with the example's fence turned off: a lease alone lets the stale
    write in (what the test above would catch)."""
    t = take_over(spawn, postgres, "unfenced", unfenced=True)
    late = wait_until(
        lambda: [r for r in rows(t.dsn) if r.writer == t.old.name and r.seq > t.first.seq],
        20,
        what="the old leader's stale row",
    )
    assert late[0].token < t.first.token
    assert not refusals(t.old)


@pytest.mark.slow
def test_the_token_goes_above_every_earlier_one_after_redis_lost_its_data(
    spawn: Spawn, rsync: redis_sync.Redis
) -> None:
    """Every process restarted and Redis emptied: nobody remembers an epoch (no floor), yet
    the next leadership's token is above the last one before the loss."""
    keys = K.Keys(spawn.prefix)  # type: ignore[attr-defined]

    def epoch() -> int | None:
        lock = LockValue.parse(rsync.get(keys.leader))
        return lock.epoch if lock is not None else None

    first = spawn("leader", name="before")
    before = wait_until(epoch, 30, what="a leader")
    first.kill()
    rsync.flushall()
    spawn("leader", name="after")
    after = wait_until(epoch, 30, what="a leader after the loss")
    assert after > before, (before, after)
