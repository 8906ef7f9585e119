"""The election: a fenced Redis lease that :class:`LeaderElector` campaigns for and renews.

Protocol (docs/architecture.md, "The lease"): the lock value is ``<epoch>:<token>``; acquiring
is one script that INCRs the epoch; renewing compares the whole value and *replaces* the TTL;
releasing compares, deletes and publishes so standbys campaign at once. The leader steps down
when

- the renew deadline passes, measured on the monotonic clock from when the last *successful*
  renew was sent (so a renew that lands late cannot stretch the lease in our mind),
- a renew answers "not yours" (a message on a channel is only a hint to renew at once: see
  :meth:`LeaderElector._listen`), or
- any fenced write is refused (:meth:`Leadership.lost`, called by the fenced store), or
- the event loop stays blocked past the renew deadline (:mod:`worker.runtime.watchdog`): from its
  thread, the watchdog drops the lock (not a clean release: the next holder's services still
  wait out this holder's safety bound), so a standby takes over before the lease expires, and
  the elector steps down as soon as the loop runs again, or
- an operator requests a planned handoff (``python -m worker handoff``, the console: a write
  of the handoff key, which the app's ACL protects, read by the renew): the leader stops its
  singletons, releases the lease (standbys campaign at once) and stays a standby for
  ``handoff_pause_s`` so another candidate takes over.

Campaigns back off: a leadership that ends within a lease TTL of its start makes the next
campaign wait (``0.5 s`` doubling up to the TTL), so no record in Redis, no message and no
setting can make leadership change hands more than a few times a second.

With a WAIT policy (``WORKER_REDIS_WAIT_REPLICAS``) an acquisition or a renew counts only once
the replicas confirmed it: a lease the primary granted but no replica has is never acted on,
and an unconfirmed renew is a failed renew (the deadline keeps running from the last confirmed
one). So the lease, its epoch and ``renewed_ms`` a new primary inherits are never older than
what the holder believes, and the safety gap of the next acquisition still covers it.

What runs while leading is not the elector's: its listeners
(:class:`~worker.leadership.maintainer.LeaderWork`) start and stop it. Leading again needs a
fresh acquisition and therefore a new epoch.
"""

from __future__ import annotations

import asyncio
import random
from uuid import uuid4

import structlog

from worker.core import malformed as M
from worker.core.clock import Clock, ms
from worker.core.ids import LockValue
from worker.core.metrics import Metrics
from worker.leadership.base import Leadership, LeaderTiming
from worker.storage import Acquired, Refused, Renewal, Store

log = structlog.get_logger("worker.leader")

#: A quiet subscription to the lease's channels is pinged this often, so a dead one is noticed.
PING_S = 55.0
#: A message on a lease channel makes the leader renew at once (the renew reads the lock and
#: the handoff request), but not more often than this, seconds: a flood of messages costs at
#: most this many renews a second.
LOOK_MIN_S = 0.2
#: The first pause after a leadership that ended within a lease TTL of its start, seconds;
#: doubled at each further short one, up to the lease TTL (:meth:`LeaderElector._backoff`).
FLAP_PAUSE_S = 0.5


class LeaderElector(Leadership):
    """Campaigns for, renews and releases the Redis lease.

    ``store`` should sit on a client *without* automatic retries and with short socket
    timeouts: a retried renew could land after the deadline we already trusted.
    ``stop_grace_s`` is how long the leader-only work may take to stop (it sizes the safety
    bound the next holder waits out).
    """

    def __init__(
        self,
        store: Store,
        timing: LeaderTiming,
        clock: Clock,
        *,
        stop_grace_s: float = 5.0,
        metrics: Metrics | None = None,
        instance: str = "",
        handoff_pause_s: float | None = None,
    ) -> None:
        # a subscribed standby campaigns about once per lease TTL (the lock's PTTL)
        super().__init__(
            clock, metrics=metrics, sla_s=max(timing.ttl_s * 2, timing.poll_interval_s * 5)
        )
        self.store = store
        self.timing = timing
        self.token = uuid4().hex
        #: this process's name in the leadership history
        self.instance = instance
        #: after handing the lease over, campaign again only after this long (default: the
        #: lease TTL), so a standby takes over; with none, this process leads again then
        self.handoff_pause_s = timing.ttl_s if handoff_pause_s is None else handoff_pause_s
        #: a message on a lease channel: renew now (a hint; the renew finds the facts)
        self._look = asyncio.Event()
        self._looked_at = float("-inf")
        self._quiet_until = float("-inf")
        #: short leaderships in a row (ended within a lease TTL): the next campaign waits
        self._flaps = 0
        #: since when (monotonic) this candidate has seen no valid leader, ``None``: it has
        self._leaderless_since: float | None = None
        self._leaderless_told = False
        self._last_renew_sent: float | None = None
        #: Renew deadline + stop grace: how long a holder may believe it leads, and keep its
        #: singletons running, after its last successful renew.
        self.safety_bound_s = timing.renew_deadline_s + stop_grace_s
        self._loop: asyncio.AbstractEventLoop | None = None
        #: the lease the loop watchdog gave up while the event loop was blocked
        self._blocked: LockValue | None = None
        #: the release channel is subscribed: a standby may wait out the holder's PTTL
        self.subscribed = False
        #: the refused campaign's answer: the holder's lock expires in this long, seconds
        self._holder_ttl_s: float | None = None
        #: the last campaign was refused cleanly: the next may peek (``ElectionOps.acquire``);
        #: after an error or an unconfirmed lease (the lock may hold our token) it reads all
        self._may_peek = False

    def _fresh(self) -> bool:
        sent = self._last_renew_sent
        return sent is not None and self.clock.monotonic() - sent < self.timing.renew_deadline_s

    async def run(self, stop: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        listener = asyncio.create_task(self._listen(wake, stop), name="leader:listen")
        try:
            while not stop.is_set():
                if self._lock is None:
                    pause = self._quiet_until - self.clock.monotonic()
                    if pause > 0:  # just handed the lease over: let a standby take it
                        self.health.ok(self.clock.monotonic())
                        await self.clock.wait(stop, min(pause, 1.0))
                        continue
                    wake.clear()  # a release from now on wakes the next campaign
                    await self._campaign()
                    self.health.ok(self.clock.monotonic())
                    if self._lock is None:
                        await self.clock.wait((stop, wake), self._campaign_delay())
                else:
                    started = self.clock.monotonic()
                    await self._lead(stop)
                    if stop.is_set():
                        break
                    if self.clock.monotonic() - started < self.timing.ttl_s:
                        self._flaps = min(self._flaps + 1, 16)
                        pause = self._backoff()
                        log.info("campaigning again after a short leadership", wait_s=pause)
                        self._quiet_until = max(self._quiet_until, self.clock.monotonic() + pause)
                    else:
                        self._flaps = 0
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)

    def _campaign_delay(self) -> float:
        """Until the next campaign. Subscribed to the release channel, a standby waits out the
        holder's lock (its PTTL, from the refused campaign: one script call per lease TTL
        while the holder renews; a release wakes it at once); otherwise, or when the answer
        gave no PTTL, it polls every ``poll_interval_s`` (±25 %)."""
        t, ttl = self.timing, self._holder_ttl_s
        if not self.subscribed or ttl is None:
            return t.poll_interval_s * random.uniform(0.75, 1.25)
        # 10 ms after it expires (the PTTL was read before the reply left), jittered by up to
        # a quarter poll so standbys do not all campaign in the same millisecond
        return min(ttl, t.ttl_s) + 0.01 + t.poll_interval_s * random.uniform(0.0, 0.25)

    async def _campaign(self) -> None:
        self._holder_ttl_s = None
        # subscribed, the announcements tell every new epoch: a steady look needs the PTTL only
        peek, self._may_peek = self._may_peek and self.subscribed, False
        sent = self.clock.monotonic()
        try:
            won = await self.clock.wait_for(
                self.store.acquire(
                    self.token,
                    ms(self.timing.ttl_s),
                    floor=self.floor,
                    bound_ms=ms(self.safety_bound_s),
                    instance=self.instance,
                    peek=peek,
                ),
                self.timing.renew_deadline_s,
            )
        except Exception as exc:  # connection trouble: stay a standby, try again later
            log.warning("leader campaign failed", error=f"{type(exc).__name__}: {exc}")
            self._leaderless(f"{type(exc).__name__}: {exc}")
            return
        known = won.holder.epoch if isinstance(won, Refused) and won.holder else 0
        if isinstance(won, Acquired):
            known = won.lock.epoch
        for what in won.malformed:  # logged once per value, counted; the lease goes on
            if what == "floor":
                M.skip("epoch floor", "(this process)", self.floor, "far ahead of the clock")
                self.floor_refused(known)
            else:
                M.skip("epoch counter", self.store.keys.leader_epoch, known, "repaired")
        if isinstance(won, Refused):
            if won.holder is not None or (won.pttl_ms is not None and won.pttl_ms > 0):
                self._leaderless(None)  # a lock with a TTL is there: someone leads
            else:
                self._leaderless("the lock is not one the framework writes")
            if won.holder is not None:
                self.note_epoch(won.holder.epoch)
            if won.pttl_ms is not None and won.pttl_ms >= 0:
                self._holder_ttl_s = won.pttl_ms / 1000
            self._may_peek = True
            return
        if not won.replicated:
            # Taken on the primary, but no replica confirmed it: a failover now could lose the
            # lease and its epoch, and another process would lead beside us. Do not act on it;
            # the next campaign takes it again (it holds our token) with a newer epoch.
            self.note_epoch(won.lock.epoch)
            log.warning(
                "lease acquired but not confirmed by the replicas (WORKER_REDIS_WAIT_REPLICAS); "
                "not leading on it",
                epoch=won.lock.epoch,
            )
            return
        if won.replaced:
            log.error(
                "found a leader lock without expiry (left by an old static leader?); replaced it",
                replaced=won.replaced,
            )
        self._last_renew_sent = sent
        self._look.clear()
        self._leaderless(None)
        self._elected(won.lock, won.gap_ms / 1000)

    def _leaderless(self, why: str | None) -> None:
        """Track how long this candidate has found no valid leader (``why``: the campaign's
        failure; ``None``: a leader is there). Past the lease TTL: logged once, and the
        ``worker_leaderless_seconds`` gauge tells it."""
        now = self.clock.monotonic()
        if why is None:
            self._leaderless_since, self._leaderless_told = None, False
            if self.metrics is not None:
                self.metrics.leaderless.set(0)
            return
        if self._leaderless_since is None:
            self._leaderless_since = now
        for_s = now - self._leaderless_since
        if self.metrics is not None:
            self.metrics.leaderless.set(round(for_s, 3))
        if for_s > self.timing.ttl_s and not self._leaderless_told:
            self._leaderless_told = True
            log.error(
                "no leader for longer than the lease TTL while this candidate campaigns",
                for_s=round(for_s, 1),
                error=why,
            )

    def _backoff(self) -> float:
        """After a leadership that ended within a lease TTL of its start: how long to wait
        before campaigning again (0 after a longer one)."""
        if not self._flaps:
            return 0.0
        return min(self.timing.ttl_s, FLAP_PAUSE_S * float(2 ** (self._flaps - 1)))

    async def _lead(self, stop: asyncio.Event) -> None:
        """Renew until stopped, lost, or past the deadline."""
        t = self.timing
        while self._lock is not None and not stop.is_set():
            await self.clock.wait(
                (stop, self._lost, self._look), t.renew_interval_s * random.uniform(0.8, 1.0)
            )
            if stop.is_set():
                return  # shutdown releases after stopping the singletons
            if self._lost.is_set():
                await self._step_down(self._lost_reason or "fenced write refused")
                return
            assert self._last_renew_sent is not None
            if self._look.is_set():  # a hint: renew now (not more often than LOOK_MIN_S)
                self._look.clear()
                since = self.clock.monotonic() - self._looked_at
                if since < LOOK_MIN_S and await self.clock.wait(
                    (stop, self._lost), LOOK_MIN_S - since
                ):
                    continue
                self._looked_at = self.clock.monotonic()
            sent = self.clock.monotonic()
            remaining = t.renew_deadline_s - (sent - self._last_renew_sent)
            if remaining <= 0:
                await self._step_down("renew deadline passed")
                return
            try:
                ok = await self.clock.wait_for(
                    self.store.renew_lock(self._lock, ms(t.ttl_s)), remaining
                )
            except Exception as exc:
                log.warning("lease renew failed", error=f"{type(exc).__name__}: {exc}")
                if self.clock.monotonic() - self._last_renew_sent >= t.renew_deadline_s:
                    await self._step_down("renew deadline passed")
                    return
                continue
            if not ok:
                await self._step_down("lease is no longer ours")
                return
            self._last_renew_sent = sent
            self.health.ok(self.clock.monotonic())
            if ok == Renewal.HANDOFF:
                await self._hand_over()
                return

    async def _hand_over(self) -> None:
        """A planned handoff: stop the singletons, release the lease (clean: the next holder
        need not wait, see ``election.ACQUIRE``) and stay a standby for ``handoff_pause_s``."""
        lock = await self._step_down("handoff requested", planned=True)
        if lock is None:
            return
        self._quiet_until = self.clock.monotonic() + self.handoff_pause_s
        if self.metrics is not None:
            self.metrics.leader_transitions.labels("handoff").inc()
        try:
            released = await self.clock.wait_for(
                self.store.release_lock(lock, reason="handoff", instance=self.instance), 2.0
            )
            log.info("leadership handed over", epoch=lock.epoch, released=released)
        except Exception as exc:
            log.warning("lease release failed; it expires by itself", error=str(exc))

    async def loop_blocked(self, store: Store, lag_s: float) -> None:
        """Called by the loop watchdog, in its thread (``store`` on its own connection), at
        every beat the event loop misses: once the renew deadline has passed (``is_leading()``
        is false; the loop would step down as soon as it runs), drop the lock if it is still
        ours, so a standby takes over before the lease expires instead of after. A shorter
        block keeps the lease, as it always did. Not a clean release: the lease state keeps
        this holder's last renew, so the next holder's singleton services wait until this
        process has certainly stopped its own (``election.ACQUIRE``'s gap) — they are frozen in the
        blocked loop, not stopped."""
        lock, loop = self._lock, self._loop
        if lock is None or lock == self._blocked or self._fresh():
            return
        self._blocked = lock
        if loop is not None:
            loop.call_soon_threadsafe(self.lost, f"event loop blocked ({lag_s:.1f} s)")
        dropped = await store.drop_lock(lock)
        log.warning(
            "event loop blocked past the renew deadline; dropped the lease",
            epoch=lock.epoch,
            dropped=dropped,
            lag_s=round(lag_s, 3),
        )

    async def _listen(self, wake: asyncio.Event, stop: asyncio.Event) -> None:
        """Pub/sub, hints only (anyone who can ``PUBLISH`` can send one): a release wakes the
        campaign loop; an announcement other than this leader's lock, or a handoff request,
        makes it renew at once, and only what the renew reads (its lock, the handoff key the
        app's ACL protects) steps it down or hands over; a standby that hears an announcement
        reads the holder's lock (and raises its floor) at its next campaign. Lost messages
        only cost time: polling and renewing find the same facts."""
        keys = self.store.keys
        announce, handoff = keys.leader_announce, keys.leader_handoff_channel

        def heard(channel: str, data: bytes) -> None:
            if channel == announce:
                if LockValue.parse(data) is None:
                    M.skip("leader announcement", announce, data[:64], "not <epoch>:<token>")
                lock = self._lock
                if lock is None:
                    self._may_peek = False
                elif data != str(lock).encode():
                    self._look.set()
                return
            if channel == handoff:
                if self._lock is not None:
                    self._look.set()
                return
            wake.set()

        def healthy(subscribed: bool) -> None:
            self.subscribed = subscribed
            wake.set()  # broken: poll from now; back: a release may have gone unheard

        await self.store.listen(
            [keys.leader_channel, announce, handoff],
            heard,
            stop,
            clock=self.clock,
            # shorter than the lease connection's socket timeout (deadline / 2)
            poll_s=min(1.0, self.timing.renew_deadline_s / 4),
            retry_s=self.timing.poll_interval_s,
            ping_s=PING_S,
            healthy=healthy,
        )

    async def release(self) -> None:
        lock = self._forget()
        if lock is None:
            return
        try:
            released = await self.clock.wait_for(
                self.store.release_lock(lock, instance=self.instance), 2.0
            )
            log.info("leadership released", released=released)
        except Exception as exc:
            log.warning("lease release failed; it expires by itself", error=str(exc))
