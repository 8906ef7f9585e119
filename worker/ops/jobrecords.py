"""Decoding a job's records for the jobs read model (:mod:`worker.ops.jobsview`): arq's job and
result records, failure and progress records, and the listing's cursors. A record that does not
decode is reported as text, never raised."""

from __future__ import annotations

import base64
import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Literal

from worker.core import codec
from worker.core import malformed as M
from worker.core.jobhead import read_head, read_tail
from worker.core.serializer import Deserialize
from worker.storage.inspect_jobs import JobPlace, JobRecord
from worker.storage.keys import DEFAULT_QUEUE

#: What ``job_detail`` can find a job to be (a listing's states, and the ends).
DetailState = Literal[
    "queued", "scheduled", "running", "done", "failed", "timeout", "cancelled", "dead", "expired"
]
ENDS = ("failed", "timeout", "cancelled", "dead", "expired")
#: A failed result's error type -> the end it names (else ``failed``).
ENDED_BY = {"CancelledError": "cancelled", "TimeoutError": "timeout", "JobExpired": "expired"}
#: Characters kept of an args/kwargs/result repr (detail) and of args in a listing.
REPR_CHARS = 2000
SUMMARY_REPR_CHARS = 120


@dataclass
class Decoded:
    task: str | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    tries: int | None = None
    enqueued_ms: int | None = None
    error: str | None = None
    #: the record's size when only its head was decoded (the arguments shown are its first)
    cut_bytes: int | None = None
    #: whether ``kwargs`` are the record's (``False``: the cut came before them)
    kwargs_read: bool = True


def short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def decode_job(
    payload: bytes | None,
    deserialize: Deserialize,
    *,
    size: int | None = None,
    tail: bytes | None = None,
) -> Decoded:
    """arq's job record ``{"t", "f", "a", "k", "et"}``; a bad one is reported, never raised.
    ``payload`` may be the head of a record of ``size`` bytes (``tail``: its last bytes):
    then only that head is decoded (:mod:`worker.core.jobhead`)."""
    if payload is None:
        return Decoded()
    cut = size is not None and size > len(payload)
    try:
        if cut:
            data, _ = read_head(payload, deserialize)
            data = {**read_tail(tail or b"", deserialize, codec.JOB_TAIL_FIELDS), **data}
        else:
            data = deserialize(payload)
        fn, args, kwargs, t, et = codec.job_fields(data)
        args, kwargs = args or (), kwargs or {}
        return Decoded(
            fn if isinstance(fn, str) else None,
            tuple(args) if isinstance(args, list | tuple) else (args,),
            kwargs if isinstance(kwargs, dict) else {"?": kwargs},
            t if isinstance(t, int) else None,
            as_ms(et),
            cut_bytes=size if cut else None,
            kwargs_read=not cut or codec.KWARGS in data,
        )
    except Exception as exc:
        return Decoded(error=f"job record: {type(exc).__name__}: {short(str(exc), 200)}")


def args_text(d: Decoded, limit: int) -> str:
    parts = [repr(a) for a in d.args] + [f"{k}={v!r}" for k, v in d.kwargs.items()]
    text = ", ".join(parts)
    if d.cut_bytes is not None:
        return short(text, limit - 24) + f"{', ' if parts else ''}… ({d.cut_bytes} bytes)"
    return short(text, limit)


def args_repr(d: Decoded, limit: int = REPR_CHARS, *, kwargs: bool = False) -> str:
    """``repr`` of the arguments (``kwargs``: the keyword arguments) for a job's detail: the
    first ones when the record was cut, and how long it was."""
    if d.cut_bytes is None or (kwargs and d.kwargs_read):
        return short(repr(d.kwargs if kwargs else d.args), limit)
    cut = f"… ({d.cut_bytes} bytes in all)"
    if kwargs:
        return cut
    head = "".join(f"{a!r}, " for a in d.args)
    return f"({short(head, limit - 40)}{cut})"


def as_ms(value: Any) -> int | None:
    """A time read from a job's records as ms, ``None`` unless in range (0 to year 9999:
    a time out of range or not a number is shown as unknown, never raised)."""
    if isinstance(value, dt.datetime):
        try:
            value = round(value.timestamp() * 1000)
        except (OverflowError, ValueError, OSError):
            return None
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value <= M.MAX_TIME_MS else None


def matches(job_id: str, d: Decoded, task: str | None, search: str | None) -> bool:
    if task is not None and d.task != task:
        return False
    if search:
        text = f"{job_id} {d.task or ''} {args_text(d, 10_000)}".lower()
        return search.lower() in text
    return True


# -- cursors ---------------------------------------------------------------------------------


def parse_cursor(cursor: str | None, parts: int) -> list[str] | None:
    if not cursor:
        return None
    try:
        fields = base64.urlsafe_b64decode(cursor.encode()).decode().split("\n")
    except Exception as exc:
        raise ValueError(f"not a cursor of this listing: {cursor!r}") from exc
    if len(fields) != parts:
        raise ValueError(f"not a cursor of this listing: {cursor!r}")
    return fields


def make_cursor(*fields: object) -> str:
    return base64.urlsafe_b64encode("\n".join(map(str, fields)).encode()).decode()


def fraction(progress: dict[str, Any] | None) -> float | None:
    value = (progress or {}).get("fraction")
    return float(value) if isinstance(value, int | float) else None


def error_line(failure: dict[str, Any]) -> str | None:
    """``Type: message`` of a failure record, shortened (what a failed listing shows)."""
    if not failure.get("error_type"):
        return None
    return short(f"{failure['error_type']}: {failure.get('message') or ''}", SUMMARY_REPR_CHARS)


def ended_state(result: dict[str, Any], state: str) -> str:
    if not result or result.get("success") is not False:  # None: a cut record's, not found
        return state
    kind = (error_of(result) or {}).get("type")
    return ENDED_BY.get(str(kind), "failed")


def decode_result(
    raw: bytes | None,
    deserialize: Deserialize,
    prefix: str,
    *,
    size: int | None = None,
    tail: bytes | None = None,
) -> dict[str, Any]:
    """arq's result record as plain fields (``{}`` when absent; ``undecodable`` when bad).
    ``raw`` may be the head of a record of ``size`` bytes (``tail``: its last bytes): then
    only the head is decoded, the times, queue and outcome taken from the tail when there
    (``success`` ``None``: not found)."""
    if raw is None:
        return {}
    if size is not None and size > len(raw):
        return _cut_result(raw, deserialize, prefix, size, tail or b"")
    try:
        r = codec.decode_result(raw, deserialize)
    except Exception as exc:
        return {"undecodable": f"result record: {type(exc).__name__}: {short(str(exc), 200)}"}
    d = Decoded(r.function, tuple(r.args), dict(r.kwargs))
    return {
        "task": r.function,
        "tries": r.job_try,
        "enqueued_ms": as_ms(r.enqueue_time),
        "started_ms": as_ms(r.start_time),
        "finished_ms": as_ms(r.finish_time),
        "success": r.success,
        "value": r.result,
        "queue": queue_name(r.queue_name, prefix),
        "args": args_text(d, SUMMARY_REPR_CHARS),
        "args_full": args_repr(d),
        "kwargs_full": args_repr(d, kwargs=True),
    }


def _cut_result(
    head: bytes, deserialize: Deserialize, prefix: str, size: int, tail: bytes
) -> dict[str, Any]:
    try:
        data, _ = read_head(head, deserialize)
    except Exception as exc:
        return {"undecodable": f"result record: {type(exc).__name__}: {short(str(exc), 200)}"}
    data = {**read_tail(tail, deserialize, codec.RESULT_TAIL_FIELDS), **data}
    d = decode_job(head, deserialize, size=size, tail=tail)

    def num(v: Any) -> int | None:
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    r = codec.result_fields(data)
    return {
        "task": d.task,
        "tries": d.tries,
        "enqueued_ms": num(codec.job_fields(data).enqueued),
        "started_ms": num(r.started),
        "finished_ms": num(r.finished),
        "success": r.success if isinstance(r.success, bool) else None,
        "value": r.result,
        "queue": queue_name(r.queue, prefix),
        "args": args_text(d, SUMMARY_REPR_CHARS),
        "args_full": args_repr(d),
        "kwargs_full": args_repr(d, kwargs=True),
    }


def job_of(rec: JobRecord, deserialize: Deserialize) -> Decoded:
    """:func:`decode_job` of a record as :meth:`Store.job_records` read it (whole or in part)."""
    return decode_job(rec.payload, deserialize, size=rec.payload_size, tail=rec.payload_tail)


def result_of(rec: JobRecord, deserialize: Deserialize, prefix: str) -> dict[str, Any]:
    """:func:`decode_result` of a record as :meth:`Store.job_records` read it."""
    return decode_result(
        rec.result, deserialize, prefix, size=rec.result_size, tail=rec.result_tail
    )


def queue_name(key: Any, prefix: str) -> str | None:
    """The queue named by arq's ``queue_name`` in a result (our key: ``<prefix>queue`` is
    ``default``, ``<prefix>queue:<name>`` is ``name``)."""
    if not isinstance(key, str):
        return None
    if key == f"{prefix}queue":
        return DEFAULT_QUEUE
    return key.removeprefix(f"{prefix}queue:") if key.startswith(f"{prefix}queue:") else key


def error_of(result: dict[str, Any]) -> dict[str, Any] | None:
    """A failed run's error from arq's result record: its type and message."""
    if not result or result.get("success"):
        return None
    value = result.get("value")
    if isinstance(value, BaseException):
        return {"type": type(value).__name__, "message": str(value), "traceback": None}
    if isinstance(value, dict) and "error" in value:
        return {"type": value["error"], "message": value.get("message"), "traceback": None}
    return {"type": "error", "message": short(repr(value), REPR_CHARS), "traceback": None}


def instance_of(marker: str | None) -> str | None:
    """The instance id in a claim token (``<instance id>/<n>``)."""
    if marker is None:
        return None
    head, sep, _ = marker.rpartition("/")
    return head if sep else marker


def detail_state(
    rec: JobRecord,
    place: JobPlace,
    result: dict[str, Any],
    letter: dict[str, Any] | None,
    now_ms: int,
) -> str | None:
    """What the records say a job is (``None``: nothing of it is left)."""
    if rec.payload is not None and rec.marker is not None:
        return "running"
    if rec.payload is not None and place.queue is not None:
        return "queued" if (place.score_ms or 0) <= now_ms else "scheduled"
    if result:
        if result.get("success") or (result.get("success") is None and "task" in result):
            return "done"  # (a cut record without its outcome: a failure record says more)
        kind = (error_of(result) or {}).get("type")
        return ENDED_BY.get(str(kind), "failed")
    if letter is not None:
        return "dead"
    return None
