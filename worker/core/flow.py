"""What one enqueue decides about its job's flow, besides its arguments: the flow key, the
deadline and the coalescing, each from the call or else from the task's defaults
(``@app.task(flow_key=..., expires_in=..., coalesce=...)``). Pure: no Redis, no settings.

- ``flow_key``: the key the job's flow is about (a tenant, an account); stored in the record.
- a deadline (``expires_in`` seconds, or ``expires_at``): epoch ms on the Redis server's clock,
  stored in the record; a job not started by then never starts and ends ``expired``.
- :class:`Coalesce`: how enqueues of one key fold into few runs (``replace``, ``debounce``,
  ``throttle``, ``keep_last``; see docs/flow-control.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

Mode = Literal["replace", "debounce", "throttle", "keep_last"]
MODES: tuple[str, ...] = get_args(Mode)
#: ``@app.task(flow_key=...)``: the flow key of a job from its arguments.
FlowKeyOf = Callable[..., "str | None"]


@dataclass(frozen=True)
class Coalesce:
    """A coalescing mode and its periods (seconds): ``debounce`` runs ``debounce_s`` after the
    last enqueue and at most ``max_wait_s`` after the first; ``throttle`` accepts one enqueue
    per ``throttle_s``."""

    mode: Mode
    debounce_s: float = 0.0
    max_wait_s: float = math.inf
    throttle_s: float = 0.0

    @classmethod
    def of(
        cls,
        mode: str | None,
        debounce_s: float | None = None,
        max_wait_s: float | None = None,
        throttle_s: float | None = None,
    ) -> Coalesce | None:
        """A checked mode (``None`` for none); :class:`ValueError` naming what is wrong."""
        if mode is None:
            if debounce_s is not None or max_wait_s is not None or throttle_s is not None:
                raise ValueError("debounce_s, max_wait_s and throttle_s need coalesce=...")
            return None
        if mode not in MODES:
            raise ValueError(f"coalesce must be one of {', '.join(MODES)}, not {mode!r}")
        wanted = {"debounce": ("debounce_s", "max_wait_s"), "throttle": ("throttle_s",)}
        given = {"debounce_s": debounce_s, "max_wait_s": max_wait_s, "throttle_s": throttle_s}
        for name, value in given.items():
            if value is None:
                continue
            if name not in wanted.get(mode, ()):
                raise ValueError(f"{name} goes with coalesce={wanted_by(name)!r}, not {mode!r}")
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number >= 0, not {value!r}")
        if mode == "debounce" and debounce_s is None:
            raise ValueError("coalesce='debounce' needs debounce_s=")
        if mode == "throttle" and not throttle_s:
            raise ValueError("coalesce='throttle' needs throttle_s= > 0")
        return cls(
            mode,  # type: ignore[arg-type]  # checked against MODES above
            debounce_s or 0.0,
            math.inf if max_wait_s is None else max_wait_s,
            throttle_s or 0.0,
        )


def wanted_by(name: str) -> str:
    return "throttle" if name == "throttle_s" else "debounce"


@dataclass(frozen=True)
class TaskFlow:
    """A task's flow defaults (``@app.task``): its flow key from the job's arguments, its
    deadline after enqueue (seconds) and its coalescing."""

    flow_key: FlowKeyOf | None = None
    expires_in_s: float | None = None
    coalesce: Coalesce | None = None

    @classmethod
    def of(
        cls, flow_key: FlowKeyOf | None, expires_in: float | None, coalesce: Coalesce | None
    ) -> TaskFlow:
        """A task's checked defaults (:data:`NO_FLOW` for none: its enqueues decide nothing)."""
        if flow_key is None and expires_in is None and coalesce is None:
            return NO_FLOW
        return cls(flow_key, expires_in_checked(expires_in), coalesce)

    def key_of(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
        """The flow key the task gives a job of these arguments (``None``: none)."""
        if self.flow_key is None:
            return None
        key = self.flow_key(*args, **kwargs)
        if key is not None and not isinstance(key, str):
            raise TypeError(f"flow_key must return a str or None, not {type(key).__name__}")
        return key


NO_FLOW = TaskFlow()


def expires_in_checked(seconds: float | None, what: str = "expires_in") -> float | None:
    """``seconds`` (``None``: none), :class:`ValueError` unless a finite number >= 0."""
    if seconds is not None and not (seconds >= 0 and math.isfinite(seconds)):
        raise ValueError(f"{what} must be a finite number of seconds >= 0, not {seconds!r}")
    return seconds
