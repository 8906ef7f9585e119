"""Cluster-wide limits on a task: at most N running at once, at most N starting per period.

Seed 003's refresh storm and seed 004's note ("an in-process limiter times N replicas is no
limit") are the reason: the limits live in Redis, so they hold across every consumer.

- ``max_concurrency=N``: a sorted set of slots (job id -> lease expiry). A run takes a slot
  before it starts and gives it back when it ends; the consumer renews its slots while the
  jobs run, so a SIGKILLed consumer's slots come back when their short lease expires.
- ``rate="N/s"`` (``/m``, ``/h``): a generic cell rate algorithm (one timestamp in Redis):
  N starts per period, bursts of up to N.

A job over a limit is deferred (put back, its try given back), never failed.
"""

from __future__ import annotations

import re

from worker.errors import ConfigError

_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*\.?\d*)\s*(s|sec|second|m|min|minute|h|hour)s?\s*$")
_UNIT_S = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0}
_UNIT_S |= {"h": 3600.0, "hour": 3600.0}


def parse_rate(text: str) -> tuple[int, float]:
    """``"100/s"`` -> ``(100, 1.0)``; also ``"5/10s"``, ``"30/m"``, ``"1000/h"``."""
    m = _RATE.match(text)
    if not m or int(m.group(1)) < 1:
        raise ConfigError(f"task rate={text!r}: use N/s, N/m or N/h (e.g. '100/s', '5/10s')")
    per = float(m.group(2) or 1) * _UNIT_S[m.group(3)]
    if per <= 0:
        raise ConfigError(f"task rate={text!r}: the period must be positive")
    return int(m.group(1)), per
