"""The batched completer: the ends of runs, recorded in one ``FINISH`` per round.

Every run's end (done, failed, retry, defer) waits in :attr:`Completer.ended` until the next
flush sends them all in one script call. With a WAIT policy a batch the replicas did not
confirm (or whose round trip failed) moves to :attr:`Completer.resend` and is sent again, with
the same claim tokens, until one is confirmed: a new primary that lost it still holds our
claims, finishes the jobs, and never hands them to another consumer. While the event loop is
blocked the loop watchdog's thread flushes the ends instead (:meth:`Completer.loop_blocked`).

A flush may be *sent ahead* (:meth:`Completer.send_ahead`): a task started before the round's
``CLAIM``, which runs after the runs started before it and sends their ends while the claim's
round trip is on its way; the ends it carries stay :meth:`known` (:attr:`Completer.sending`)
until its reply, so a lost claim reply's release never gives their jobs back.
"""

from __future__ import annotations

import asyncio
import threading

import structlog

from worker.consumer.claims import Run
from worker.consumer.guard import ClaimGuard
from worker.core.clock import Clock, ms
from worker.core.metrics import Metrics
from worker.storage.jobs import DEFAULT_RETENTION, Finish, Retention
from worker.storage.sharded import Shards

log = structlog.get_logger("worker.consumer")


class Completer:
    """Owns the ends not yet written (:attr:`ended`) and those sent but not confirmed
    (:attr:`resend`); both are guarded by one lock (the watchdog's thread writes them too)."""

    def __init__(
        self,
        store: Shards,
        clock: Clock,
        running: dict[str, Run],
        guard: ClaimGuard,
        totals: dict[str, int],
        *,
        instance_id: str,
        metrics: Metrics | None = None,
        retention: Retention = DEFAULT_RETENTION,
    ) -> None:
        self.store = store
        self.clock = clock
        self.running = running
        self.guard = guard
        self.totals = totals
        self.instance_id = instance_id
        self.metrics = metrics
        self.retention = retention
        self.ended: list[Finish] = []
        #: ends sent without a confirmation (or whose round trip failed): sent again until one is
        self.resend: list[Finish] = []
        #: ends in a FINISH on its way (no reply yet): their claims are still ours
        self.sending: list[Finish] = []
        #: the flush sent ahead (:meth:`send_ahead`), at most one; :meth:`settle` collects it
        self.ahead: asyncio.Task[None] | None = None
        self.first_at = 0.0  # when the oldest end in :attr:`ended` came (monotonic)
        self.resent_ahead = False  # the last flush ahead sent ends again (one try per round)
        self._lock = threading.Lock()

    @property
    def pending(self) -> bool:
        """Ends wait to be written or confirmed."""
        return bool(self.ended or self.resend)

    def known(self) -> set[str]:
        """Job ids whose end waits here or is on its way: their claims are still ours."""
        return {f.job_id for f in (*self.ended, *self.resend, *self.sending)}

    def end(self, finish: Finish) -> None:
        """A run ended: its end goes into the next flush."""
        run = self.running.get(finish.job_id)
        if run is not None:
            run.ended = True
        with self._lock:
            if not self.ended:
                self.first_at = self.clock.monotonic()
            self.ended.append(finish)

    async def flush(self) -> None:
        """Send the ends again that wait for a confirmation, then the new ones."""
        if self.resend:
            resend = list(self.resend)
            sent = self.clock.monotonic()
            again = await self.store.finish(
                self.instance_id,
                resend,
                now_ms=ms(self.clock.time()),
                resend=True,
                retention=self.retention,
            )
            self.guard.confirmed(sent)
            if not again.replicated:
                return  # the replicas still lag: new ends wait behind these
            log.info("job ends confirmed by the replicas", runs=len(resend))
            with self._lock:  # others only append meanwhile
                del self.resend[: len(resend)]
        with self._lock:
            ended, self.ended = self.ended, []
            self.sending = ended
        if not ended:
            return
        sent = self.clock.monotonic()
        try:
            out = await self.store.finish(
                self.instance_id, ended, now_ms=ms(self.clock.time()), retention=self.retention
            )
        except BaseException:
            # It may or may not have been applied (the reply was lost): send the same ends again
            # (the claims still hold) until a round trip is confirmed.
            with self._lock:
                self.resend += ended
                self.sending = []
            raise
        self.guard.confirmed(sent)
        with self._lock:
            self.sending = []
            if not out.replicated:
                self.resend += ended
        if not out.replicated:
            log.warning(
                "job ends not confirmed by the replicas (WORKER_REDIS_WAIT_REPLICAS); sending "
                "them again until they are",
                runs=len(ended),
            )
        if out.refused:
            self.totals["lost"] += out.refused
            if self.metrics is not None:
                self.metrics.claims_lost.inc(out.refused)
            log.warning(
                "job runs ended after their claims were taken over; nothing written",
                refused=out.refused,
            )

    def send_ahead(self, enough: int) -> None:
        """Start a flush as a task (unless one is on its way): it runs after the runs started
        before it and sends the ends once ``enough`` wait, or ends to send again; fewer wait for
        the loop (:meth:`settle`, then :meth:`flush`): one ``FINISH`` per ``enough`` runs."""
        if self.ahead is None:
            self.ahead = asyncio.get_running_loop().create_task(self._ahead(enough))

    async def _ahead(self, enough: int) -> None:
        self.resent_ahead = bool(self.resend)
        if self.resend or len(self.ended) >= enough:
            await self.flush()

    async def settle(self, *, wait: bool) -> None:
        """Collect the flush sent ahead (its failure raised here): awaited if ``wait``, else
        only once it is done."""
        task = self.ahead
        if task is None or not (wait or task.done()):
            return
        self.ahead = None
        await task

    async def flush_quietly(self) -> None:
        """:meth:`flush`, logging a failure (the claims expire and orphan recovery re-queues)."""
        if not self.pending:
            return
        try:
            await self.flush()
        except Exception as exc:
            log.error("could not record job ends", error=f"{type(exc).__name__}: {exc}")

    async def loop_blocked(self, store: Shards, lag_s: float) -> None:
        """Called by the loop watchdog, in its thread (``store`` on its own connection), while
        the event loop is blocked: record the ends of the runs that finished before the block.
        Left for the next round, they would wait for the loop while the leader's orphan reaper,
        seeing no heartbeat, handed those jobs to another consumer: a finished run would run
        again. The claims still hold (the block is shorter than the orphan bound yet), so the
        ``FINISH`` is the one the loop would have sent; one whose reply is lost is sent again."""
        with self._lock:
            ended, self.ended = self.ended, []
        if not ended:
            return
        try:
            out = await store.finish(
                self.instance_id, ended, now_ms=ms(self.clock.time()), retention=self.retention
            )
        except BaseException:
            with self._lock:
                self.resend += ended
            raise
        if not out.replicated:
            with self._lock:
                self.resend += ended
        log.warning(
            "event loop blocked; recorded the ends of finished runs from the watchdog",
            runs=len(ended),
            refused=out.refused,
            lag_s=round(lag_s, 3),
        )
