"""Per-task throughput, failures and run times: FINISH counts each finished run of a task the
app defines (once, only while its claim holds), ``Store.task_stats`` reads the last hour back,
and a real consumer fills them as it runs jobs."""

from __future__ import annotations

import math
from typing import Any

from harness.probes import hold_running
from worker.storage import keys as K
from worker.storage.jobs import Finish
from worker.storage.operators import TaskStats
from worker.storage.store import Store

KEYS = K.Keys("t:")
T = 1_700_000_000_000  # 22:13:20Z
MIN = 60_000


async def test_finish_counts_runs_per_task_minute_and_run_time(r: Any) -> None:
    store = Store(r, KEYS)
    await hold_running(r, KEYS, T, "a1", "a2", "a3", "b1", "x1", "r1")
    await r.set(K.ARQ_IN_PROGRESS + "a3", "someone-else/1")  # taken over: not counted
    runs = [
        Finish("done", "a1", "me/1", task="send", run_ms=8),
        Finish("done", "a2", "me/1", task="send", run_ms=400),
        Finish("done", "a3", "me/1", task="send", run_ms=5),
        Finish("failed", "b1", "me/1", task="send", run_ms=70_000),
        Finish("failed", "x1", "me/1"),  # not a task of the app (a bad record): not per task
        Finish("retry", "r1", "me/1", task="send", run_ms=3),  # runs again: not counted
    ]
    out = await store.finish("me", runs, now_ms=T)
    assert (out.done, out.retried, out.refused) == (4, 1, 1)
    # sent again (a lost reply): the claims are gone now, nothing is counted twice
    await store.finish("me", runs[:4], now_ms=T, resend=True)

    stats = await store.task_stats(["send", "other"], T + 30_000)
    send = stats["send"]
    assert len(send.series) == 60 and send.series[-1] == (T // MIN * MIN, 2, 1)
    assert sum(d for _, d, _ in send.series) == 2 and sum(f for _, _, f in send.series) == 1
    assert send.timed == 3 and send.run_ms == 8 + 400 + 70_000
    assert send.quantile_ms(0.5) == 500.0  # 8 ms, 400 ms, 70 s: the middle run is <= 500 ms
    assert send.quantile_ms(0.95) == 300_000.0
    assert send.mean_ms() == (8 + 400 + 70_000) / 3
    empty = stats["other"]
    assert empty.timed == 0 and empty.quantile_ms(0.5) is None and empty.mean_ms() is None
    fields = {k.decode() for k in await r.hkeys(KEYS.task_stats(T // 3_600_000))}
    assert not any(":x1" in f or f.endswith(":") for f in fields)  # no field for a non-task
    assert 0 < await r.pttl(KEYS.task_stats(T // 3_600_000)) <= K.STATS_TTL_MS


async def test_the_last_hour_only_and_foreign_fields_ignored(r: Any) -> None:
    store = Store(r, KEYS)
    await hold_running(r, KEYS, T, "old", "new")
    await store.finish("me", [Finish("done", "old", "me/1", task="t", run_ms=1)], now_ms=T)
    later = T + 80 * MIN  # the next hour; "old" is 80 minutes back: out of the window
    await store.finish("me", [Finish("failed", "new", "me/1", task="t", run_ms=20)], now_ms=later)
    hour = later // 3_600_000
    await r.hset(KEYS.task_stats(hour), mapping={"junk": "1", f"{later // MIN}:t:d": "many"})
    (t,) = (await store.task_stats(["t"], later)).values()
    assert sum(d for _, d, _ in t.series) == 0 and sum(f for _, _, f in t.series) == 1
    assert t.timed == 1 and t.quantile_ms(0.5) == 50.0


def test_a_run_longer_than_every_bucket() -> None:
    buckets = [0] * len(K.TASK_BUCKETS_MS) + [1]
    assert TaskStats([], buckets, 900_000).quantile_ms(0.5) == math.inf
