"""Wake-ups: an idle consumer claims at once when an enqueue announces a due job.

Every enqueue through the framework sets its shard's wake marker to its due time (one member,
the earliest due time: see :mod:`worker.storage.wake`); each consumer with room waits on it
with ``BZPOPMIN``, and Redis hands it to exactly one of them, so an announcement costs one
claim whatever the fleet's size. The one woken turns it into "claim now"
(:attr:`Wakeups.woken`) or a timer for a deferred job (:attr:`Wakeups.next_due`); one that
took it without room for a job passes it back (:meth:`Wakeups.pass_on`), as does a claim that
filled its batch (more may be due: the next consumer claims). A turn lost (the consumer
holding it died) costs at most the leader's look at the queue heads
(:mod:`worker.duties.unannounced`, 0.75 s), else the fallback poll: short while the marker
cannot be read
(:attr:`Wakeups.subscribed` false: a look at once when it breaks, and every
``idle_poll_max_s``), long while it can (``idle_poll_subscribed_s``); a look at once when it
is back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from worker.core.clock import Clock, ms
from worker.storage.sharded import Shards
from worker.storage.store import Store
from worker.storage.wake import BLOCK_S

log = structlog.get_logger("worker.consumer")

#: Wait this long before taking the marker again after an error.
RETRY_S = 1.0


class Wakeups:
    """Owns :attr:`woken`, :attr:`next_due` and the :attr:`event` the fetch loop waits on."""

    def __init__(
        self, store: Shards, clock: Clock, room: Callable[[], bool] = lambda: True
    ) -> None:
        self.store = store
        self.clock = clock
        self.room = room  # whether a job claimed now could start
        self.event = asyncio.Event()
        self.woken = True  # claim on the first round
        self.next_due: int | None = None  # a deferred job announced for this time (ms)
        #: the marker is being waited on (every shard's): the fallback poll may be rare
        self.subscribed = False
        self._roomy = asyncio.Event()  # set when a run ends: there may be room again
        self._healthy: dict[int, bool] = {}

    def poke(self) -> None:
        """Wake the fetch loop (a run ended: room for another)."""
        self.event.set()
        self._roomy.set()

    def again(self) -> None:
        """Claim again at once (a full batch: more may be due)."""
        self.woken = True
        self.event.set()

    def pass_on(self, store: Store, due_ms: int | None = None) -> None:
        """Put ``store``'s marker back (due now unless ``due_ms``): the next consumer waiting
        takes the turn (a full batch left no room here, or the marker came without room)."""
        task = asyncio.create_task(self._pass_on(store, due_ms), name="consumer:wake-pass")
        task.add_done_callback(lambda t: None if t.cancelled() else t.exception())

    async def _pass_on(self, store: Store, due_ms: int | None) -> None:
        try:
            await store.mark_wake(ms(self.clock.time()) if due_ms is None else due_ms)
        except Exception as exc:  # the others look by themselves (the leader, the fallback)
            log.info("could not pass the wake-up on", error=repr(exc))

    async def listen(self, stop: asyncio.Event) -> None:
        """Wait on every shard's marker until ``stop`` (one task and connection per shard: on
        a Redis Cluster each lives on its shard's node)."""
        await asyncio.gather(*(self._watch(i, s, stop) for i, s in enumerate(self.store.stores)))

    async def _watch(self, shard: int, store: Store, stop: asyncio.Event) -> None:
        first = True
        while not stop.is_set():
            if not self.room():  # full: leave the turn to a consumer that can take a job
                self._roomy.clear()
                if not self.room():
                    await self.clock.wait((stop, self._roomy), 1.0)
                continue
            try:
                due = await store.take_wake(0.01 if first else BLOCK_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._healthy.get(shard, True):
                    log.warning("cannot wait on the wake marker", shard=shard, error=repr(exc))
                self.health(shard, False)
                await self.clock.wait(stop, RETRY_S)
                first = True  # back: say so at once, not after a whole wait
                continue
            self.health(shard, True)
            first = False
            if due is None:
                continue
            if self.room() and not stop.is_set():
                self.heard(due)
            else:
                await self._pass_on(store, due)

    def health(self, shard: int, ok: bool) -> None:
        """A shard's marker could (not) be read: on a change, look at the queues at once
        either way (one broken hears nothing; one back may have missed announcements)."""
        if self._healthy.get(shard) == ok:
            return
        self._healthy[shard] = ok
        self.subscribed = len(self._healthy) == self.store.n and all(self._healthy.values())
        self.event.set()

    def heard(self, due_ms: int) -> None:
        """An announcement of a job due at ``due_ms`` came to this consumer: claim now if it is
        due by this process's clock, else at that time (a claim now would not take it,
        ``CLAIM`` takes what is due by the same clock, and nothing else would remember it
        until the next fallback look)."""
        if due_ms <= ms(self.clock.time()):
            self.woken = True
        elif self.next_due is None or due_ms < self.next_due:
            self.next_due = due_ms
        self.event.set()
