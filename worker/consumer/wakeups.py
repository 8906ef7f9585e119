"""Wake-ups: an idle consumer claims at once when an enqueue announces a due job.

Every enqueue through the framework publishes its due time on ``<prefix>wake``; a listener
here turns it into "claim now" (:attr:`Wakeups.woken`) or a timer for a deferred job
(:attr:`Wakeups.next_due`). A lost message costs at most the fallback poll: short while the
subscription is down (:attr:`Wakeups.subscribed` false: a look at once when it breaks, and
every ``idle_poll_max_s``), long while it is up (``idle_poll_subscribed_s``: a job nobody
announced is announced by the leader, :mod:`worker.duties.unannounced`); a look at once
when it is back, for what was announced meanwhile.
"""

from __future__ import annotations

import asyncio

from worker.core.clock import Clock, ms
from worker.storage.sharded import Shards

#: A quiet wake subscription is pinged this often (one command), so a dead one is noticed.
PING_S = 55.0


class Wakeups:
    """Owns :attr:`woken`, :attr:`next_due` and the :attr:`event` the fetch loop waits on."""

    def __init__(self, store: Shards, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self.event = asyncio.Event()
        self.woken = True  # claim on the first round
        self.next_due: int | None = None  # a deferred job announced for this time (ms)
        #: the wake channel is subscribed (pinged when quiet): the fallback poll may be rare
        self.subscribed = False

    def poke(self) -> None:
        """Wake the fetch loop (a run ended: room for another)."""
        self.event.set()

    def again(self) -> None:
        """Claim again at once (a full batch: more may be due)."""
        self.woken = True
        self.event.set()

    async def listen(self, stop: asyncio.Event) -> None:
        """Pub/sub on the wake channel until ``stop``, reconnecting after a second (the
        store's one subscription loop, :mod:`worker.storage.subscriptions`)."""
        await self.store.home.listen(
            self.store.channels(),  # one per queue shard
            lambda _channel, data: self.heard(int(data)),
            stop,
            clock=self.clock,
            poll_s=1.0,
            retry_s=1.0,
            ping_s=PING_S,
            healthy=self.health,
        )

    def health(self, subscribed: bool) -> None:
        """The subscription came up or broke: look at the queues at once either way (a broken
        one hears nothing; one back may have missed announcements)."""
        self.subscribed = subscribed
        self.event.set()

    def heard(self, due_ms: int) -> None:
        """An enqueue announced a job due at ``due_ms``: claim now if it is due by this
        process's clock, else at that time (a claim now would not take it, ``CLAIM`` takes
        what is due by the same clock, and nothing else would remember it until the next
        fallback look)."""
        if due_ms <= ms(self.clock.time()):
            self.woken = True
        elif self.next_due is None or due_ms < self.next_due:
            self.next_due = due_ms
        self.event.set()
