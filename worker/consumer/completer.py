"""The batched completer: the ends of runs, recorded in one ``FINISH`` per round.

Every run's end (done, failed, retry, defer) waits in :attr:`Completer.ended` until the next
flush sends them all in one script call. With a WAIT policy a batch the replicas did not
confirm (or whose round trip failed) moves to :attr:`Completer.resend` and is sent again, with
the same claim tokens, until one is confirmed: a new primary that lost it still holds our
claims, finishes the jobs, and never hands them to another consumer. While the event loop is
blocked the loop watchdog's thread flushes the ends instead (:meth:`Completer.loop_blocked`).
"""

from __future__ import annotations

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
        #: ends on their way (a ``FINISH`` in flight): their claims are still ours
        self.sending: list[Finish] = []
        self._lock = threading.Lock()

    @property
    def pending(self) -> bool:
        """Ends wait to be written or confirmed."""
        return bool(self.ended or self.resend)

    def known(self) -> set[str]:
        """Job ids whose end waits here: their claims are still ours."""
        return {f.job_id for f in (*self.ended, *self.resend, *self.sending)}

    def end(self, finish: Finish) -> None:
        """A run ended: its end goes into the next flush."""
        run = self.running.get(finish.job_id)
        if run is not None:
            run.ended = True
        with self._lock:
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
        if not ended:
            return
        sent = self.clock.monotonic()
        self.sending = ended
        try:
            out = await self.store.finish(
                self.instance_id, ended, now_ms=ms(self.clock.time()), retention=self.retention
            )
        except BaseException:
            # It may or may not have been applied (the reply was lost): send the same ends again
            # (the claims still hold) until a round trip is confirmed.
            with self._lock:
                self.resend += ended
            raise
        finally:
            self.sending = []
        self.guard.confirmed(sent)
        if not out.replicated:
            with self._lock:
                self.resend += ended
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
