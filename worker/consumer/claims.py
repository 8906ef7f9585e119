"""The claims a consumer holds: its runs, their fencing tokens, and the checks that keep them.

Each claim carries a token ``<instance id>/<n>``; a run finishes only while its marker still
holds that token. While jobs run (or one waits in doubt) :meth:`Claims.check` confirms the
tokens and reads their abort requests in the same round trip (``job ID --cancel``,
``Client.abort``: a busy consumer that claims nothing still sees them within one check), lets
each hook renew what its running jobs hold, and cancels a run whose claim another consumer
took over or whose abort was asked (:class:`~worker.consumer.guard.ClaimGuard` holds every
step meanwhile). A claim round trip whose reply was lost leaves jobs claimed in our name that
no run of ours knows: :meth:`Claims.release_unknown` gives them back before the next claim.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import structlog

from worker.consumer.guard import ClaimGuard
from worker.core.clock import Clock, ms
from worker.core.jobdefs import JobHook
from worker.storage.sharded import Shards

log = structlog.get_logger("worker.consumer")


@dataclass
class Run:
    """One claimed job while it runs (owned by :class:`Claims`)."""

    job_id: str
    token: str
    task: asyncio.Task[None] | None = None
    #: its abort was requested: it stays so until the run has ended (it ends cancelled)
    aborted: bool = False
    #: its task is inside the job's function (the only place an abort cancels it)
    calling: bool = False
    started: float = field(default=0.0)
    ended: bool = False  # its end is recorded (or queued to be): no claim to check any more
    function: str = ""  # the app's task it runs, once known (counted per task when it ends)
    duty: bool = False  # claimed from a duty lane (it counts against the duty slots first)


class Claims:
    """The runs table and the claim checks; the only writer of :attr:`running`'s entries'
    ``aborted`` and of :attr:`in_doubt`."""

    def __init__(
        self,
        store: Shards,
        clock: Clock,
        hooks: Sequence[JobHook],
        *,
        instance_id: str,
        doubt_s: float,
        queues: tuple[str, ...],
    ) -> None:
        self.store = store
        self.clock = clock
        self.hooks = [h for h in hooks if type(h).renew is not JobHook.renew]  # those renewing
        self.instance_id = instance_id
        self.doubt_s = doubt_s
        self.queues = queues
        self.guard = ClaimGuard(clock, doubt_s)
        self.running: dict[str, Run] = {}
        #: a claim round trip failed: it may have claimed jobs no run of ours knows about
        self.in_doubt = False

    async def check(self, stop: asyncio.Event) -> None:
        """While jobs run (or one waits in doubt): confirm the claims, cancel lost ones."""
        interval = max(0.05, self.doubt_s / 4)
        while not stop.is_set():
            await self.clock.wait((stop, self.guard.wanted), interval)
            if stop.is_set() or not (self.running or self.guard.wanted.is_set()):
                continue
            ids = [job_id for job_id, run in self.running.items() if not run.ended]
            sent = self.clock.monotonic()
            try:
                tokens, aborts = await self.store.claim_check(ids)
                for hook in self.hooks:  # e.g. keep the concurrency slots of running jobs
                    await hook.renew()
            except Exception as exc:
                log.warning("claim check failed", error=f"{type(exc).__name__}: {exc}")
                await self.clock.wait(stop, interval)
                continue
            lost = {
                job_id
                for job_id, token in zip(ids, tokens, strict=True)
                if job_id in self.running
                and not self.running[job_id].ended  # ended meanwhile: FINISH may have run
                and token != self.running[job_id].token
            }
            self.guard.checked(sent, lost)
            self._abort(aborts)  # `job ID --cancel`, Client.abort: within one check interval
            for job_id in lost:
                run = self.running.get(job_id)
                if run is not None and run.task is not None:
                    log.warning(
                        "job claim taken over by another consumer; cancelling", job_id=job_id
                    )
                    run.task.cancel()

    async def release_unknown(self, known: Iterable[str]) -> None:
        """Make the jobs held in our name that we do not know about due again (a claim whose
        reply was lost); the runs we know (running, held, ending: ``known`` besides the
        running ones) keep their claims."""
        keep = {*self.running, *known}
        released, complete = await self.store.release_own(
            self.instance_id, sorted(keep), ms(self.clock.time()), self.queues
        )
        # a shard out of reach (failing over) may hold the lost claim: ask again next round
        self.in_doubt = not complete
        if released:
            log.warning(
                "gave back jobs claimed in a round trip whose reply was lost; they run again",
                jobs=released,
            )

    async def abort_requested(self) -> None:
        """Cancel the runs of ours whose abort was requested (``Client.abort``)."""
        self._abort(await self.store.abort_requests(list(self.running)))

    def _abort(self, job_ids: Sequence[str]) -> None:
        """An abort stays in force until the run has ended: the request stays in Redis until
        the run's ``FINISH`` (which removes it with the end), a run marked aborted never starts
        its function and never ends as a success, and a run whose task caught the
        ``CancelledError`` and went on is cancelled again at every check until it ends."""
        for job_id in job_ids:
            run = self.running.get(job_id)
            if run is None or run.ended:
                continue
            if not run.aborted:
                run.aborted = True
                log.info("abort requested; cancelling the run", job_id=job_id)
            if run.calling and run.task is not None:
                run.task.cancel()  # only inside the function: the bookkeeping is never cut
