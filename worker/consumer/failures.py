"""A failed run's record: the text of its error and traceback (masked, capped: 16 KiB stored,
8 KiB in a log line; :func:`worker.core.logs.error_text` and
:func:`worker.core.logs.traceback_text`,
which a trace span's error uses too) and the JSON FINISH keeps at ``<prefix>failure:<id>``
(``Keys.failure``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from worker.consumer.results import ResultFor
from worker.core.logs import TRACEBACK_BYTES as TRACEBACK_BYTES
from worker.core.logs import capped, head_tail, mask_text
from worker.core.logs import error_text as error_text
from worker.core.logs import traceback_text as traceback_text
from worker.storage.claims import Claimed

log = structlog.get_logger("worker.consumer")

#: Longest traceback in a log line (UTF-8 bytes, head and tail): a line stays under 16 KiB
#: with the capped error text beside it.
LOG_TRACEBACK_BYTES = 8 * 1024
#: Longest ``repr`` of a job's arguments kept in its failure record.
ARGS_CHARS = 1024

Status = Literal["failed", "timeout", "cancelled", "dead", "expired"]


def log_traceback(tb: str) -> str:
    """A stored traceback (:func:`traceback_text`) cut again for a log line."""
    return head_tail(tb, LOG_TRACEBACK_BYTES)


@dataclass(frozen=True)
class RunFacts:
    """What the executor knows of one run when it ends."""

    job_id: str
    task: str | None
    queue: str
    job_try: int | None
    instance: str
    instance_name: str
    enqueued_ms: int | None
    started_ms: int
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] | None = None

    @classmethod
    def of(
        cls, c: Claimed, rf: ResultFor | None, started_ms: int, instance: str, name: str
    ) -> RunFacts:
        """The facts of claimed job ``c`` (``rf``: its decoded record, if it could be)."""
        return cls(
            job_id=c.job_id,
            task=rf.function if rf else None,
            queue=c.queue,
            job_try=rf.job_try if rf else (c.try_ if c.try_ >= 0 else None),
            instance=instance,
            instance_name=name,
            enqueued_ms=rf.enqueued_ms if rf else None,
            started_ms=started_ms,
            args=rf.args if rf else (),
            kwargs=rf.kwargs if rf else None,
        )

    @property
    def fields(self) -> dict[str, Any]:
        """The fields every failure log line carries."""
        return {"job_id": self.job_id, "task": self.task, "try": self.job_try, "queue": self.queue}


def failure_record(
    run: RunFacts,
    status: Status,
    finished_ms: int,
    *,
    exc: BaseException | None = None,
    error_type: str | None = None,
    message: str | None = None,
    tb: str | None = None,
) -> bytes:
    """The JSON of a final failure: the error from ``exc`` (type, message, traceback) unless
    given as ``error_type`` / ``message`` / ``tb``."""
    if exc is not None:
        error_type = error_type or type(exc).__name__
        message = message if message is not None else error_text(exc)
        tb = tb if tb is not None else traceback_text(exc)
    record = {
        "job_id": run.job_id,
        "task": run.task,
        "queue": run.queue,
        "status": status,
        "error_type": error_type,
        "message": mask_text(message or ""),
        "traceback": tb or "",
        "try": run.job_try,
        "instance": run.instance,
        "instance_name": run.instance_name,
        "enqueued_ms": run.enqueued_ms,
        "started_ms": run.started_ms,
        "finished_ms": finished_ms,
        "args": args_text(run.args, run.kwargs or {}),
    }
    return json.dumps(record).encode()


def args_text(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """``repr`` of a job's arguments, masked, at most :data:`ARGS_CHARS` characters."""
    try:
        parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
        text = mask_text(", ".join(parts))
    except Exception as exc:  # a repr that raises
        text = f"<args not printable: {type(exc).__name__}>"
    return text if len(text) <= ARGS_CHARS else text[: ARGS_CHARS - 1] + "…"


def cancelled_record(run: RunFacts, finished_ms: int) -> bytes:
    """An aborted run's record (logged at WARNING)."""
    log.warning("job cancelled", **run.fields, status="cancelled")
    return failure_record(
        run, "cancelled", finished_ms, error_type="CancelledError", message="aborted", tb=""
    )


def dead_record(run: RunFacts, finished_ms: int, reason: str, exc: BaseException | None) -> bytes:
    """A dead-lettered job's record: the error of its last try (``exc``, logged at ERROR with
    its traceback) if it ran out of tries, else ``reason`` (it never ran: ``DeadLetters``
    logged why)."""
    if exc is None:
        return failure_record(run, "dead", finished_ms, error_type="BadJob", message=reason)
    log.error(
        "job failed; no tries left, dead-lettered", **run.fields, status="dead",
        error=capped(reason), exception=log_traceback(traceback_text(exc)),
    )  # fmt: skip
    return failure_record(run, "dead", finished_ms, exc=exc)
