"""Wake-ups: an idle consumer claims at once when an enqueue announces a due job.

Every enqueue through the framework publishes its due time on ``<prefix>wake``; a listener
here turns it into "claim now" (:attr:`Wakeups.woken`) or a timer for a deferred job
(:attr:`Wakeups.next_due`). A lost message costs at most the fallback poll.
"""

from __future__ import annotations

import asyncio
import contextlib

from worker.clock import Clock, ms
from worker.store import Store


class Wakeups:
    """Owns :attr:`woken`, :attr:`next_due` and the :attr:`event` the fetch loop waits on."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self.event = asyncio.Event()
        self.woken = True  # claim on the first round
        self.next_due: int | None = None  # a deferred job announced for this time (ms)

    def poke(self) -> None:
        """Wake the fetch loop (a run ended: room for another)."""
        self.event.set()

    def again(self) -> None:
        """Claim again at once (a full batch: more may be due)."""
        self.woken = True
        self.event.set()

    async def listen(self, stop: asyncio.Event) -> None:
        """Pub/sub on the wake channel until ``stop``, reconnecting after a second."""
        redis = self.store.redis
        while not stop.is_set():
            pubsub = redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.store.keys.wake)
                while not stop.is_set():
                    msg = await pubsub.get_message(timeout=1.0)
                    if msg is not None and msg.get("type") == "message":
                        self.heard(int(msg["data"]))
            except asyncio.CancelledError:
                raise
            except Exception:
                await self.clock.wait(stop, 1.0)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.shield(pubsub.aclose())  # type: ignore[no-untyped-call]

    def heard(self, due_ms: int) -> None:
        """An enqueue announced a job due at ``due_ms``."""
        if due_ms <= ms(self.clock.time()) + 1:
            self.woken = True
        elif self.next_due is None or due_ms < self.next_due:
            self.next_due = due_ms
        self.event.set()
