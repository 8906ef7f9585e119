"""Wake-ups: an idle consumer claims at once when an enqueue announces a due job.

Every enqueue through the framework publishes its due time on ``<prefix>wake``; a listener
here turns it into "claim now" (:attr:`Wakeups.woken`) or a timer for a deferred job
(:attr:`Wakeups.next_due`). A lost message costs at most the fallback poll: short while the
subscription is down (:attr:`Wakeups.subscribed` false: a look at once when it breaks, and
every ``idle_poll_max_s``), long while it is up (``idle_poll_subscribed_s``: a job nobody
announced is announced by the leader, :mod:`worker.duties.unannounced`); a look at once
when it is back, for what was announced meanwhile.

The leader's duties announce a duty lane job on ``<prefix>wake:duty`` instead: it wakes an idle
consumer the same way, and tells a busy one which shard's lanes to claim into its duty slots
(:meth:`Wakeups.duty_pending`).
"""

from __future__ import annotations

import asyncio

from worker.core.clock import Clock, ms
from worker.storage.sharded import Shards

#: A quiet wake subscription is pinged this often (one command), so a dead one is noticed.
PING_S = 55.0
#: Distinct duty due times remembered per shard (ticks and dispatches are due when announced:
#: more than a few waiting means every duty slot is busy, and one claim takes them all).
MAX_DUTY_DUES = 64


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
        #: the next fallback look reads the duty lanes too: every job written there is
        #: announced, so only while (or right after) the subscription was down can one be missed
        self.look_lanes = True
        #: per shard index, the due times (ms) of duty lane jobs announced and not yet claimed
        self.duty: dict[int, list[int]] = {}
        #: channel -> (its shard's index, a duty channel); set by :meth:`listen`
        self._channels: dict[str, tuple[int, bool]] = {}

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
        self._channels = {c: (i, False) for i, c in enumerate(self.store.channels())}
        self._channels.update({c: (i, True) for i, c in enumerate(self.store.duty_channels())})
        await self.store.home.listen(
            list(self._channels),  # two per queue shard: its wake and duty wake channels
            self._message,
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
        self.look_lanes = True
        self.event.set()

    def _message(self, channel: str, data: bytes) -> None:
        shard, duty = self._channels.get(channel, (0, False))
        self.heard(int(data), shard=shard if duty else None)

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
        """An enqueue announced a job due at ``due_ms``: claim now if it is due by this
        process's clock, else at that time (a claim now would not take it, ``CLAIM`` takes
        what is due by the same clock, and nothing else would remember it until the next
        fallback look). ``shard``: a duty lane job of that queue shard."""
        if shard is not None:
            dues = self.duty.setdefault(shard, [])
            if due_ms not in dues and len(dues) < MAX_DUTY_DUES:
                dues.append(due_ms)
        if due_ms <= ms(self.clock.time()):
            self.woken = True
        elif self.next_due is None or due_ms < self.next_due:
            self.next_due = due_ms
        self.event.set()
