"""Run-time schedules as values: what ``client.schedules.upsert`` writes and the leader reads.

A :class:`ScheduleSpec` is one named schedule made at run time (not declared in code): a task
of the app, its arguments, a ``cron`` (with a time zone) or an ``every``, the catch-up policy
of :class:`~worker.duties.periodic.PeriodicDef` and an overlap policy. It travels through Redis
as one JSON record (:func:`encode`); :func:`decode` reads a record back strictly (within the
decode budget, every field checked, the schedule rebuilt) and raises ``ValueError`` for
anything else, so a hostile or damaged record is skipped, never trusted. Pure: no Redis here.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from worker.core import budget as B
from worker.core.errors import ConfigError
from worker.core.schedule import Schedule, make_schedule

Overlap = Literal["allow", "skip"]
CatchUpPolicy = Literal["skip", "latest", "all"]
#: A schedule's name: it is part of its tick job ids (``<prefix>schedule:<name>:<tick ms>``).
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
#: Most ticks a catch-up may enqueue at once (``catch_up_limit``'s bound).
MAX_CATCH_UP = 1000
#: Largest JSON record of one schedule (arguments included).
MAX_RECORD_BYTES = 64 * 1024


@dataclass(frozen=True)
class ScheduleSpec:
    """One run-time schedule: ``task(*args, **kwargs)`` once per tick of ``cron`` (in ``tz``)
    or ``every_s`` seconds. ``catch_up``/``catch_up_limit`` as for ``@app.periodic``;
    ``overlap="skip"``: a tick whose previous run has not ended is skipped (and counted).
    ``version`` is given by Redis at each upsert (0 before it is stored)."""

    name: str
    task: str
    cron: str | None = None
    every_s: float | None = None
    tz: str = "UTC"
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    catch_up: CatchUpPolicy = "all"
    catch_up_limit: int = 10
    overlap: Overlap = "allow"
    version: int = 0
    #: as :attr:`PeriodicDef.catch_up_window_s`; not settable at run time
    catch_up_window_s: float | None = None

    @property
    def schedule(self) -> Schedule:
        return _schedule(self.cron, self.every_s, self.tz)

    def describe(self) -> str:
        return self.schedule.describe()

    def as_dict(self) -> dict[str, Any]:
        """The definition as plain data (``list``, ``show --json``)."""
        return {
            "name": self.name,
            "task": self.task,
            "cron": self.cron,
            "every_s": self.every_s,
            "tz": self.tz,
            "args": list(self.args),
            "kwargs": dict(self.kwargs),
            "catch_up": self.catch_up,
            "catch_up_limit": self.catch_up_limit,
            "overlap": self.overlap,
            "version": self.version,
        }


_SCHEDULES: dict[tuple[str | None, float | None, str], Schedule] = {}


def _schedule(cron: str | None, every_s: float | None, tz: str) -> Schedule:
    """The schedule for a definition, built once per distinct definition (bounded cache)."""
    key = (cron, every_s, tz)
    found = _SCHEDULES.get(key)
    if found is None:
        if len(_SCHEDULES) >= 10_000:
            _SCHEDULES.clear()
        found = _SCHEDULES[key] = make_schedule(cron, every_s, tz)
    return found


def build(
    name: str,
    task: str,
    args: tuple[Any, ...] | list[Any] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    cron: str | None = None,
    every: float | dt.timedelta | None = None,
    tz: str = "UTC",
    catch_up: str = "all",
    catch_up_limit: int = 10,
    overlap: str = "allow",
) -> ScheduleSpec:
    """A checked :class:`ScheduleSpec` (``ConfigError`` naming what is wrong): a valid name,
    exactly one of ``cron``/``every`` (``tz`` only with ``cron``), known policies, and
    arguments that are JSON data (they are stored as JSON)."""
    if not isinstance(name, str) or not NAME.match(name):
        raise ConfigError(f"schedule name {name!r}: use 1-100 letters, digits, '_', '.', '-'")
    if not isinstance(task, str) or not task:
        raise ConfigError("schedule task: give the name of a task the app declares")
    every_s = every.total_seconds() if isinstance(every, dt.timedelta) else every
    if every_s is not None:
        if isinstance(every_s, bool) or not isinstance(every_s, int | float):
            raise ConfigError(f"schedule every={every!r}: give seconds or a timedelta")
        if not math.isfinite(every_s) or every_s > 366 * 86400:
            raise ConfigError(f"schedule every={every!r}: at most a year")
        every_s = float(every_s)
        if tz != "UTC":
            raise ConfigError("schedule tz=...: only with cron=... (every= is in real time)")
    _schedule(cron, every_s, tz)  # raises ConfigError for a bad cron, tz or interval
    if catch_up not in ("skip", "latest", "all"):
        raise ConfigError(f"schedule catch_up={catch_up!r}: use 'skip', 'latest' or 'all'")
    if isinstance(catch_up_limit, bool) or not isinstance(catch_up_limit, int):
        raise ConfigError("schedule catch_up_limit: a whole number")
    if not 1 <= catch_up_limit <= MAX_CATCH_UP:
        raise ConfigError(f"schedule catch_up_limit must be between 1 and {MAX_CATCH_UP}")
    if overlap not in ("allow", "skip"):
        raise ConfigError(f"schedule overlap={overlap!r}: use 'allow' or 'skip'")
    spec = ScheduleSpec(
        name, task, cron, every_s, tz, tuple(args), dict(kwargs or {}),
        catch_up, catch_up_limit, overlap,  # type: ignore[arg-type]
    )  # fmt: skip
    try:
        raw = encode(spec)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"schedule {name}: arguments must be JSON data ({exc})") from None
    if len(raw) > MAX_RECORD_BYTES:
        raise ConfigError(f"schedule {name}: {len(raw)} bytes, more than {MAX_RECORD_BYTES}")
    return spec


def encode(spec: ScheduleSpec) -> str:
    """The JSON record stored for ``spec`` (its version is stored apart, by Redis)."""
    data = spec.as_dict()
    del data["version"], data["name"]
    return json.dumps(data, allow_nan=False, separators=(",", ":"), sort_keys=True)


def decode(name: str, raw: bytes | str, version: int) -> ScheduleSpec:
    """The schedule stored under ``name`` as ``raw`` (``ValueError`` for anything
    :func:`build` would not have written: unknown or missing fields, wrong types, a bad cron,
    a record over the budget)."""
    if len(raw) > MAX_RECORD_BYTES:
        raise ValueError(f"a record of {len(raw)} bytes")
    data = B.json_record(raw)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    known = {"task", "cron", "every_s", "tz", "args", "kwargs", "catch_up"}
    known |= {"catch_up_limit", "overlap"}
    if set(data) != known:
        raise ValueError(f"fields {sorted(data)[:12]}, expected {sorted(known)}")
    if not isinstance(data["args"], list) or not isinstance(data["kwargs"], dict):
        raise ValueError("args must be a list and kwargs an object")
    for text in ("cron", "tz"):
        if data[text] is not None and not isinstance(data[text], str):
            raise ValueError(f"{text} is not text")
    try:
        spec = build(
            name, data["task"], data["args"], data["kwargs"], cron=data["cron"],
            every=data["every_s"], tz=data["tz"] or "UTC", catch_up=data["catch_up"],
            catch_up_limit=data["catch_up_limit"], overlap=data["overlap"],
        )  # fmt: skip
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return ScheduleSpec(**{**spec.__dict__, "version": version})
