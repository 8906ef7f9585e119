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

The leader's duties announce a duty lane job on the shard's duty marker instead
(``<prefix>wakeup:duty``), waited on the same way by every consumer with room for a duty job:
a free shared slot, or only a free duty slot (every shared one busy). The one that takes it
claims that shard's lanes (:meth:`Wakeups.duty_pending`): into a shared slot when it has one,
else into its duty slots. Each marker has its own wait (a connection per marker and shard): a
consumer whose shared slots fill or free up never has to leave a wait to change what it waits
for.
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
#: Distinct duty due times remembered per shard (ticks and dispatches are due when announced:
#: more than a few waiting means every duty slot is busy, and one claim takes them all).
MAX_DUTY_DUES = 64


class Wakeups:
    """Owns :attr:`woken`, :attr:`next_due`, :attr:`duty` and the :attr:`event` the fetch loop
    waits on."""

    def __init__(
        self,
        store: Shards,
        clock: Clock,
        room: Callable[[], bool] = lambda: True,
        duty_room: Callable[[], bool] | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.room = room  # whether a user job claimed now could start (a shared slot free)
        #: whether a duty lane job claimed now could start (a shared or a duty slot free)
        self.duty_room = duty_room or room
        self.event = asyncio.Event()
        self.woken = True  # claim on the first round
        self.next_due: int | None = None  # a deferred job announced for this time (ms)
        #: every marker of every shard is being waited on: the fallback poll may be rare
        self.subscribed = False
        #: the next fallback look reads the duty lanes too: every job written there is
        #: announced, so only while (or right after) a marker could not be read can one be missed
        self.look_lanes = True
        #: per shard index, the due times (ms) of duty lane jobs announced and not yet claimed
        self.duty: dict[int, list[int]] = {}
        #: per marker (duty or not): set when a run ends, there may be room again
        self._roomy = {False: asyncio.Event(), True: asyncio.Event()}
        self._healthy: dict[tuple[int, bool], bool] = {}

    def poke(self) -> None:
        """Wake the fetch loop (a run ended: room for another)."""
        self.event.set()
        for roomy in self._roomy.values():
            roomy.set()

    def again(self) -> None:
        """Claim again at once (a full batch: more may be due)."""
        self.woken = True
        self.event.set()

    def pass_on(self, store: Store, due_ms: int | None = None, *, duty: bool = False) -> None:
        """Put ``store``'s marker (``duty``: its duty marker) back, due now unless ``due_ms``:
        the next consumer waiting takes the turn (a full batch left no room here, or the
        marker came without room)."""
        task = asyncio.create_task(self._pass_on(store, due_ms, duty), name="consumer:wake-pass")
        task.add_done_callback(lambda t: None if t.cancelled() else t.exception())

    async def _pass_on(self, store: Store, due_ms: int | None, duty: bool) -> None:
        try:
            due = ms(self.clock.time()) if due_ms is None else due_ms
            await store.mark_wake(due, duty=duty)
        except Exception as exc:  # the others look by themselves (the leader, the fallback)
            log.info("could not pass the wake-up on", error=repr(exc))

    async def listen(self, stop: asyncio.Event) -> None:
        """Wait on every shard's markers until ``stop`` (one task and connection per marker and
        shard: on a Redis Cluster each lives on its shard's node)."""
        await asyncio.gather(
            *(
                self._watch(i, s, stop, duty)
                for i, s in enumerate(self.store.stores)
                for duty in (False, True)
            )
        )

    async def _watch(self, shard: int, store: Store, stop: asyncio.Event, duty: bool) -> None:
        room, roomy = (self.duty_room if duty else self.room), self._roomy[duty]
        first = True
        while not stop.is_set():
            if not room():  # full: leave the turn to a consumer that can take a job
                roomy.clear()
                if not room():
                    await self.clock.wait((stop, roomy), 1.0)
                continue
            try:
                due = await store.take_wake(0.01 if first else BLOCK_S, duty=duty)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._healthy.get((shard, duty), True):
                    log.warning(
                        "cannot wait on the wake marker", shard=shard, duty=duty, error=repr(exc)
                    )
                self.health(shard, False, duty=duty)
                await self.clock.wait(stop, RETRY_S)
                first = True  # back: say so at once, not after a whole wait
                continue
            self.health(shard, True, duty=duty)
            first = False
            if due is None:
                continue
            if room() and not stop.is_set():
                self.heard(due, shard=shard if duty else None)
            else:
                await self._pass_on(store, due, duty)

    def health(self, shard: int, ok: bool, *, duty: bool = False) -> None:
        """A shard's marker could (not) be read: on a change, look at the queues (and the
        lanes) at once either way (one broken hears nothing; one back may have missed
        announcements)."""
        if self._healthy.get((shard, duty)) == ok:
            return
        self._healthy[(shard, duty)] = ok
        self.subscribed = len(self._healthy) == 2 * self.store.n and all(self._healthy.values())
        self.look_lanes = True
        self.event.set()

    def duty_pending(self, shard: int, now_ms: int) -> bool:
        """A duty lane job of ``shard`` was announced due by ``now_ms`` and not claimed since."""
        return any(d <= now_ms for d in self.duty.get(shard, ()))

    def duty_claimed(self, shard: int, now_ms: int) -> None:
        """``shard``'s lanes were read to the end of what is due by ``now_ms``."""
        left = [d for d in self.duty.get(shard, ()) if d > now_ms]
        if left:
            self.duty[shard] = left
        else:
            self.duty.pop(shard, None)

    def heard(self, due_ms: int, *, shard: int | None = None) -> None:
        """An announcement of a job due at ``due_ms`` came to this consumer: claim now if it is
        due by this process's clock, else at that time (a claim now would not take it,
        ``CLAIM`` takes what is due by the same clock, and nothing else would remember it
        until the next fallback look). ``shard``: a duty lane job of that queue shard (its
        duty marker)."""
        if shard is not None:
            dues = self.duty.setdefault(shard, [])
            if due_ms not in dues and len(dues) < MAX_DUTY_DUES:
                dues.append(due_ms)
        if due_ms <= ms(self.clock.time()):
            self.woken = True
        elif self.next_due is None or due_ms < self.next_due:
            self.next_due = due_ms
        self.event.set()
