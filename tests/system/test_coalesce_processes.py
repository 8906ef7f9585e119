"""Coalesced enqueues with real processes: two consumers, enqueues racing the running job's
end, and a consumer SIGKILLed while a ``keep_last`` job of the key runs.

The ledger is the app's log (harness/apps/coalesce.py): every run's start and end with its key,
argument, job id and time; the enqueues' times are taken before each call (the call's effect in
Redis comes after it, so a run that started after that time started after the enqueue).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from typing import Any

import pytest
import redis as redis_sync

from harness import Spawn, wait_until
from harness.apps.coalesce import app as co_app
from harness.probes import start_consumers
from worker.client import Client
from worker.storage import keys as K

APP = "harness.apps.coalesce:app"


class Run:
    def __init__(self, key: str, arg: int, job_id: str, start: float) -> None:
        self.key, self.arg, self.job_id, self.start = key, arg, job_id, start
        self.end: float | None = None


def _runs(rsync: redis_sync.Redis, prefix: str, key: str) -> list[Run]:
    runs: dict[tuple[str, int], Run] = {}
    order: list[Run] = []
    starts: dict[str, int] = {}
    for raw in rsync.lrange(f"{prefix}co:log", 0, -1):
        kind, k, arg, job_id, at = raw.decode().split("|")
        if k != key:
            continue
        if kind == "start":
            n = starts[job_id] = starts.get(job_id, 0) + 1
            run = runs[(job_id, n)] = Run(k, int(arg), job_id, float(at))
            order.append(run)
        else:
            runs[(job_id, starts[job_id])].end = float(at)
    return order


def _consumers(spawn: Spawn, rsync: redis_sync.Redis, names: list[str], **env: str) -> list[Any]:
    return start_consumers(spawn, rsync, names, APP, {"CO_STEP_S": "0.1", **env})


def _every_enqueue_gets_a_later_run(sent: list[tuple[int, float]], runs: list[Run]) -> None:
    """For each enqueue (argument, time before the call): a run of it or of a later one that
    started after it."""
    for arg, at in sent:
        assert any(r.arg >= arg and r.start > at for r in runs), (arg, at)


async def _race(
    url: str,
    prefix: str,
    task: str,
    key: str,
    n: int,
    gap_s: tuple[float, float],
    base: int = 0,
    **opts: Any,
) -> list[tuple[int, float, str | None]]:
    """``n`` enqueues of arguments ``base``.. with random gaps: (argument, time, job id)."""
    client = await Client.connect(url, app=co_app, key_prefix=prefix)
    sent = []
    try:
        for i in range(base, base + n):
            at = time.time()
            jid = await client.enqueue(task, key, i, **opts)
            sent.append((i, at, jid))
            await asyncio.sleep(random.uniform(*gap_s))
    finally:
        await client.close()
    return sent


def _queue_empty(rsync: redis_sync.Redis, prefix: str) -> bool:
    return rsync.zcard(K.Keys(prefix).queue) == 0


@pytest.mark.slow
def test_keep_last_runs_one_at_a_time_and_every_enqueue_gets_a_later_run(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    _consumers(spawn, rsync, ["c1", "c2"])
    # gaps around the run's length (0.1 s): enqueues land while a run ends, while one is pending
    sent = asyncio.run(_race(redis_url, prefix, "latest", "k", 40, (0.0, 0.2)))
    wait_until(
        lambda: (
            _queue_empty(rsync, prefix)
            and any(r.arg == 39 and r.end for r in _runs(rsync, prefix, "k"))
        ),
        60,
        what="the last enqueue's run",
    )
    runs = _runs(rsync, prefix, "k")
    _every_enqueue_gets_a_later_run([(i, at) for i, at, _ in sent], runs)
    ended = sorted((r for r in runs), key=lambda r: r.start)
    for a, b in itertools.pairwise(ended):  # never two runs of the key at once
        assert a.end is not None and a.end <= b.start, (a.arg, b.arg)
    assert len(runs) < len(sent), "nothing was coalesced"
    assert max(runs, key=lambda r: r.start).arg == 39  # the last state wins


@pytest.mark.slow
def test_replace_debounce_and_throttle_at_two_consumers(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    _consumers(spawn, rsync, ["c1", "c2"])

    async def all_modes() -> list[list[tuple[int, float, str | None]]]:
        return list(
            await asyncio.gather(
                # due 0.3 s after it is made: enqueues fold into it, then race its claim
                _race(redis_url, prefix, "note", "r", 40, (0.0, 0.05), flow_key="r",
                      coalesce="replace", defer_by=0.3),
                _race(redis_url, prefix, "note", "d", 10, (0.03, 0.05), flow_key="d",
                      coalesce="debounce", debounce_s=0.5, max_wait_s=30),
                _race(redis_url, prefix, "note", "m", 30, (0.05, 0.05), flow_key="m",
                      coalesce="debounce", debounce_s=0.5, max_wait_s=0.6),
                _race(redis_url, prefix, "note", "t", 30, (0.05, 0.05), flow_key="t",
                      coalesce="throttle", throttle_s=0.6),
            )
        )  # fmt: skip

    replace, debounce, capped, throttle = asyncio.run(all_modes())
    accepted = [s for s in throttle if s[2] is not None]
    wait_until(
        lambda: (
            _queue_empty(rsync, prefix)
            and any(r.arg == 39 and r.end for r in _runs(rsync, prefix, "r"))
            and any(r.arg == 9 and r.end for r in _runs(rsync, prefix, "d"))
            and len(_runs(rsync, prefix, "t")) == len(accepted)
        ),
        60,
        what="every mode's runs",
    )
    runs = _runs(rsync, prefix, "r")  # replace: the latest arguments always run
    _every_enqueue_gets_a_later_run([(i, at) for i, at, _ in replace], runs)
    assert len(runs) == len({j for _, _, j in replace}) < len(replace), "none folded"
    runs = _runs(rsync, prefix, "d")  # debounce: one run, after the last enqueue's quiet time
    assert len(runs) <= 2, [r.arg for r in runs]  # (2 only if the box stalled an enqueue 0.5 s)
    assert runs[-1].arg == 9 and runs[-1].start >= debounce[-1][1] + 0.45
    runs = _runs(rsync, prefix, "m")  # max_wait: runs while enqueues go on, none waits longer
    assert 2 <= len(runs) <= 6, [r.arg for r in runs]
    _every_enqueue_gets_a_later_run([(i, at) for i, at, _ in capped], runs)
    span = throttle[-1][1] - throttle[0][1]  # throttle: one per 0.6 s over ~1.5 s
    assert 2 <= len(accepted) <= span / 0.6 + 1, (span, accepted)
    gaps = [b[1] - a[1] for a, b in itertools.pairwise(accepted)]
    assert min(gaps) >= 0.4, gaps  # (times taken before each call: slack for its latency)


@pytest.mark.slow
def test_keep_last_across_a_consumer_sigkill(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    slow = {"CO_STEP_S": "2"}
    [victim] = _consumers(spawn, rsync, ["victim"], **slow)
    first = asyncio.run(_race(redis_url, prefix, "latest", "k", 1, (0, 0)))
    wait_until(lambda: len(_runs(rsync, prefix, "k")) == 1, 30, what="the first run to start")
    spawn("all", name="survivor", app=APP, env=slow)  # a leader: it reaps the victim's claims
    time.sleep(1.0)
    later = asyncio.run(_race(redis_url, prefix, "latest", "k", 3, (0.05, 0.1), base=1))
    assert later[0][2] != first[0][2] and later[1][2] == later[0][2]  # one pending, replaced
    victim.kill()
    killed_at = time.time()
    wait_until(
        lambda: any(r.arg == 3 and r.end for r in _runs(rsync, prefix, "k")),
        60,
        what="the last enqueue's run after the SIGKILL",
    )
    runs = _runs(rsync, prefix, "k")
    _every_enqueue_gets_a_later_run([(i, at) for i, at, _ in later], runs)
    survivors = sorted((r for r in runs if r.start > killed_at), key=lambda r: r.start)
    for a, b in itertools.pairwise(survivors):  # one at a time after it, too
        assert a.end is not None and a.end <= b.start
    assert all(r.end is not None for r in survivors)


@pytest.mark.slow
def test_replace_debounce_and_throttle_across_a_consumer_sigkill(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    """A consumer SIGKILLed while a job of each mode's key runs: a later enqueue is a new job
    (the running one is no longer pending) and runs after it; the killed runs come back (at least
    once) and a throttled key's starts stay a period apart through it all."""
    prefix = spawn.prefix  # type: ignore[attr-defined]
    slow = {"CO_STEP_S": "1.5"}
    modes: dict[str, dict[str, Any]] = {
        "r": {"coalesce": "replace"},
        "d": {"coalesce": "debounce", "debounce_s": 0.1},
        "t": {"coalesce": "throttle", "throttle_s": 1.0},
    }

    def send(base: int) -> dict[str, list[tuple[int, float, str | None]]]:
        async def go() -> list[list[tuple[int, float, str | None]]]:
            return list(
                await asyncio.gather(
                    *(
                        _race(redis_url, prefix, "note", k, 1, (0, 0), base=base, flow_key=k, **o)
                        for k, o in modes.items()
                    )
                )
            )

        return dict(zip(modes, asyncio.run(go()), strict=True))

    [victim] = _consumers(spawn, rsync, ["victim"], **slow)
    first = send(0)
    wait_until(lambda: all(_runs(rsync, prefix, k) for k in modes), 30, what="a run of each key")
    spawn("all", name="survivor", app=APP, env=slow)  # a leader: it reaps the victim's claims
    time.sleep(1.1)  # the throttle period of the first enqueue is over
    later = send(1)
    for k in modes:  # the running job is not pending: a new job, never folded into it
        assert later[k][0][2] not in (None, first[k][0][2]), (k, later[k], first[k])
    victim.kill()
    wait_until(
        lambda: all(sum(1 for r in _runs(rsync, prefix, k) if r.end) >= 2 for k in modes),
        60,
        what="the later jobs and the killed runs again, each to its end",
    )
    for k in modes:
        runs = _runs(rsync, prefix, k)
        _every_enqueue_gets_a_later_run([(i, at) for i, at, _ in later[k]], runs)
        assert {r.job_id for r in runs if r.end} == {first[k][0][2], later[k][0][2]}
    starts = sorted(r.start for r in _runs(rsync, prefix, "t"))
    assert all(b - a >= 0.9 for a, b in itertools.pairwise(starts)), starts
