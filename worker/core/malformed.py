"""Malformed Redis entries: skipped by their readers, logged once per entry, counted.

Anyone with write access to the app's keys (a bug in another service, a manual fix gone
wrong) can leave an entry no reader of this framework wrote: a queue score of ``+inf``, a
broadcast whose sequence is not a number, an instance record that is not JSON, a leadership
change dated past year 9999. Readers skip such an entry and call :func:`skip`, which logs it
once per process (``malformed=<kind>``, ``key``, ``entry``) however often it is read again,
and counts it (:data:`SKIPPED`); the process keeps going.
"""

from __future__ import annotations

from collections import Counter

import structlog

log = structlog.get_logger("worker.malformed")

#: Entries already logged, at most :data:`REMEMBER` (then logged again: bounded memory).
REMEMBER = 10_000
_logged: set[tuple[str, str, str]] = set()
#: Malformed entries met by this process, per kind (each entry counted once).
SKIPPED: Counter[str] = Counter()
#: The latest instant a time read from Redis may hold: the end of year 9999, in ms (what
#: Python's datetime can represent; a browser's ``Date`` goes further).
MAX_TIME_MS = 253_402_300_799_999


def skip(kind: str, key: str, entry: object, error: str) -> None:
    """Report a malformed entry ``entry`` of ``key`` (``kind``: what it should have been)."""
    seen = (kind, key, str(entry)[:200])
    if seen in _logged:
        return
    if len(_logged) >= REMEMBER:
        _logged.clear()
    _logged.add(seen)
    SKIPPED[kind] += 1
    log.warning(
        "malformed Redis entry skipped", malformed=kind, key=key, entry=seen[2], error=error[:200]
    )


def time_ms(value: object) -> int | None:
    """``value`` as a time in ms when it is a whole number between 0 and
    :data:`MAX_TIME_MS` (a score of ``inf``, ``nan``, ``1e300`` is not), else ``None``."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if not 0 <= number <= MAX_TIME_MS:  # also False for nan
        return None
    return int(number)


#: The largest counter read from Redis taken as a number (what a browser's JSON keeps exact).
MAX_COUNT = 2**53 - 1


def count(value: object) -> int | None:
    """``value`` (bytes or text) as a counter when it is a whole number between 0 and
    :data:`MAX_COUNT` (a 400-digit count, ``-1``, ``1.5``, text are not), else ``None``."""
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    if not text.isascii() or not text.isdigit() or len(text) > 16:
        return None
    number = int(text)
    return number if number <= MAX_COUNT else None
