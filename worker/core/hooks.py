"""The user's job hooks (``@app.on_job_start``, ``@app.on_job_end``) as one consumer hook.

A hook that raises is logged with its traceback and the job goes on as if it had not run; a
hook that hangs is cancelled after ``WORKER_JOB_HOOK_TIMEOUT_S`` and logged. End hooks run
once the run's end is handed to the completer, so neither can fail, retry or delay a job.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import structlog

from worker.core.jobdefs import JobHook, JobOutcome, JobRun

log = structlog.get_logger("worker.hooks")

StartHook = Callable[[Any], Awaitable[None]]
EndHook = Callable[[Any, JobOutcome], Awaitable[None]]


class UserHooks(JobHook):
    """Runs the app's start hooks before each job and its end hooks after it, each in the
    order registered, each bounded by ``timeout_s``."""

    def __init__(
        self, on_start: Sequence[StartHook], on_end: Sequence[EndHook], *, timeout_s: float
    ) -> None:
        self.on_start = list(on_start)
        self.on_end = list(on_end)
        self.timeout_s = timeout_s

    async def started(self, run: JobRun) -> None:
        for fn in self.on_start:
            await self._call(fn, run, (run.ctx,), "on_job_start")

    async def finished(self, run: JobRun, outcome: JobOutcome) -> None:
        for fn in self.on_end:
            await self._call(fn, run, (run.ctx, outcome), "on_job_end")

    async def _call(
        self, fn: Callable[..., Awaitable[None]], run: JobRun, args: tuple[Any, ...], kind: str
    ) -> None:
        name = getattr(fn, "__qualname__", repr(fn))
        bound = asyncio.timeout(self.timeout_s)
        try:
            async with bound:
                await fn(*args)
        except Exception:
            if bound.expired():
                log.error(
                    "job hook timed out",
                    hook=name,
                    kind=kind,
                    job_id=run.job_id,
                    task=run.job.name,
                    timeout_s=self.timeout_s,
                )
            else:
                log.exception(
                    "job hook failed", hook=name, kind=kind, job_id=run.job_id, task=run.job.name
                )
