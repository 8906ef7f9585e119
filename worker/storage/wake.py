"""The wake marker: an announcement wakes one idle consumer, not the fleet.

An announcement (an enqueue's script, the leader's relay of a plain ``PUBLISH``, a consumer
passing its turn on) ``ZADD``\\ s the due time to :attr:`~worker.storage.keys.Keys.wake_marker`
with ``LT``: one member whose score is the earliest due time announced, so a burst of enqueues
is one marker. Each idle consumer waits on it with ``BZPOPMIN``: Redis hands it to exactly one
of them (the one blocked longest), which claims a batch and, when more may be due, puts the
marker back for the next. The pub/sub announcement (``<prefix>wake``) stays for producers and
consumers of earlier versions.

The duty lanes (the leader's ticks and poll jobs) have a marker of their own,
:attr:`~worker.storage.keys.Keys.wake_duty_marker`, the same way: a consumer whose shared slots
are all busy still waits on it for its duty slots, and only one consumer claims per
announcement. It has no pub/sub announcement (consumers of earlier versions read no lanes).
"""

from __future__ import annotations

import time

from worker.storage.base import StoreBase

#: The marker's one member.
MEMBER = "wake"
#: A ``BZPOPMIN`` waits at most this long (one command per wait when nothing comes: what the
#: pub/sub subscription's ``PING`` cost before); its reply is awaited that long and
#: :data:`REPLY_GRACE_S` more (not the connection's socket timeout), so a dead connection (a
#: half-open socket never errors by itself) is noticed within a minute.
BLOCK_S = 55.0
REPLY_GRACE_S = 5.0
#: What a pub/sub announcement that also set the marker carries before its due time (old
#: consumers read ``int("+123")`` as 123; the leader's relay skips such announcements).
MARKED = "+"


class WakeOps(StoreBase):
    """The wake marker: take it (blocking), set it (see module docstring)."""

    def _marker(self, duty: bool) -> str:
        return self.keys.wake_duty_marker if duty else self.keys.wake_marker

    async def take_wake(self, timeout_s: float = BLOCK_S, *, duty: bool = False) -> int | None:
        """Wait up to ``timeout_s`` for the marker (``duty``: the duty lanes' marker) and take
        it: its due time (ms), ``None`` when none came (``BZPOPMIN``: of all the consumers
        waiting, one gets it). On a
        connection of its own from the pool, whose reply is awaited ``timeout_s`` plus
        :data:`REPLY_GRACE_S` (the pool's socket timeout may be shorter than the wait)."""
        pool = self.redis.connection_pool
        try:
            conn = await pool.get_connection()  # redis-py 5.3+: no command name
        except TypeError:
            conn = await pool.get_connection("BZPOPMIN")
        try:
            sent = time.monotonic()
            await conn.send_command("BZPOPMIN", self._marker(duty), timeout_s)
            got = await conn.read_response(timeout=timeout_s + REPLY_GRACE_S)
            if got is None and time.monotonic() - sent >= timeout_s + REPLY_GRACE_S:
                raise TimeoutError(f"no reply to BZPOPMIN {timeout_s:g} within {REPLY_GRACE_S} s")
        except BaseException:
            await conn.disconnect()  # a reply may still come: never hand this one out again
            raise
        finally:
            await pool.release(conn)
        if not got:
            return None
        if isinstance(got, list) and len(got) == 3:
            return int(float(got[2]))
        raise ValueError(f"unexpected BZPOPMIN reply: {got!r}")

    async def mark_wake(self, due_ms: int, *, duty: bool = False) -> None:
        """Set the marker (``duty``: the duty lanes') to ``due_ms`` unless it holds an earlier
        time (``ZADD LT``): the next consumer waiting with room takes it."""
        await self.redis.zadd(self._marker(duty), {MEMBER: due_ms}, lt=True)

    async def announce(self, due_ms: int, *, duty: bool = False) -> None:
        """Announce ``due_ms`` as an enqueue does: the marker (one idle consumer claims) and the
        pub/sub channel, marked as such (consumers of earlier versions hear it; the relay
        leaves it), in one round trip. ``duty``: a duty lane job, the duty marker alone."""
        if duty:
            await self.mark_wake(due_ms, duty=True)
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zadd(self.keys.wake_marker, {MEMBER: due_ms}, lt=True)
            pipe.publish(self.keys.wake, f"{MARKED}{due_ms}")
            await pipe.execute()
