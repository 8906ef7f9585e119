"""Broadcasts, whole: a message every live process handles once, whatever its role.

``await ctx.broadcast("pricing", data)`` (or ``client.broadcast``) reaches the
``@app.on_broadcast("pricing")`` handlers of every process: drop an in-memory snapshot in
every replica, apply a config change everywhere (a polling-config manager).

Design. Pub/sub alone loses what is published while a subscriber reconnects, so each topic is
a capped Redis stream ``<prefix>bcast:<topic>`` (``broadcast.BROADCAST``): every message gets the
topic's next sequence number and the stream keeps the last :data:`HISTORY` messages. One
:class:`BroadcastListener` per process reads all its topics with ``XREAD BLOCK`` on a
connection of its own (the blocking read is the wake-up: delivery is one round trip) and keeps
a cursor per topic, the id of the last entry it read, in memory:

- **Reconnecting** (the connection dropped, Redis restarted, the process was paused): it reads
  on from its cursors, so it handles every message sent meanwhile, each once, up to the
  history. When more were sent, the sequence numbers show the gap: it is logged and counted
  (``missed``) and the newest messages are still handled: "you missed some, here is the
  latest". Write handlers so that the latest message is enough (a snapshot-invalidation
  handler just drops its snapshot; a config handler applies the whole config it carries).
- **Starting** (a new process): it handles the newest message of each topic once (handlers'
  ``on_start="latest"``, the default) and everything after it. That closes the window
  between loading state in ``on_startup`` and listening; the cost is that a process may
  re-apply a message its fresh state already reflects, so handlers must be idempotent (they
  are retried anyway). ``on_start="none"``: only messages sent after the process started.
- A stream that now ends before the cursor (Redis lost its data and the topic began again)
  is read from its beginning.

Each handler has its own queue and task: messages of a topic reach a handler in order, and a
slow or failing handler holds only its own later messages, never other handlers or topics.
A handler that raises is logged and retried with backoff, at most ``tries`` times in all,
then given up (logged, counted ``failed``).

The sender's process handles its own broadcasts too, once: it is a replica with its own copy.
A broadcast cannot loop: each message carries its *origin* (the sending instance, for logs)
and its *chain*, the topics whose handlers caused it. A broadcast sent from inside a handler to
a topic already in that chain, the handler's own topic included, is refused with a warning,
so neither a process nor a ping-pong between replicas can re-trigger a topic (subscribers
never re-broadcast). Cascades to other topics (a config change that invalidates a
cache) go through. The chain follows a handler's own calls and the tasks it starts, not the
jobs it enqueues: a handler that enqueues a job which broadcasts the same topic is a loop
this cannot see (give such a job a ``unique_key``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import structlog
from redis.exceptions import RedisError

from worker.core import malformed
from worker.core.clock import Clock
from worker.core.component import Component
from worker.core.logs import capped
from worker.core.metrics import Metrics
from worker.core.serializer import Deserialize
from worker.core.topics import HISTORY, MAX_BYTES, BroadcastDef, Message, handling
from worker.storage import BroadcastEntry, Store

log = structlog.get_logger("worker.broadcast")

NAME = "broadcast"
#: Messages read per topic per round trip.
READ_COUNT = 100
#: How long one read waits for a message (ms); also how soon the listener notices ``stop``.
BLOCK_MS = 1000
#: A failing handler is tried again after base·2ⁿ seconds, at most the cap.
RETRY_BASE_S = 0.5
RETRY_CAP_S = 10.0
#: The cursor of a stream read from its beginning.
START = "0-0"


def _id(entry_id: str) -> tuple[int, int]:
    """A stream entry id ``<ms>-<n>`` as a comparable pair."""
    ms_part, _, n = entry_id.partition("-")
    return int(ms_part), int(n or 0)


@dataclass
class _Inbox:
    """One handler's messages, handled in order by its own task."""

    handler: BroadcastDef
    pending: deque[Message] = field(default_factory=deque)
    ready: asyncio.Event = field(default_factory=asyncio.Event)


class BroadcastListener(Component):
    """Reads every topic this process handles and runs the handlers (every role)."""

    def __init__(
        self,
        handlers: Iterable[BroadcastDef],
        context: object,
        store: Store,
        deserialize: Deserialize,
        clock: Clock,
        *,
        metrics: Metrics | None = None,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        super().__init__(NAME, clock, sla_s=60.0)
        self.context = context
        #: a received payload longer than this is skipped (``WORKER_MAX_BROADCAST_BYTES``)
        self.max_bytes = max_bytes
        self.store = store
        self.deserialize = deserialize
        self.metrics = metrics
        self.inboxes: dict[str, list[_Inbox]] = {}
        for h in handlers:
            self.inboxes.setdefault(h.topic, []).append(_Inbox(h))
        self.topic_of = {store.keys.broadcast(t): t for t in self.inboxes}
        #: stream key -> id of the last entry read; kept across reconnects and restarts
        self.cursors: dict[str, str] = {}
        #: topic -> sequence number of the last message read
        self.seqs: dict[str, int] = {}
        #: stream key -> {entry id: sequence number} of the last messages read (at most
        #: HISTORY): tells a stream that lost its newest entries from one that began again
        self.recent: dict[str, dict[str, int]] = {}

    async def run(self, stop: asyncio.Event) -> None:
        boxes = [box for boxes in self.inboxes.values() for box in boxes]
        tasks = [
            asyncio.create_task(self._serve(box, stop), name=f"broadcast:{box.handler.topic}")
            for box in boxes
        ]
        try:
            await self._listen(stop)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- reading --------------------------------------------------------------------------------
    async def _listen(self, stop: asyncio.Event) -> None:
        synced = False
        backoff = 0.0
        while not stop.is_set():
            try:
                if not synced:
                    await self.sync()
                    synced = True
                await self.read_once()
                backoff = 0.0
            except (RedisError, OSError, TimeoutError) as exc:
                synced = False
                backoff = min(max(backoff * 2, 0.1), 2.0)
                log.warning(
                    "broadcast listener cannot reach Redis; it catches up when back",
                    error=f"{type(exc).__name__}: {exc}",
                    retry_in_s=backoff,
                )
                await self.clock.wait(stop, backoff)

    async def sync(self) -> None:
        """Place every cursor, on each (re)connection. The first time: at each topic's newest
        message, which is handed over as the start message. After that the cursors stay where
        they are (the catch-up), unless a stream now ends before its cursor (it began again
        after a data loss): then it is read from its beginning."""
        newest = await self.store.broadcast_newest(list(self.topic_of))
        for key, entry in newest.items():
            cursor = self.cursors.get(key)
            if cursor is None:
                self.cursors[key] = entry.entry_id if entry is not None else START
                if entry is not None:
                    self.receive(entry, start=True)
            elif cursor != START and (entry is None or _id(entry.entry_id) < _id(cursor)):
                topic = self.topic_of[key]
                kept = self.recent.get(key, {}).get(entry.entry_id) if entry is not None else None
                if entry is not None and kept is not None and kept == entry.seq:
                    # The stream we read, without its newest entries (a failover to a replica
                    # that missed them): everything it kept was handled; read on after it.
                    log.warning(
                        "broadcast topic lost its newest messages (a failover?)", topic=topic
                    )
                    self.cursors[key] = entry.entry_id
                    self.seqs[topic] = kept
                else:
                    log.warning("broadcast topic began again (Redis lost it?)", topic=topic)
                    self.cursors[key] = START
        self.health.ok(self.clock.monotonic())

    async def read_once(self) -> int:
        """One blocking read after the cursors; returns how many messages arrived."""
        entries = await self.store.broadcast_read(self.cursors, count=READ_COUNT, block_ms=BLOCK_MS)
        for entry in entries:
            self.receive(entry)
        self.health.ok(self.clock.monotonic())
        return len(entries)

    def receive(self, entry: BroadcastEntry, *, start: bool = False) -> None:
        """Move the cursor past ``entry`` and queue it for the topic's handlers; an entry
        without a sequence number (not written by :func:`publish`) is skipped, logged once."""
        topic = self.topic_of[entry.key]
        self.cursors[entry.key] = entry.entry_id
        if entry.seq is None or len(entry.payload) > self.max_bytes:
            why = (
                "its seq is not a number"
                if entry.seq is None
                else f"{len(entry.payload)} bytes, over WORKER_MAX_BROADCAST_BYTES"
            )
            malformed.skip("broadcast", entry.key, entry.entry_id, why)
            self._count(topic, "malformed")
            return
        recent = self.recent.setdefault(entry.key, {})
        recent[entry.entry_id] = entry.seq
        if len(recent) > HISTORY:
            del recent[next(iter(recent))]
        last = self.seqs.get(topic)
        if last is not None and entry.seq > last + 1:
            missed = entry.seq - last - 1
            log.warning(
                "broadcasts missed: more were sent while this process was away than are kept",
                topic=topic,
                missed=missed,
                history=HISTORY,
            )
            self._count(topic, "missed", missed)
        self.seqs[topic] = entry.seq
        self._count(topic, "received")
        msg = Message(topic, entry.seq, entry.origin, entry.chain, entry.payload, start)
        for box in self.inboxes[topic]:
            if start and box.handler.on_start == "none":
                continue
            box.pending.append(msg)
            box.ready.set()
        self._note()

    # -- handling -------------------------------------------------------------------------------
    async def _serve(self, box: _Inbox, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await box.ready.wait()
            box.ready.clear()
            while box.pending and not stop.is_set():
                await self.handle(box.handler, box.pending[0], stop)
                box.pending.popleft()
                self._note()

    async def handle(self, h: BroadcastDef, msg: Message, stop: asyncio.Event) -> bool:
        """Run ``h`` on ``msg``, retried with backoff up to ``h.tries`` runs; ``True`` if it
        succeeded. A payload that cannot be decoded is not retried."""
        fields = {"topic": msg.topic, "seq": msg.seq, "origin": msg.origin, "handler": h.name}
        try:
            data = self.deserialize(msg.payload)["data"]
        except Exception as exc:
            log.error("broadcast cannot be decoded", error=f"{type(exc).__name__}", **fields)
            self._count(msg.topic, "failed")
            return False
        delay = RETRY_BASE_S
        for attempt in range(1, h.tries + 1):
            token = handling.set(msg)
            try:
                await h.fn(self.context, data)
            except Exception as exc:
                error = capped(f"{type(exc).__name__}: {exc}")
                if attempt >= h.tries:
                    log.error(
                        "broadcast handler failed; giving up", error=error, exc_info=exc, **fields
                    )
                    self._count(msg.topic, "failed")
                    return False
                log.warning(
                    "broadcast handler failed; retrying", error=error, retry_in_s=delay, **fields
                )
                self._count(msg.topic, "retried")
            else:
                log.debug("broadcast handled", **fields)
                self._count(msg.topic, "handled")
                return True
            finally:
                handling.reset(token)
            if await self.clock.wait(stop, delay):
                return False
            delay = min(delay * 2, RETRY_CAP_S)
        return False

    def _count(self, topic: str, outcome: str, n: int = 1) -> None:
        if self.metrics is not None:
            self.metrics.broadcasts.labels(topic, outcome).inc(n)

    def _note(self) -> None:
        self.health.extra["topics"] = dict(self.seqs)
        self.health.extra["pending"] = sum(
            len(box.pending) for boxes in self.inboxes.values() for box in boxes
        )
