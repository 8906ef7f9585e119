"""A Django ``TaskResult`` read from the framework's records of a job: the result record once
it ended, else the job record and whether a consumer holds it.

- queued or due later: ``READY``;
- claimed by a consumer: ``RUNNING``;
- ended, success: ``SUCCESSFUL``, ``return_value`` the task's (as JSON);
- ended, failed (raised, timed out, aborted, dead-lettered): ``FAILED``, ``errors`` from its
  failure record;
- unknown, expired (``keep_result_s``) or not a Django task's job: ``TaskResultDoesNotExist``.

``attempts`` (``worker_ids``) is the job's try; the failure's ``exception_class_path`` is the
qualified name its traceback ends with (:func:`exception_path`).
"""

from __future__ import annotations

import builtins
from typing import Any

from worker.client import Client
from worker.contrib.django import api
from worker.contrib.django.runner import RUNNER, task_of
from worker.core.codec import JobInfo, JobResult, JobStatus
from worker.core.errors import InvalidId

__all__ = ["exception_path", "read_result"]

#: what ``worker_ids`` holds per try: the result records name no instance
WORKER_ID = "worker"

_Read = tuple[JobInfo | None, bool, dict[str, Any] | None]


async def _read(client: Client, job_id: str) -> _Read:
    """The job's record (its result's once it ended), whether a consumer holds it, and its
    failure record when it failed."""
    job = client.job(job_id)
    info = await job.info()  # the result record, else the job record: two reads
    running = False
    if not isinstance(info, JobResult):
        running = info is not None and await job.status() == JobStatus.in_progress
        if not running:
            # a job that ended between the reads: its result is written as its record goes
            info = await job.result_info() or info
    if isinstance(info, JobResult):
        return info, False, None if info.success else await client.failure(job_id)
    return info, running, None


def read_result(backend: Any, job_id: str) -> Any:
    """``backend.get_result(job_id)`` (module docstring)."""
    try:
        info, running, failure = backend.client.run(lambda c: _read(c, job_id))
    except InvalidId:
        info, running, failure = None, False, None
    if info is None or info.function != RUNNER or len(info.args) != 3:
        raise api.TaskResultDoesNotExist(job_id)
    spec, args, kwargs = info.args
    tries = max(0, int(info.job_try or 0))
    S = api.TaskResultStatus
    status = S.RUNNING if running else S.READY
    if isinstance(info, JobResult):
        status = S.SUCCESSFUL if info.success else S.FAILED
    ended = isinstance(info, JobResult)
    result = api.TaskResult(
        task=task_of(spec),
        id=job_id,
        status=status,
        enqueued_at=info.enqueue_time,
        started_at=info.start_time if ended else None,
        finished_at=info.finish_time if ended else None,
        last_attempted_at=info.start_time if ended else None,
        args=args,
        kwargs=kwargs,
        backend=backend.alias,
        errors=[] if status != S.FAILED else [_error(info, failure)],
        worker_ids=[WORKER_ID] * (max(1, tries) if running or ended else tries),
    )
    if status == S.SUCCESSFUL:
        object.__setattr__(result, "_return_value", info.result)
    return result


def _error(info: Any, failure: dict[str, Any] | None) -> Any:
    failure = failure or {}
    error_type = str(failure.get("error_type") or type(info.result).__name__)
    # a run ended from outside (timed out, aborted, dead-lettered) has no traceback: its text
    tb = str(failure.get("traceback") or f"{error_type}: {failure.get('message') or info.result}")
    return api.TaskError(exception_class_path=exception_path(tb, error_type), traceback=tb)


#: error types of runs ended from outside whose class is not a builtin
_OUTSIDE = {"CancelledError": "asyncio.CancelledError"}


def exception_path(tb: str, error_type: str) -> str:
    """The qualified class name a traceback's last line starts with (``module.Class: …``) when
    it is ``error_type``'s; else a builtin's (``builtins.LookupError``), ``asyncio``'s
    ``CancelledError`` (an aborted run), or ``builtins.Exception`` for a type that names no
    class (a dead-lettered job's ``BadJob``: its traceback says what happened)."""
    lines = [line for line in tb.splitlines() if line.strip()]
    name = lines[-1].split(":", 1)[0].strip() if lines else ""
    if name.rpartition(".")[2] == error_type and "." in name:
        return name
    if error_type in _OUTSIDE:
        return _OUTSIDE[error_type]
    found = getattr(builtins, error_type, None)
    if isinstance(found, type) and issubclass(found, BaseException):
        return f"builtins.{error_type}"
    return "builtins.Exception"
