"""Pub/sub, every channel of the framework: subscribe, hand messages on, reconnect.

The channels are the leader's (``leader_channel``: a release; ``leader_announce``: an
acquisition; ``leader_handoff_channel``: a handoff request) and the consumers' ``wake`` (an
enqueue's due time). Whoever listens passes its channels and a handler to
:meth:`SubscriptionOps.listen`; this module is the one place that reconnects: after any error
it waits on the process's clock and subscribes again on a fresh connection from the pool, and
a Sentinel pool asks the Sentinels for the primary on every new connection, so a failover is
followed there. A message lost meanwhile only costs time: every listener also polls.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

from worker.clock import Clock
from worker.storage.base import StoreBase, _s

#: A subscriber's handler: ``(channel, data)`` of one message; it must not block.
Handler = Callable[[str, bytes], None]


class SubscriptionOps(StoreBase):
    """Listening on pub/sub channels with reconnect (see module docstring)."""

    async def listen(
        self,
        channels: Sequence[str],
        handle: Handler,
        stop: asyncio.Event,
        *,
        clock: Clock,
        poll_s: float,
        retry_s: float,
    ) -> None:
        """Until ``stop`` is set, hand every message on ``channels`` to ``handle``; wait at
        most ``poll_s`` for one at a time (shorter than the connection's socket timeout), and
        ``retry_s`` (on ``clock``) before subscribing again after an error."""
        while not stop.is_set():
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(*channels)
                while not stop.is_set():
                    msg = await pubsub.get_message(timeout=poll_s)
                    if msg is None or msg.get("type") != "message":
                        continue
                    data = msg.get("data")
                    handle(
                        _s(msg.get("channel")),
                        data if isinstance(data, bytes) else str(data).encode(),
                    )
            except asyncio.CancelledError:
                raise
            except Exception:
                await clock.wait(stop, retry_s)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.shield(pubsub.aclose())  # type: ignore[no-untyped-call]
