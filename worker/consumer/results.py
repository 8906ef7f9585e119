"""The result record of one run (:func:`worker.core.codec.encode_result`: what ``Job.result_info()``
reads, ours or arq's), as the executor writes it with the run's end."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.core import codec
from worker.core.clock import ms
from worker.core.jobdefs import JobDef
from worker.core.retry import retry_defer_ms
from worker.core.serializer import Serialize
from worker.storage import Claimed


def retry_score(exc: BaseException, job: JobDef, job_try: int, now_ms: int, c: Claimed) -> int:
    """When a run that raised ``Retry`` (or ``RetryJob``, ours or arq's) runs again: after
    the delay it asked for, else the task's ``retry_delay``, else at its original score."""
    defer_ms = retry_defer_ms(exc)
    if defer_ms is None and job.retry_delay is not None:
        defer_ms = ms(job.retry_delay(job_try))
    return now_ms + defer_ms if defer_ms else c.score_ms


class JobFailed(Exception):
    """Stands in arq's result record for a job that never ran (arq's ``JobExecutionFailed``)."""


@dataclass(slots=True)  # one per run: not frozen, whose __init__ costs 3x
class ResultFor:
    """Builds arq's result record for one run."""

    function: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    job_try: int
    enqueued_ms: int
    job_id: str
    queue: str

    def __call__(
        self, success: bool, result: Any, start_ms: int, finish_ms: int, serialize: Serialize
    ) -> bytes | None:
        return codec.encode_result(
            self.function,
            self.args,
            self.kwargs,
            self.job_try,
            self.enqueued_ms,
            success,
            result,
            start_ms,
            finish_ms,
            f"{self.job_id}:{self.function}",
            self.queue,
            job_id=self.job_id,
            serializer=serialize,
        )
