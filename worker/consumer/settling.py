"""Ends held back while hooks settle them (:meth:`worker.core.jobdefs.JobHook.settle`): a
workflow step's end goes to the completer only once its hook recorded it, so a consumer that
dies in between runs the step again rather than losing the fan-in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from worker.consumer.claims import Run
from worker.core.clock import Clock, ms
from worker.core.jobdefs import HookPlan, JobRun
from worker.storage.claims import Claimed
from worker.storage.jobs import Finish

#: How soon a run whose end a hook could not settle runs again.
SETTLE_RETRY_MS = 1000


class Held:
    """Per job id, the ends of a run whose hooks settle it first; other ends go straight on."""

    def __init__(self, end: Callable[[Finish], None], clock: Clock) -> None:
        self._end = end
        self._clock = clock
        self._held: dict[str, list[Finish]] = {}

    async def started(self, plan: HookPlan, hooked: JobRun) -> bool:
        """The run starts, unless a hook vetoed it (it ends cancelled, as an abort); its ends
        are held while its hooks settle them."""
        if plan.settles:
            self._held[hooked.job_id] = []
        return await plan.started(hooked)

    def end(self, finish: Finish) -> None:
        held = self._held.get(finish.job_id)
        (self._end if held is None else held.append)(finish)

    def drop(self, job_id: str) -> None:
        self._held.pop(job_id, None)

    async def settle(self, c: Claimed, run: Run, plan: HookPlan, *end: Any) -> None:
        """The run's ends to the completer once the hooks settled it; unsettled: a retry."""
        held = self._held.pop(c.job_id, [])
        again = ms(self._clock.time()) + SETTLE_RETRY_MS
        retry = Finish("retry", c.job_id, run.token, score_ms=again, queue=c.queue)
        for finish in held if await plan.settle(*end) else [retry]:
            self._end(finish)
