"""The jobs read model: pages of jobs by state (queued, scheduled, running, failed, done) and
one job's detail (bounded reads), read by ``worker jobs``, ``worker job`` and the Jobs view.

A listing costs what it returns: a page is one ranged read of a sorted set (``… LIMIT``) and
one round trip for the page's records. A filter that needs the payload (``task``, ``search``)
reads at most :data:`SCAN_FACTOR` × ``limit`` entries per call and hands back a cursor to read
on, so even a million queued jobs cost the same per call. "Now" is the Redis server's clock.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, TypeVar

from worker.core.jobdefs import DEFAULT_QUEUE, with_lanes
from worker.core.jobhead import DETAIL_READ, LISTING_READ
from worker.core.serializer import Deserialize, msgpack_loads
from worker.ops.jobrecords import (
    ENDS,
    REPR_CHARS,
    SUMMARY_REPR_CHARS,
    args_repr,
    args_text,
    detail_state,
    ended_state,
    error_line,
    error_of,
    fraction,
    instance_of,
    job_of,
    make_cursor,
    matches,
    parse_cursor,
    result_of,
    short,
)
from worker.storage.inspect_jobs import JobRecord
from worker.storage.sharded import Shards
from worker.storage.store import Store

T = TypeVar("T")

State = Literal["queued", "scheduled", "running", "failed", "done"]
STATES: tuple[State, ...] = ("queued", "scheduled", "running", "failed", "done")
#: Largest page.
MAX_LIMIT = 500
#: A filtered listing reads at most this many times ``limit`` entries per call.
SCAN_FACTOR = 10


@dataclass(frozen=True)
class JobSummary:
    """One job in a listing. Times are the server's clock, ms; ``None`` where unknown."""

    job_id: str
    task: str | None
    queue: str | None
    state: str
    tries: int | None = None
    enqueued_ms: int | None = None
    due_ms: int | None = None
    started_ms: int | None = None
    finished_ms: int | None = None
    instance: str | None = None
    progress: float | None = None
    #: the args and kwargs, shortened (what a search matched)
    args: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class JobDetail(JobSummary):
    """One job in full: the summary plus its arguments and result (reprs, truncated), the
    failure record (with its traceback) when it failed, its progress message, its dead letter
    when it is dead, and ``undecodable`` when a record could not be read (never raised)."""

    kwargs: str | None = None
    result: str | None = None
    error: dict[str, Any] | None = None
    progress_message: str | None = None
    dead: dict[str, Any] | None = None
    abort_requested: bool = False
    undecodable: str | None = None


@dataclass(frozen=True)
class JobPage:
    """A page of a listing: its jobs, the cursor of the next page (``None``: the end) and how
    many entries were read for it (the bounded scan of a filtered listing)."""

    items: list[JobSummary]
    next_cursor: str | None
    scanned: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "items": [i.to_json() for i in self.items],
            "next_cursor": self.next_cursor,
            "scanned": self.scanned,
        }


# -- listing ---------------------------------------------------------------------------------


async def list_jobs(
    store: Store,
    *,
    state: State,
    queue: str | None = None,
    task: str | None = None,
    search: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
    queues: Sequence[str] = (DEFAULT_QUEUE,),
    deserialize: Deserialize = msgpack_loads,
    now_ms: int | None = None,
    shards: Sequence[Store] = (),
) -> JobPage:
    """One page of the jobs in ``state``, filtered by ``queue`` (else every one of
    ``queues``, the app's), ``task`` and ``search`` (text in the id, task name or arguments),
    at most ``limit`` (≤ :data:`MAX_LIMIT`), from ``cursor`` (a page's ``next_cursor``).
    ``queued``/``scheduled`` read the queues in priority order (due first), ``running`` the
    live instances' holds sets, ``failed`` the recent failures and the dead letters and
    ``done`` the recent successes, newest first. Raises ``ValueError`` for a bad state or
    cursor. ``shards``: every queue shard's store, home first: ``queued``/``scheduled`` read each
    queue of every shard in turn (the cursor says where), ``failed``/``done`` merge every
    shard's indexes newest first, ``running`` every shard's holds sets by id."""
    if state not in STATES:
        raise ValueError(f"unknown state {state!r}; one of: {', '.join(STATES)}")
    limit = max(1, min(limit, MAX_LIMIT))
    names = [queue] if queue is not None else list(with_lanes(queues))  # and the duty lanes
    if now_ms is None:
        now_ms = round(await store.server_time_ms())
    view = _Lister(store, deserialize, task, search, limit, names, now_ms, shards)
    if state in ("queued", "scheduled"):
        return await view.queued(state, cursor)
    if state == "running":
        return await view.running(cursor)
    return await view.ended(state, cursor)


class _Lister:
    """One listing call: the filters, the page being filled, and the scan budget."""

    def __init__(
        self,
        store: Store,
        deserialize: Deserialize,
        task: str | None,
        search: str | None,
        limit: int,
        queues: list[str],
        now_ms: int,
        shards: Sequence[Store] = (),
    ) -> None:
        self.store = store
        self.shards = Shards(shards or (store,))
        #: (shard store, queue name) in listing order: each queue of the home, then the next
        self.sources = [(st, q) for st in self.shards.stores for q in queues]
        self.deserialize = deserialize
        self.task = task
        self.search = search
        self.limit = limit
        self.queues = queues
        self.now_ms = now_ms
        self.budget = limit * SCAN_FACTOR if (task or search) else limit
        self.items: list[JobSummary] = []
        self.scanned = 0

    def _summary(self, rec: JobRecord, state: str, queue: str | None, **extra: Any) -> bool:
        """Add ``rec`` to the page if it passes the filters; whether it did."""
        d = job_of(rec, self.deserialize)
        if not matches(rec.job_id, d, self.task, self.search):
            return False
        self.items.append(
            JobSummary(
                rec.job_id,
                d.task,
                queue,
                state,
                tries=rec.tries if rec.tries is not None else d.tries,
                enqueued_ms=d.enqueued_ms,
                args=args_text(d, SUMMARY_REPR_CHARS) if d.error is None else d.error,
                **extra,
            )
        )
        return True

    async def queued(self, state: State, cursor: str | None) -> JobPage:
        """Due (score ≤ now) or scheduled (later, without a claim marker: a claimed job is
        parked at its marker's expiry), queue by queue (shard by shard), earliest first."""
        fields = parse_cursor(cursor, 3)
        qi, score, skip = (int(fields[0]), fields[1], int(fields[2])) if fields else (0, "", 0)
        low, high = ("-inf", self.now_ms) if state == "queued" else (f"({self.now_ms}", "+inf")
        while qi < len(self.sources) and len(self.items) < self.limit:
            shard, name = self.sources[qi]
            start: float | str = score if score else low
            want = min(max(self.limit - len(self.items), 20), self.budget - self.scanned)
            if want <= 0:
                return JobPage(self.items, make_cursor(qi, score, skip), self.scanned)
            entries = await shard.queue_entries(name, low=start, high=high, offset=skip, count=want)
            self.scanned += len(entries)
            records = await shard.job_records([e[0] for e in entries], **LISTING_READ)
            for (_, s), rec in zip(entries, records, strict=True):
                skip = skip + 1 if str(s) == score else 1
                score = str(s)
                if rec.marker is not None or rec.payload is None:
                    continue  # claimed meanwhile (running) or gone (finished)
                if self._summary(rec, state, name, due_ms=s) and len(self.items) >= self.limit:
                    return JobPage(self.items, make_cursor(qi, score, skip), self.scanned)
            if len(entries) < want:
                qi, score, skip = qi + 1, "", 0
        more = qi < len(self.sources)
        return JobPage(self.items, make_cursor(qi, score, skip) if more else None, self.scanned)

    async def running(self, cursor: str | None) -> JobPage:
        """The holds sets of the instances with a heartbeat (each bounded by its consumer's
        concurrency), by id, with each job's progress."""
        fields = parse_cursor(cursor, 1)
        after = fields[0] if fields else ""
        held = [(j, i) for j, i in await self.shards.running_ids() if j > after]
        page = held[: self.budget]
        self.scanned = len(page)
        ids = [j for j, _ in page]
        records = await self._each(ids, lambda st, part: st.job_records(part, **LISTING_READ))
        where = await self._each(ids, lambda st, part: st.queues_of(part, self.queues))
        progress = await self._each(ids, Store.progress_many)
        last = after
        for (job_id, instance), rec, q, p in zip(page, records, where, progress, strict=True):
            last = job_id
            if rec.marker is None or rec.payload is None or q is None:
                continue  # ended meanwhile, or in a queue not listed
            extra = {"instance": instance, "progress": fraction(p)}
            if self._summary(rec, "running", q, **extra) and len(self.items) >= self.limit:
                break
        more = len(held) > 0 and last != held[-1][0]
        return JobPage(self.items, make_cursor(last) if more else None, self.scanned)

    async def ended(self, state: State, cursor: str | None) -> JobPage:
        """``failed``: the recent failures and the dead letters, ``done``: the recent
        successes; newest first, a page from ``before_ms``."""
        fields = parse_cursor(cursor, 1)
        before = int(fields[0]) if fields else None
        every = [await self._ended_ids(st, state, before) for st in self.shards.stores]
        entries = sorted((e for part in every for e in part), key=lambda e: -e[1])[: self.budget]
        self.scanned = len(entries)
        ids = [j for j, _ in entries]
        records = await self._each(
            ids, lambda st, ps: st.job_records(ps, results=True, **LISTING_READ)
        )
        failed = state == "failed"
        dead = await self._each(ids, Store.dead_entries) if failed else [None] * len(ids)
        fails = await self._each(ids, Store.failures_many) if failed else [None] * len(ids)
        last: int | None = None
        for (job_id, at), rec, letter, fail in zip(entries, records, dead, fails, strict=True):
            last = at
            if rec.payload is not None:
                continue  # queued or running again (retried)
            summary = self._ended(job_id, at, state, rec, letter, fail)
            if summary is not None and self._keep(summary, rec):
                self.items.append(summary)
                if len(self.items) >= self.limit:
                    break
        full = len(entries) >= self.budget or len(self.items) >= self.limit
        return JobPage(self.items, make_cursor(last) if full and last else None, self.scanned)

    async def _each(
        self, ids: list[str], read: Callable[[Store, list[str]], Awaitable[list[T]]]
    ) -> list[T]:
        """``read(store, ids)`` of each id's queue shard, in ``ids``' order."""
        got: dict[str, T] = {}
        for store, part in self.shards.group(ids):
            got.update(zip(part, await read(store, part), strict=True))
        return [got[j] for j in ids]

    async def _ended_ids(
        self, store: Store, state: State, before: int | None
    ) -> list[tuple[str, int]]:
        """The newest ids of one shard ended before ``before`` (at most the budget): the recent
        successes, or the recent failures and the dead letters merged (a job in both once)."""
        n = self.budget
        if state == "done":
            return await store.recent_done(n, before)
        found = dict(await store.dead_page(before, n))
        for job_id, at in await store.recent_failures(n, before):
            found[job_id] = max(at, found.get(job_id, at))
        return sorted(found.items(), key=lambda e: -e[1])[:n]

    def _ended(
        self,
        job_id: str,
        at: int,
        state: State,
        rec: JobRecord,
        letter: dict[str, Any] | None,
        fail: dict[str, Any] | None,
    ) -> JobSummary | None:
        prefix = self.shards.of(job_id).keys.prefix  # its shard's queue keys
        result = result_of(rec, self.deserialize, prefix)
        if state == "done" and not result:
            return None  # its result expired
        if state == "failed" and result.get("success"):
            return None  # retried since, and it succeeded
        f, dl = fail or {}, letter or {}
        queue = f.get("queue") or result.get("queue") or dl.get("queue")
        if queue is not None and queue not in self.queues:
            return None
        kind = "dead" if letter is not None else f.get("status") or ended_state(result, state)
        return JobSummary(
            job_id,
            f.get("task") or result.get("task") or dl.get("task"),
            queue,
            str(kind),
            tries=f.get("try") or result.get("tries") or dl.get("tries"),
            enqueued_ms=f.get("enqueued_ms") or result.get("enqueued_ms"),
            started_ms=f.get("started_ms") or result.get("started_ms"),
            finished_ms=f.get("finished_ms") or result.get("finished_ms") or at,
            instance=f.get("instance_name") or f.get("instance") or dl.get("instance"),
            args=error_line(f) or result.get("args") or dl.get("reason"),
        )

    def _keep(self, s: JobSummary, rec: JobRecord) -> bool:
        if self.task is not None and s.task != self.task:
            return False
        if self.search:
            return self.search.lower() in f"{s.job_id} {s.task or ''} {s.args or ''}".lower()
        return True


# -- one job ---------------------------------------------------------------------------------


async def job_detail(
    store: Store,
    job_id: str,
    *,
    queues: Sequence[str] = (DEFAULT_QUEUE,),
    deserialize: Deserialize = msgpack_loads,
    now_ms: int | None = None,
) -> JobDetail | None:
    """Everything Redis holds about ``job_id``, its state found from its records: ``queued``
    or ``scheduled`` (in a queue, due or not), ``running`` (claimed), ``done``, ``failed``,
    ``timeout`` or ``cancelled`` (its result, or failure record, is kept), ``dead`` (set
    aside); ``None`` when nothing is left of it. A record that does not decode is shown as
    ``undecodable``, never raised."""
    if now_ms is None:
        now_ms = round(await store.server_time_ms())
    rec = (await store.job_records([job_id], results=True, **DETAIL_READ))[0]
    place = await store.job_place(job_id, with_lanes(queues))  # and the duty lanes
    letter = await store.dead_record(job_id) if place.dead_ms is not None else None
    if letter is not None:
        letter.pop("payload_b64", None)
    job = job_of(rec, deserialize)
    result = result_of(rec, deserialize, store.keys.prefix)
    failure = await store.failure(job_id)
    progress = await store.progress(job_id)
    state = detail_state(rec, place, result, letter, now_ms)
    live = state in ("queued", "scheduled", "running")
    f: dict[str, Any] = failure if failure is not None and not live else {}
    if f and not result.get("success") and f.get("status") in ENDS:
        state = f["status"]
    if state is None:
        return None
    error = error_of(result) if state in ("failed", "cancelled", "timeout", "expired") else None
    if f:
        error = {
            "type": f.get("error_type"),
            "message": f.get("message"),
            "traceback": f.get("traceback"),
            "try": f.get("try"),
            "instance": f.get("instance_name") or f.get("instance"),
        }
    if letter is not None and error is None and state == "dead":
        error = {"type": "dead letter", "message": letter.get("reason"), "traceback": None}
    value = result.get("value")
    return JobDetail(
        job_id,
        job.task or result.get("task") or (letter or {}).get("task"),
        place.queue or result.get("queue") or (letter or {}).get("queue"),
        state,
        tries=rec.tries if rec.tries is not None else result.get("tries"),
        enqueued_ms=job.enqueued_ms or result.get("enqueued_ms"),
        due_ms=place.score_ms if state in ("queued", "scheduled") else None,
        started_ms=result.get("started_ms") or f.get("started_ms"),
        finished_ms=result.get("finished_ms") or f.get("finished_ms"),
        instance=instance_of(rec.marker) or f.get("instance_name") or f.get("instance"),
        progress=fraction(progress),
        progress_message=(progress or {}).get("message"),
        args=args_repr(job) if rec.payload else result.get("args_full"),
        kwargs=args_repr(job, kwargs=True) if rec.payload else result.get("kwargs_full"),
        result=short(repr(value), REPR_CHARS) if result.get("success") else None,
        error=error,
        dead=letter,
        abort_requested=place.abort_ms is not None,
        undecodable=job.error or result.get("undecodable"),
    )
