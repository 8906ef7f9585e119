"""Pub/sub, every channel of the framework: subscribe, hand messages on, reconnect.

The channels are the leader's (``leader_channel``: a release; ``leader_announce``: an
acquisition; ``leader_handoff_channel``: a handoff request) and the consumers' ``wake`` (an
enqueue's due time). Whoever listens passes its channels and a handler to
:meth:`SubscriptionOps.listen`; this module is the one place that reconnects: after any error
it waits on the process's clock and subscribes again on a fresh connection from the pool, and
a Sentinel pool asks the Sentinels for the primary on every new connection, so a failover is
followed there. A message lost meanwhile only costs time: every listener also polls, often
while its subscription is down (``healthy(False)``) and rarely while it is up: a listener with
``ping_s`` sends a ``PING`` after that long without a message and takes a connection that does
not answer within ``PONG_WAIT_S`` for dead (a half-open socket never errors by itself).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

from redis.asyncio.client import PubSub

from worker.core.clock import Clock
from worker.storage.base import StoreBase, _s

#: A subscriber's handler: ``(channel, data)`` of one message; it must not block.
Handler = Callable[[str, bytes], None]
#: Told ``True`` once subscribed, ``False`` when the subscription broke (poll meanwhile).
Healthy = Callable[[bool], None]
#: How long a ``PING`` on a quiet subscription may go unanswered before it counts as dead.
PONG_WAIT_S = 5.0


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
        ping_s: float | None = None,
        healthy: Healthy | None = None,
    ) -> None:
        """Until ``stop`` is set, hand every message on ``channels`` to ``handle``; wait at
        most ``poll_s`` for one at a time (shorter than the connection's socket timeout), and
        ``retry_s`` (on ``clock``) before subscribing again after an error. With ``ping_s``, a
        subscription quiet that long is pinged, and one whose ping goes unanswered is
        reconnected; ``healthy`` hears each subscribe (``True``) and each break (``False``)."""
        while not stop.is_set():
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(*channels)
                if ping_s is not None and pubsub.connection is not None:
                    # our PING (answered within PONG_WAIT_S, or reconnect) replaces redis-py's
                    # health check, which pings every 30 s and never notices a missing pong
                    pubsub.connection.health_check_interval = 0
                if healthy is not None:
                    healthy(True)
                await self._receive(pubsub, handle, stop, clock, poll_s, ping_s)
            except asyncio.CancelledError:
                raise
            except Exception:
                if healthy is not None:
                    healthy(False)
                await clock.wait(stop, retry_s)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.shield(pubsub.aclose())  # type: ignore[no-untyped-call]

    async def neighbour_channels(self) -> list[str] | None:
        """The framework's channels of this key prefix that processes of *another* database of
        this server listen on (``PUBSUB CHANNELS``; Pub/Sub is server-wide): another app, or
        this one misconfigured, uses the prefix there. ``None`` when it cannot be read (an
        ACL without ``PUBSUB``); always empty on a Redis Cluster (one database)."""
        if not hasattr(self.redis, "connection_pool"):
            return []
        prefix = "".join("\\" + c if c in "*?[]\\" else c for c in self.keys.prefix)
        try:
            found = await self.redis.pubsub_channels(f"{prefix}leader:released*")
            found += await self.redis.pubsub_channels(f"{prefix}wake*")
        except Exception:
            return None
        ours = {self.keys.leader_channel, self.keys.wake}
        bases = (f"{self.keys.prefix}leader:released", f"{self.keys.prefix}wake")
        out = set()
        for raw in found[:1000]:
            name = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
            for base in bases:
                tail = name[len(base) :] if name.startswith(base) else None
                if name not in ours and tail is not None and (tail == "" or _db_scope(tail)):
                    out.add(name)
        return sorted(out)

    @staticmethod
    async def _receive(
        pubsub: PubSub,
        handle: Handler,
        stop: asyncio.Event,
        clock: Clock,
        poll_s: float,
        ping_s: float | None,
    ) -> None:
        heard, pinged = clock.monotonic(), None
        while not stop.is_set():
            now = clock.monotonic()
            if ping_s is not None and pinged is None and now - heard >= ping_s:
                await pubsub.ping()
                pinged = now
            elif pinged is not None and now - pinged > PONG_WAIT_S:
                raise ConnectionError(f"no answer to a PING within {PONG_WAIT_S:g} s")
            msg = await pubsub.get_message(timeout=poll_s)
            if msg is None:
                continue
            heard, pinged = clock.monotonic(), None  # anything at all: the connection is up
            if msg.get("type") != "message":
                continue
            data = msg.get("data")
            handle(_s(msg.get("channel")), data if isinstance(data, bytes) else str(data).encode())


def _db_scope(tail: str) -> bool:
    """``tail`` is a channel scope :func:`keys.channel_scope` makes (``@db<n>``)."""
    return tail.startswith("@db") and tail[3:].isascii() and tail[3:].isdigit()
