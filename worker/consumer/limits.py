"""Cluster-wide limits on a task: at most N running at once, at most N starting per period.

A credential-refresh storm multiplied by the replica count, and "an in-process limiter times
N replicas is no limit", are the reason: the limits live in Redis, so they hold across every
consumer.

- ``max_concurrency=N``: a sorted set of slots (job id -> lease expiry). A run takes a slot
  before it starts and gives it back when it ends; the consumer renews its slots while the
  jobs run, so a SIGKILLed consumer's slots come back when their short lease expires.
- ``rate="N/s"`` (``/m``, ``/h``): a generic cell rate algorithm (one timestamp in Redis):
  N starts per period, bursts of up to N.
- ``max_concurrency_per_key=N``, ``rate_per_key="N/s"``: the same, one slots set and one
  timestamp per flow key of the task (``<prefix>limit:<task>:key:<flow key>:…``); a job without
  a flow key has no per-key limit. A job takes its per-key rate before the task's.

A job over a limit is deferred (put back, its try given back), never failed: the consumer
asks :class:`LimitsHook` (registered in ``worker/runtime/roles.py``) before each job starts.
"""

from __future__ import annotations

import contextlib
import random
import re
from collections.abc import Mapping
from typing import Any

from worker.core import codec
from worker.core.clock import Clock, ms
from worker.core.errors import ConfigError
from worker.core.jobdefs import NO_RECORD, JobDef, JobHook
from worker.storage.store import Store

_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*\.?\d*)\s*(s|sec|second|m|min|minute|h|hour)s?\s*$")
_UNIT_S = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0}
_UNIT_S |= {"h": 3600.0, "hour": 3600.0}
#: Lease of a concurrency slot, renewed while its job runs (a dead holder's slot comes back
#: after at most this long).
SLOT_LEASE_S = 10.0


def parse_rate(text: str) -> tuple[int, float]:
    """``"100/s"`` -> ``(100, 1.0)``; also ``"5/10s"``, ``"30/m"``, ``"1000/h"``."""
    m = _RATE.match(text)
    if not m or int(m.group(1)) < 1:
        raise ConfigError(f"task rate={text!r}: use N/s, N/m or N/h (e.g. '100/s', '5/10s')")
    per = float(m.group(2) or 1) * _UNIT_S[m.group(3)]
    if per <= 0:
        raise ConfigError(f"task rate={text!r}: the period must be positive")
    return int(m.group(1)), per


class LimitsHook(JobHook):
    """Consumer hook: a limited task's job takes its concurrency slots and rate allowances
    (the task's, and its flow key's) before it starts (deferred, its try given back, while one
    is not free), renews its slots while it runs, and gives them back when it ends."""

    def __init__(self, store: Store, clock: Clock, *, slot_lease_s: float = SLOT_LEASE_S) -> None:
        self.store = store
        self.clock = clock
        self.slot_lease_s = slot_lease_s
        #: job id -> (task, the scopes of its slots: None the task's, else its flow key's)
        self.slots: dict[str, tuple[str, list[str | None]]] = {}

    def concerns(self, job: JobDef) -> bool:
        return bool(
            job.max_concurrency or job.rate or job.max_concurrency_per_key or job.rate_per_key
        )

    async def admit(
        self, job: JobDef, job_id: str, record: Mapping[str, Any] = NO_RECORD
    ) -> int | None:
        flow = codec.job_flow(record).flow_key  # a job without one has no per-key limit
        now = ms(self.clock.time())
        lease = ms(self.slot_lease_s)
        slots: list[tuple[str | None, int | None]] = [(None, job.max_concurrency)]
        rates: list[tuple[str | None, tuple[int, float] | None]] = [(None, job.rate)]
        if flow is not None:
            slots.append((flow, job.max_concurrency_per_key))
            rates.insert(0, (flow, job.rate_per_key))
        wait, taken = 0, []
        for scope, most in slots:
            if most and not wait:
                wait = await self.store.take_slot(job.name, job_id, now, lease, most, scope)
                taken += [] if wait else [scope]
        for scope, rate in rates:
            if rate and not wait:
                wait = await self.store.take_rate(job.name, now, *rate, scope)
        if taken and not wait:
            self.slots[job_id] = (job.name, taken)
        elif taken:  # not starting after all
            for scope in taken:
                await self.store.release_slot(job.name, job_id, scope)
        if not wait:
            return None
        return now + min(wait, 1000) + random.randint(0, 50)  # look again soon; spread the herd

    async def release(self, job: JobDef, job_id: str) -> None:
        held = self.slots.pop(job_id, None)
        if held is not None:
            with contextlib.suppress(Exception):
                for scope in held[1]:
                    await self.store.release_slot(job.name, job_id, scope)

    async def renew(self) -> None:
        """Keep the concurrency slots of running jobs."""
        if not self.slots:
            return
        by_scope: dict[tuple[str, str | None], list[str]] = {}
        for job_id, (task, scopes) in self.slots.items():
            for scope in scopes:
                by_scope.setdefault((task, scope), []).append(job_id)
        await self.store.renew_slots(by_scope, ms(self.clock.time() + self.slot_lease_s))
