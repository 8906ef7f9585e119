"""The outbox relay: the leader moves committed outbox rows (:mod:`worker.outbox`) into Redis.

Each round, under the lease's epoch as its fencing token:

1. one database transaction reads the fence row (above the token: a newer relay has been
   here, so this one steps down) and the oldest rows; the relay raised the fence to its token
   when it started (``token <= $1``; no row updated: the same);
2. one fenced script writes their jobs (:meth:`FencedStore.relay_outbox`: the lease checked in
   the same step, each id moved once, confirmed per the WAIT policy);
3. one database transaction raises the fence again and deletes the rows.

A row is deleted only after Redis confirmed its job; a round cut anywhere leaves its rows, and
the next round (this leader's or the next one's) finds their ids already moved. A relay paused
past its lease is refused by Redis (the lease) and by the database (the fence a newer relay
raised). An enqueue's ``NOTIFY`` (delivered at commit) wakes the relay; without one it looks
every ``interval_s``.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import structlog

from worker.core import codec
from worker.core.clock import Clock, ms, on_server_time
from worker.core.component import LoopComponent
from worker.core.errors import ConfigError, LeadershipLost
from worker.core.jobdefs import DEFAULT_QUEUE
from worker.core.logs import error_text
from worker.core.metrics import Metrics
from worker.core.serializer import Serialize
from worker.outbox import schema as Q
from worker.storage.jobs import NewJob
from worker.storage.outbox import OutboxJob
from worker.storage.store import FencedStore, Store

if TYPE_CHECKING:
    import psycopg

log = structlog.get_logger("worker.outbox")

NAME = "outbox-relay"
#: Rows per round.
BATCH = 500


class OutboxRelay(LoopComponent):
    """Moves committed outbox rows into Redis, each exactly one job (leader only)."""

    def __init__(
        self,
        dsn: str,
        store: Store,
        fenced: FencedStore,
        queues: Mapping[str, str],
        serialize: Serialize,
        clock: Clock,
        metrics: Metrics | None = None,
        *,
        interval_s: float = 1.0,
        batch: int = BATCH,
    ) -> None:
        """``queues``: the app's task names -> their queues (another task: ``default``).
        :class:`ConfigError` (exit 2 at start-up) without psycopg."""
        if importlib.util.find_spec("psycopg") is None:
            raise ConfigError(
                "WORKER_OUTBOX_DSN is set but psycopg is not installed: "
                "pip install 'fenced-worker[outbox]'"
            )
        super().__init__(NAME, clock, sla_s=60.0)
        self.dsn = dsn
        self.store = store
        self.fenced = fenced
        self.queues = dict(queues)
        self.serialize = serialize
        self.metrics = metrics
        self.interval_s = interval_s
        self.batch = batch
        self.token = 0
        self.conn: psycopg.AsyncConnection[Any] | None = None
        self._refused: set[int] = set()  # rows logged as not relayable

    async def setup(self) -> None:
        import psycopg  # the outbox extra: imported only where the relay runs

        epoch = self.fenced.leader.epoch
        if epoch is None:
            raise LeadershipLost("not leading")
        self.token = epoch
        self.conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
        try:
            await self.conn.execute(Q.LISTEN)
            await self.conn.execute(Q.IDLE_TIMEOUT)
            async with self.conn.transaction():
                await self._fence(self.conn)  # the first act: older relays refused from here
        except BaseException:
            await self.teardown()  # the loop runs teardown only after a setup that succeeded
            raise

    async def teardown(self) -> None:
        if self.conn is not None:
            await self.conn.close()
            self.conn = None

    async def tick(self) -> float:
        assert self.conn is not None
        rows = await self.read(self.conn)
        if self.metrics is not None:
            self.metrics.outbox_lag.set(max(0.0, rows[0][-1] or 0.0) if rows else 0.0)
        moved = await self.move(rows) if rows else []
        if moved:
            await self.remove(self.conn, moved)
            log.debug("outbox rows relayed", rows=len(moved), token=self.token)
            return 0.0 if len(rows) == self.batch else 0.001
        async for _ in self.conn.notifies(timeout=self.interval_s, stop_after=1):
            pass  # an enqueue committed (or the interval passed): look again
        return 0.0

    async def _fence(self, conn: psycopg.AsyncConnection[Any], *, raise_it: bool = True) -> None:
        """Raise the fence to this relay's token (locked until the transaction ends), or only
        check it (``raise_it=False``); above the token: step down."""
        if raise_it:
            cur = await conn.execute(Q.FENCE, (self.token, self.token))
            refused = cur.rowcount != 1
        else:
            cur = await conn.execute(Q.FENCE_TOKEN)
            found = await cur.fetchone()
            refused = found is None or int(found[0]) > self.token
        if refused:
            reason = f"the outbox fence refused token {self.token}: a newer relay moved rows"
            self.fenced.leader.lost(reason)
            raise LeadershipLost(reason)

    async def read(self, conn: psycopg.AsyncConnection[Any]) -> list[tuple[Any, ...]]:
        """The oldest rows, read after checking the fence in the same transaction."""
        async with conn.transaction():
            await self._fence(conn, raise_it=False)
            cur = await conn.execute(Q.READ, (self.batch,))
            return await cur.fetchall()

    async def move(self, rows: Sequence[tuple[Any, ...]]) -> list[int]:
        """The rows' jobs into Redis, in one fenced script call; the ids of the rows moved
        (now or before). A row whose job cannot be encoded (an argument the serializer
        refuses) stays in the table, logged once."""
        await on_server_time(self.clock, self.store.server_time_ms)
        now = ms(self.clock.time())
        jobs, ids = [], []
        for row in rows:
            try:
                jobs.append(self._job(row, now))
            except Exception as exc:  # one bad row must not stop the others
                if row[0] not in self._refused:
                    self._refused.add(row[0])
                    if self.metrics is not None:
                        self.metrics.outbox_rows.labels("refused").inc()
                    log.error("outbox row not relayed", row=row[0], error=error_text(exc))
                continue
            ids.append(row[0])
        written = await self.fenced.relay_outbox(jobs, now)
        if self.metrics is not None:
            m = self.metrics.outbox_rows
            m.labels("moved").inc(sum(written))
            m.labels("duplicate").inc(len(written) - sum(written))
        return ids

    def _job(self, row: tuple[Any, ...], now: int) -> OutboxJob:
        _, key, task, args, kwargs, job_id, unique_key, queue, defer_by_s, _ = row
        ids = self.store.ids
        jid = job_id or (ids.unique(unique_key) if unique_key else f"{ids.prefix}outbox:{key}")
        args = json.loads(args) if isinstance(args, str | bytes) else args
        kwargs = json.loads(kwargs) if isinstance(kwargs, str | bytes) else kwargs
        payload = codec.encode_job(task, args, kwargs, now, self.serialize)
        score = now + ms(defer_by_s or 0.0)
        ttl = codec.EXPIRES_EXTRA_MS + max(0, score - now)
        queue = queue or self.queues.get(task, DEFAULT_QUEUE)
        return OutboxJob(NewJob(jid, payload, score), queue, ttl)

    async def remove(self, conn: psycopg.AsyncConnection[Any], ids: list[int]) -> None:
        """Delete moved rows, after raising the fence in the same transaction."""
        async with conn.transaction():
            await self._fence(conn)
            await conn.execute(Q.DELETE, (ids,))
