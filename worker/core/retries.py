"""What a task raises to run again: :class:`Retry` (after ``defer``, while tries remain) and
:class:`RetryJob`. arq's own ``arq.worker.Retry`` and ``RetryJob`` count too (an arq app moved
in unchanged raises them): they are recognised by class, without importing arq."""

from __future__ import annotations

import datetime as dt

__all__ = ["Retry", "RetryJob", "is_retry", "retry_defer_ms"]

#: arq's classes, by module and name (recognised without importing arq).
_ARQ = {("arq.worker", "Retry"), ("arq.worker", "RetryJob")}


def _to_ms(defer: float | dt.timedelta | None) -> int | None:
    if defer is None:
        return None
    seconds = defer.total_seconds() if isinstance(defer, dt.timedelta) else defer
    return round(seconds * 1000)


class Retry(RuntimeError):
    """Run the job again (while ``max_tries`` allows): after ``defer`` (seconds or a
    ``timedelta``), else after the task's ``retry_delay``, else at once. Behaves as arq's
    ``arq.worker.Retry``."""

    def __init__(self, defer: float | dt.timedelta | None = None) -> None:
        self.defer_score: int | None = _to_ms(defer)

    def __repr__(self) -> str:
        return f"<Retry defer {(self.defer_score or 0) / 1000:0.2f}s>"

    def __str__(self) -> str:
        return repr(self)


class RetryJob(RuntimeError):
    """Run the job again at its original due time (as arq's ``arq.worker.RetryJob``)."""


def _arq_kind(exc: BaseException) -> str | None:
    for cls in type(exc).__mro__:
        if (cls.__module__, cls.__name__) in _ARQ:
            return cls.__name__
    return None


def is_retry(exc: BaseException) -> bool:
    """``exc`` asks for another try: a :class:`Retry` or :class:`RetryJob`, ours or arq's."""
    return isinstance(exc, Retry | RetryJob) or _arq_kind(exc) is not None


def retry_defer_ms(exc: BaseException) -> int | None:
    """The delay a retry request asked for, in ms (``None``: none asked)."""
    if isinstance(exc, Retry) or _arq_kind(exc) == "Retry":
        defer = getattr(exc, "defer_score", None)
        return defer if isinstance(defer, int) else None
    return None
