"""A job's envelope: the claimed record checked before anything else touches it.

A hostile record (a payload of the wrong shape, too large, not a string; a try counter that is
not a number; a job id outside the app's keys) becomes a :class:`BadJob` naming what is wrong;
the executor sets it aside, the loop never crashes on it.
"""

from __future__ import annotations

from typing import Any

from worker.core import codec
from worker.core.budget import OverBudget
from worker.core.serializer import Deserialize
from worker.storage import FOREIGN, Claimed
from worker.storage.keys import Keys

#: Largest enqueue time accepted in a payload (year 2286): later values break datetimes.
MAX_ENQUEUE_MS = 10**13

Envelope = tuple[str, tuple[Any, ...], dict[str, Any], int | None, int]


class BadJob(Exception):
    """A job that cannot run: set aside with this reason, never retried."""

    def __init__(self, reason: str, kind: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


#: The job record's field names (:mod:`worker.core.codec`), as module globals for the hot path.
_F, _A, _K, _T, _ET = codec.FUNCTION, codec.ARGS, codec.KWARGS, codec.TRY, codec.ENQUEUED


def validate(record: Any) -> Envelope:
    """``(function, args, kwargs, try, enqueue ms)`` of an arq job record, or :class:`BadJob`
    naming the field that is wrong. Checked before anything else touches it."""
    if type(record) is dict:  # the usual record, of the decoders' own types: checked at once
        fn, args, kwargs = record.get(_F), record.get(_A, ()), record.get(_K, {})
        job_try, enqueued = record.get(_T), record.get(_ET)
        if (
            type(fn) is str
            and 0 < len(fn) <= 256
            and (type(args) is list or type(args) is tuple)
            and type(kwargs) is dict
            and (job_try is None or (type(job_try) is int and 0 <= job_try < 10**6))
            and type(enqueued) is int
            and 0 <= enqueued <= MAX_ENQUEUE_MS
            and (not kwargs or all(type(k) is str for k in kwargs))
        ):
            return fn, tuple(args), kwargs, job_try, enqueued
    return _checked(record)


def _checked(record: Any) -> Envelope:
    """:func:`validate` field by field, naming the first that is wrong."""
    if not isinstance(record, dict):
        raise BadJob(f"malformed payload: a {type(record).__name__}, not a map", "malformed")
    fn, args, kwargs, job_try, enqueued = codec.job_fields(record)
    if not isinstance(fn, str) or not fn or len(fn) > 256:
        raise BadJob(f"malformed payload: field {codec.FUNCTION!r} is {_shape(fn)}", "malformed")
    if not isinstance(args, list | tuple):
        raise BadJob(f"malformed payload: field {codec.ARGS!r} is {_shape(args)}", "malformed")
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise BadJob(f"malformed payload: field {codec.KWARGS!r} is {_shape(kwargs)}", "malformed")
    if job_try is not None and (
        isinstance(job_try, bool) or not isinstance(job_try, int) or not 0 <= job_try < 10**6
    ):
        raise BadJob(f"malformed payload: field {codec.TRY!r} is {_shape(job_try)}", "malformed")
    if (
        isinstance(enqueued, bool)
        or not isinstance(enqueued, int)
        or not 0 <= enqueued <= MAX_ENQUEUE_MS
    ):
        raise BadJob(
            f"malformed payload: field {codec.ENQUEUED!r} is {_shape(enqueued)}", "malformed"
        )
    return fn, tuple(args), kwargs, job_try, enqueued


def _shape(value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{type(value).__name__} {value!r}"[:60]
    return f"a {type(value).__name__}"


def decode(c: Claimed, deserialize: Deserialize, keys: Keys, max_payload_bytes: int) -> Envelope:
    """The checked envelope of a claimed job, or :class:`BadJob` (expired, foreign, oversized,
    malformed)."""
    return decode_record(c, deserialize, keys, max_payload_bytes)[1]


def decode_record(
    c: Claimed, deserialize: Deserialize, keys: Keys, max_payload_bytes: int
) -> tuple[dict[str, Any], Envelope]:
    """:func:`decode`, with the record itself (for the extra fields a feature wrote, which
    arq ignores: the trace context of :mod:`worker.tracing`)."""
    if c.payload is None:
        if c.size == FOREIGN:
            where = (
                "the app's hash slot: in Redis Cluster"
                if keys.slot_tag
                else "the Redis user's key patterns: with an ACL user per app"
            )
            raise BadJob(
                f"job id outside {where} every job id must start with "
                f"{keys.slot_tag or keys.prefix} (enqueue with Client, "
                "or pass arq's _job_id=client.new_job_id())",
                "foreign",
            )
        if c.size == 0:
            raise BadJob("job expired", "expired")
        if c.size < 0:
            raise BadJob("malformed payload: the job record is not a string", "malformed")
        raise BadJob(
            f"payload of {c.size} bytes exceeds WORKER_MAX_PAYLOAD_BYTES ({max_payload_bytes})",
            "oversized",
        )
    if c.try_ < 0:
        raise BadJob("the job's try counter is not a number", "malformed")
    try:
        record = deserialize(c.payload)
    except OverBudget as exc:
        why = f"payload over the decode budget: {exc} (not decoded further)"
        raise BadJob(why, "oversized") from None
    except Exception as exc:
        raise BadJob(f"malformed payload: {type(exc).__name__}", "malformed") from None
    return record, validate(record)
