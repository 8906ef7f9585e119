"""arq's wire format, read and written here only: the job record, the result record, the
per-job key names and the expiry a queued job gets.

The records are maps serialized by the app's serializer (``WORKER_SERIALIZER``)::

    job     {"t": try or None, "f": function, "a": [args], "k": {kwargs}, "et": enqueued ms}
            and, only when set, the framework's own: "fk": flow key, "xa": deadline ms,
            "cg": the start gate of a coalescing mode (arq ignores them)
    result  the job's fields, and "s": success, "r": result or error, "st": started ms,
            "ft": finished ms, "q": queue, "id": job id

Per-job keys: ``arq:job:<id>`` (the record; it expires :data:`EXPIRES_EXTRA_MS` after the job
is due), ``arq:in-progress:<id>`` (claimed), ``arq:retry:<id>`` (tries counter) and
``arq:result:<id>`` (the result record). Queues are sorted sets of job ids scored by due time
in milliseconds. arq's own ``Worker`` and ``ArqRedis.enqueue_job`` read and write the same
bytes, so either side can enqueue and either side can run (tests/face/test_contract_arq.py).

No other module names a record's fields (tests/house/test_layering.py): they use the constants and
functions below. No Redis I/O and no settings here.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple

__all__ = [
    "ABORT_JOBS_SS",
    "ARQ_DEFAULT_QUEUE",
    "EXPIRES_EXTRA_MS",
    "IN_PROGRESS_KEY_PREFIX",
    "JOB_KEY_PREFIX",
    "RESULT_KEY_PREFIX",
    "RETRY_KEY_PREFIX",
    "DeserializationError",
    "JobFlow",
    "JobInfo",
    "JobResult",
    "JobStatus",
    "SerializationError",
    "decode_job",
    "decode_result",
    "encode_job",
    "encode_result",
    "job_flow",
    "job_record",
    "ms_to_datetime",
]

log = logging.getLogger(__name__)

#: Per-job key prefixes and the abort set, fixed by arq (not under the app's key prefix).
JOB_KEY_PREFIX = "arq:job:"
IN_PROGRESS_KEY_PREFIX = "arq:in-progress:"
RESULT_KEY_PREFIX = "arq:result:"
RETRY_KEY_PREFIX = "arq:retry:"
ABORT_JOBS_SS = "arq:abort"
#: arq's default queue (an arq settings class without ``queue_name``).
ARQ_DEFAULT_QUEUE = "arq:queue"
#: A queued job's record expires this long (ms) after it is due: one day, as arq's.
EXPIRES_EXTRA_MS = 86_400_000

# -- field names: the job record, then what the result record adds ----------------------------
TRY = "t"
FUNCTION = "f"
ARGS = "a"
KWARGS = "k"
ENQUEUED = "et"
SUCCESS = "s"
RESULT = "r"
STARTED = "st"
FINISHED = "ft"
QUEUE = "q"
JOB_ID = "id"
# -- the framework's own job fields (arq ignores unknown fields; absent when unset, so a job
# without them is byte for byte arq's) ---------------------------------------------------------
#: the job's flow key (``enqueue(..., flow_key=...)``)
FLOW_KEY = "fk"
#: the job's deadline: epoch ms on the Redis server's clock (``expires_in`` / ``expires_at``)
DEADLINE = "xa"
#: the start gate of ``coalesce="keep_last"`` / ``"throttle"``: ``[mode, key, period ms]``
GATE = "cg"
#: The job record's fields, in arq's order.
JOB_FIELDS = (TRY, FUNCTION, ARGS, KWARGS, ENQUEUED)
#: The result record's fields, in arq's order.
RESULT_FIELDS = (*JOB_FIELDS, SUCCESS, RESULT, STARTED, FINISHED, QUEUE, JOB_ID)
#: The fields after the arguments (read from a cut record's tail, :mod:`worker.core.jobhead`).
JOB_TAIL_FIELDS = (ENQUEUED,)
RESULT_TAIL_FIELDS = (ENQUEUED, SUCCESS, STARTED, FINISHED, QUEUE)

Serialize = Callable[[dict[str, Any]], bytes]
Deserialize = Callable[[bytes], dict[str, Any]]


class SerializationError(RuntimeError):
    """A record could not be serialized; also what ``Job.result()`` raises for a failed run
    whose error was kept as text."""


class DeserializationError(SerializationError):
    """A record could not be decoded."""


class JobStatus(str, Enum):  # noqa: UP042 (arq's JobStatus is a str Enum)
    """Where a job is, as arq's ``JobStatus`` (the same values)."""

    #: queued, due later
    deferred = "deferred"
    #: queued and due
    queued = "queued"
    #: claimed by a consumer
    in_progress = "in_progress"
    #: ended, its result kept
    complete = "complete"
    #: none of the above (never enqueued, or its result expired)
    not_found = "not_found"


@dataclass
class JobInfo:
    """A job record, decoded (arq's ``JobDef``: the same fields)."""

    function: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    job_try: int
    enqueue_time: dt.datetime
    score: int | None
    job_id: str | None


@dataclass
class JobResult(JobInfo):
    """A result record, decoded (arq's ``JobResult``: the same fields)."""

    success: bool
    result: Any
    start_time: dt.datetime
    finish_time: dt.datetime
    queue_name: str


class JobFields(NamedTuple):
    """A job record's fields as found, unchecked (``None`` for a missing one; missing
    arguments read as none)."""

    function: Any
    args: Any
    kwargs: Any
    job_try: Any
    enqueued: Any


class ResultFields(NamedTuple):
    """What a result record adds to the job's fields, as found, unchecked."""

    success: Any
    result: Any
    started: Any
    finished: Any
    queue: Any


def job_fields(record: Mapping[str, Any]) -> JobFields:
    """The job fields of a decoded job or result record (see :class:`JobFields`)."""
    return JobFields(
        record.get(FUNCTION),
        record.get(ARGS, ()),
        record.get(KWARGS, {}),
        record.get(TRY),
        record.get(ENQUEUED),
    )


def result_fields(record: Mapping[str, Any]) -> ResultFields:
    """The result fields of a decoded result record (see :class:`ResultFields`)."""
    return ResultFields(
        record.get(SUCCESS),
        record.get(RESULT),
        record.get(STARTED),
        record.get(FINISHED),
        record.get(QUEUE),
    )


def ms_to_datetime(unix_ms: int) -> dt.datetime:
    """A record's milliseconds as an aware UTC datetime."""
    return dt.datetime.fromtimestamp(unix_ms / 1000, tz=dt.UTC)


def job_record(
    function: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    enqueue_time_ms: int,
    job_try: int | None = None,
    *,
    extra: Mapping[str, Any] | None = None,
    flow: JobFlow | None = None,
) -> dict[str, Any]:
    """The job record's map; ``extra``: more fields, which arq ignores (the trace context of
    :mod:`worker.tracing`); ``flow``: the framework's own fields, each only when set."""
    record: dict[str, Any] = {
        TRY: job_try,
        FUNCTION: function,
        ARGS: list(args),
        KWARGS: dict(kwargs),
        ENQUEUED: enqueue_time_ms,
    }
    if extra:
        record.update(extra)
    if flow is not None:
        if flow.flow_key is not None:
            record[FLOW_KEY] = flow.flow_key
        if flow.deadline_ms is not None:
            record[DEADLINE] = flow.deadline_ms
        if flow.gate is not None:
            record[GATE] = list(flow.gate)
    return record


class JobFlow(NamedTuple):
    """The framework's own fields of a job record (``None``: absent)."""

    flow_key: str | None = None
    deadline_ms: int | None = None
    #: ``(mode, coalescing key, period ms)``: a ``keep_last`` or ``throttle`` job's start gate
    gate: tuple[str, str, int] | None = None


def job_flow(record: Mapping[str, Any]) -> JobFlow:
    """The framework's own fields of a decoded job record, checked (a malformed value reads
    as absent)."""
    fk, xa, cg = record.get(FLOW_KEY), record.get(DEADLINE), record.get(GATE)
    gate = None
    if isinstance(cg, list | tuple) and len(cg) == 3:
        mode, key, period = cg
        if isinstance(mode, str) and isinstance(key, str) and type(period) is int:
            gate = (mode, key, period)
    return JobFlow(
        fk if isinstance(fk, str) else None,
        xa if isinstance(xa, int) and not isinstance(xa, bool) else None,
        gate,
    )


def encode_job(
    function: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    enqueue_time_ms: int,
    serialize: Serialize,
    job_try: int | None = None,
    *,
    extra: Mapping[str, Any] | None = None,
    flow: JobFlow | None = None,
) -> bytes:
    """A job record's bytes, as ``arq.jobs.serialize_job`` lays them out (see
    :func:`job_record`)."""
    record = job_record(function, args, kwargs, enqueue_time_ms, job_try, extra=extra, flow=flow)
    return serialize(record)


def encode_result(
    function: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    job_try: int,
    enqueue_time_ms: int,
    success: bool,
    result: Any,
    start_ms: int,
    finished_ms: int,
    ref: str,
    queue_name: str,
    job_id: str,
    *,
    serializer: Serialize,
) -> bytes | None:
    """A result record's bytes, as ``arq.jobs.serialize_result`` writes them: when ``result``
    does not serialize, a failed record saying so; ``None`` when not even that does."""
    data = {
        TRY: job_try,
        FUNCTION: function,
        ARGS: args,
        KWARGS: kwargs,
        ENQUEUED: enqueue_time_ms,
        SUCCESS: success,
        RESULT: result,
        STARTED: start_ms,
        FINISHED: finished_ms,
        QUEUE: queue_name,
        JOB_ID: job_id,
    }
    try:
        return serializer(data)
    except Exception:
        log.warning("error serializing result of %s", ref, exc_info=True)
    data.update({RESULT: "unable to serialize result", SUCCESS: False})
    try:
        return serializer(data)
    except Exception:
        log.critical("error serializing result of %s even after replacing result", ref)
    return None


def decode_job(raw: bytes, deserialize: Deserialize) -> JobInfo:
    """A job record (:class:`DeserializationError` when it does not decode)."""
    try:
        d = deserialize(raw)
        return JobInfo(
            function=d[FUNCTION],
            args=d[ARGS],
            kwargs=d[KWARGS],
            job_try=d[TRY],
            enqueue_time=ms_to_datetime(d[ENQUEUED]),
            score=None,
            job_id=None,
        )
    except Exception as exc:
        raise DeserializationError("unable to deserialize job") from exc


def decode_result(raw: bytes, deserialize: Deserialize) -> JobResult:
    """A result record (:class:`DeserializationError` when it does not decode)."""
    try:
        d = deserialize(raw)
        return JobResult(
            job_try=d[TRY],
            function=d[FUNCTION],
            args=d[ARGS],
            kwargs=d[KWARGS],
            enqueue_time=ms_to_datetime(d[ENQUEUED]),
            score=None,
            success=d[SUCCESS],
            result=d[RESULT],
            start_time=ms_to_datetime(d[STARTED]),
            finish_time=ms_to_datetime(d[FINISHED]),
            queue_name=d.get(QUEUE, "<unknown>"),
            job_id=d.get(JOB_ID, "<unknown>"),
        )
    except Exception as exc:
        raise DeserializationError("unable to deserialize job result") from exc


def raise_result(info: JobResult) -> Any:
    """A result's value, or its error raised (as arq's ``Job.result()``): the exception when
    one was kept, else :class:`SerializationError` with the text kept instead."""
    if info.success:
        return info.result
    if isinstance(info.result, Exception | asyncio.CancelledError):
        raise info.result
    raise SerializationError(info.result)
