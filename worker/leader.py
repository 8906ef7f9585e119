"""Leadership: a fenced Redis lease (:class:`LeaderElector`) and an always-leader stand-in.

Protocol (DESIGN §5): the lock value is ``<epoch>:<token>``; acquiring is one script that
INCRs the epoch; renewing compares the whole value and *replaces* the TTL; releasing compares,
deletes and publishes so standbys campaign at once. The leader steps down when

- the renew deadline passes, measured on the monotonic clock from when the last *successful*
  renew was sent (so a renew that lands late cannot stretch the lease in our mind),
- a renew answers "not yours", or
- any fenced write is refused (:meth:`Leadership.lost`).

Stepping down cancels the singleton components; leading again needs a fresh acquisition and
therefore a new epoch. "Am I leader?" never raises: in doubt the answer is no.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from uuid import uuid4

import structlog
from redis.asyncio import Redis

from worker import keys as K
from worker.clock import Clock, ms
from worker.component import Component, wait_for_event

log = structlog.get_logger("worker.leader")

OnElected = Callable[[str, int], None]
OnLost = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class LeaderTiming:
    """Lease timings in seconds; ``renew_interval < renew_deadline < ttl``."""

    ttl_s: float = 10.0
    renew_interval_s: float = 2.0
    renew_deadline_s: float = 6.0
    poll_interval_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.renew_interval_s < self.renew_deadline_s < self.ttl_s:
            raise ValueError("leader timing must satisfy renew_interval < renew_deadline < ttl")


class Leadership(Component):
    """What the runtime needs from any leadership implementation."""

    name = "leader"

    def __init__(self, clock: Clock | None = None) -> None:
        super().__init__(clock)
        self.value: str | None = None
        self.transitions = 0
        self.on_elected: OnElected | None = None
        self.on_lost: OnLost | None = None
        self._lost = asyncio.Event()
        self._lost_reason = ""
        self._acquired_at: float | None = None

    @property
    def is_leader(self) -> bool:
        return self.value is not None

    @property
    def epoch(self) -> int | None:
        if self.value is None:
            return None
        try:
            return int(self.value.split(":", 1)[0])
        except ValueError:
            return None

    def lease_age(self) -> float | None:
        if self._acquired_at is None or self.value is None:
            return None
        return self.clock.monotonic() - self._acquired_at

    def lost(self, reason: str) -> None:
        """Report that a fenced write was refused: step down as soon as possible."""
        if self.value is not None:
            self._lost_reason = reason
            self._lost.set()

    async def release(self) -> None:
        """Give the lease up (clean shutdown)."""

    def _elected(self, value: str) -> None:
        self.value = value
        self.transitions += 1
        self._acquired_at = self.clock.monotonic()
        self._lost = asyncio.Event()
        self.health.extra.update(is_leader=True, epoch=self.epoch)
        log.info("leadership acquired", epoch=self.epoch)
        if self.on_elected is not None:
            self.on_elected(value, self.epoch or 0)

    async def _step_down(self, reason: str) -> None:
        if self.value is None:
            return
        epoch = self.epoch
        self.value = None
        self._acquired_at = None
        self.transitions += 1
        self.health.extra.update(is_leader=False, epoch=None)
        log.warning("leadership lost; stepping down", epoch=epoch, reason=reason)
        if self.on_lost is not None:
            await self.on_lost(reason)


class LeaderElector(Leadership):
    """Campaigns for, renews and releases the Redis lease.

    ``redis`` should be a client *without* automatic retries: a retried renew could land after
    the deadline we already trusted.
    """

    def __init__(
        self,
        redis: Redis,
        keys: K.Keys,
        timing: LeaderTiming,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(clock)
        self.redis = redis
        self.keys = keys
        self.timing = timing
        self.token = uuid4().hex
        self.health.sla_s = max(timing.ttl_s, timing.poll_interval_s * 5)
        self._acquire = redis.register_script(K.ACQUIRE)
        self._renew = redis.register_script(K.RENEW)
        self._release = redis.register_script(K.RELEASE)
        self._last_renew_sent: float | None = None

    async def run(self, stop: asyncio.Event) -> None:
        wake = asyncio.Event()
        listener = asyncio.create_task(self._listen(wake, stop), name="leader:listen")
        try:
            while not stop.is_set():
                if self.value is None:
                    await self._campaign()
                    self.health.ok(self.clock.monotonic())
                    if self.value is None:
                        wake.clear()
                        delay = self.timing.poll_interval_s * random.uniform(0.75, 1.25)
                        await _wait_any((stop, wake), delay)
                else:
                    await self._lead(stop)
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)

    async def _campaign(self) -> None:
        sent = self.clock.monotonic()
        try:
            value = await asyncio.wait_for(
                self._acquire(
                    keys=[self.keys.leader, self.keys.leader_epoch],
                    args=[self.token, ms(self.timing.ttl_s)],
                ),
                timeout=self.timing.renew_deadline_s,
            )
        except Exception as exc:  # connection trouble: stay a standby, try again later
            log.warning("leader campaign failed", error=f"{type(exc).__name__}: {exc}")
            return
        if value:
            self._last_renew_sent = sent
            self._elected(value.decode() if isinstance(value, bytes) else str(value))

    async def _lead(self, stop: asyncio.Event) -> None:
        """Renew until stopped, lost, or past the deadline."""
        t = self.timing
        while self.value is not None and not stop.is_set():
            interval = t.renew_interval_s * random.uniform(0.8, 1.0)
            await _wait_any((stop, self._lost), interval)
            if stop.is_set():
                return  # the runtime releases after stopping the singletons
            if self._lost.is_set():
                await self._step_down(self._lost_reason or "fenced write refused")
                return
            now = self.clock.monotonic()
            assert self._last_renew_sent is not None
            remaining = t.renew_deadline_s - (now - self._last_renew_sent)
            if remaining <= 0:
                await self._step_down("renew deadline passed")
                return
            sent = now
            try:
                ok = await asyncio.wait_for(
                    self._renew(keys=[self.keys.leader], args=[self.value, ms(t.ttl_s)]),
                    timeout=remaining,
                )
            except Exception as exc:
                log.warning("lease renew failed", error=f"{type(exc).__name__}: {exc}")
                if self.clock.monotonic() - self._last_renew_sent >= t.renew_deadline_s:
                    await self._step_down("renew deadline passed")
                    return
                continue
            if ok == 1:
                self._last_renew_sent = sent
                self.health.ok(self.clock.monotonic())
            else:
                await self._step_down("lease is no longer ours")
                return

    async def _listen(self, wake: asyncio.Event, stop: asyncio.Event) -> None:
        """Wake the campaign loop when a leader releases (pub/sub); fall back to polling."""
        while not stop.is_set():
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.keys.leader_channel)
                while not stop.is_set():
                    msg = await pubsub.get_message(timeout=1.0)
                    if msg is not None and msg.get("type") == "message":
                        wake.set()
            except asyncio.CancelledError:
                raise
            except Exception:
                await wait_for_event(stop, self.timing.poll_interval_s)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.shield(pubsub.aclose())  # type: ignore[no-untyped-call]

    async def release(self) -> None:
        value = self.value
        if value is None:
            return
        self.value = None
        self._acquired_at = None
        self.health.extra.update(is_leader=False, epoch=None)
        try:
            released = await asyncio.wait_for(
                self._release(keys=[self.keys.leader], args=[value, self.keys.leader_channel]),
                timeout=2.0,
            )
            log.info("leadership released", released=bool(released))
        except Exception as exc:
            log.warning("lease release failed; it expires by itself", error=str(exc))


class StaticLeader(Leadership):
    """Always leader: for single-node deployments and tests (Oban's ``Isolated`` peer).

    It writes the lock without expiry so the fenced scripts work unchanged. Two static leaders
    on one Redis fence each other out repeatedly: use it only where one process runs.
    """

    def __init__(
        self, redis: Redis, keys: K.Keys, clock: Clock | None = None, retry_s: float = 1.0
    ) -> None:
        super().__init__(clock)
        self.redis = redis
        self.keys = keys
        self.retry_s = retry_s
        self.token = uuid4().hex

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if self.value is None:
                value = await self.redis.eval(
                    K.CLAIM_STATIC, 2, self.keys.leader, self.keys.leader_epoch, self.token
                )
                self._elected(value.decode() if isinstance(value, bytes) else str(value))
            self.health.ok(self.clock.monotonic())
            await _wait_any((stop, self._lost), 5.0)
            if self._lost.is_set() and not stop.is_set():
                await self._step_down(self._lost_reason or "fenced write refused")
                await wait_for_event(stop, self.retry_s)

    async def release(self) -> None:
        value = self.value
        if value is None:
            return
        self.value = None
        try:
            await self.redis.eval(K.RELEASE, 1, self.keys.leader, value, self.keys.leader_channel)
        except Exception as exc:
            log.warning("static lease release failed", error=str(exc))


async def _wait_any(events: tuple[asyncio.Event, ...], seconds: float) -> None:
    """Sleep up to ``seconds`` or until any of ``events`` is set."""
    if any(e.is_set() for e in events):
        return
    waiters = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=max(0.0, seconds), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
