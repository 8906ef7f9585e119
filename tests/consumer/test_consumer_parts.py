"""The consumer's parts on their own, without its loop: the one-job :class:`Executor`, the
batched :class:`Completer` and the :class:`Fetcher`'s claim round, on fakeredis and the real
server; and the per-job rule that a feature costs nothing when it is not used (no hook step,
no tracing, no metric call for a plain task's run)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from harness.arqfmt import deserialize_result
from worker.app import App
from worker.client import Client
from worker.consumer.claims import Claims, Run
from worker.consumer.completer import Completer
from worker.consumer.config import ConsumerConfig
from worker.consumer.dead import DeadLetters
from worker.consumer.executor import Executor
from worker.consumer.fetch import Fetcher
from worker.consumer.limits import LimitsHook
from worker.consumer.wakeups import Wakeups
from worker.context import Context, JobContext
from worker.core.clock import SystemClock
from worker.core.jobdefs import JobHook
from worker.core.metrics import Metrics
from worker.core.serializer import job_payload, msgpack_dumps, msgpack_loads
from worker.duties.periodic import TickHook
from worker.duties.poller import InflightHook
from worker.settings import Settings
from worker.storage import keys as K
from worker.storage.claims import Claimed
from worker.storage.jobs import Finish
from worker.storage.sharded import Shards
from worker.storage.store import Store
from worker.sync import SyncThreads, SyncThreadsHook

KEYS = K.Keys("t:")
ME = "i-1"


class Parts:
    """One consumer's parts wired by hand (as ``Consumer.__init__`` does), loop left out."""

    def __init__(
        self, r: Any, app: App, hooks: list[JobHook] | None = None, metrics: Metrics | None = None
    ) -> None:
        clock = SystemClock()
        self.client = Client(r, keys=KEYS, serialize=msgpack_dumps, app=app)
        self.store: Store = self.client.store
        shards = Shards([self.store])
        self.config = ConsumerConfig(queues=tuple(app.queue_names()))
        hooks = [] if hooks is None else hooks
        self.claims = Claims(shards, clock, hooks, instance_id=ME, doubt_s=5.0, queues=("default",))
        self.totals = {"complete": 0, "failed": 0, "retried": 0, "lost": 0}
        self.completer = Completer(
            shards, clock, self.claims.running, self.claims.guard, self.totals, instance_id=ME
        )
        context = Context(Settings.model_construct(), r, self.client, clock, ME)
        dead = DeadLetters(self.store, clock, instance_id=ME, max_entries=100, keep_bytes=64)
        self.executor = Executor(
            app.jobs(), hooks, context, shards, (msgpack_dumps, msgpack_loads), clock,
            self.claims.guard, self.completer, instance_id=ME, config=self.config, dead=dead,
            metrics=metrics,
        )  # fmt: skip
        self.fetcher = Fetcher(
            shards, clock, self.claims, self.completer, self.executor, Wakeups(shards, clock),
            instance_id=ME, config=self.config, in_progress_ttl_ms=60_000,
        )  # fmt: skip

    async def claim(self) -> list[tuple[Claimed, Run]]:
        """Claim the due jobs as the fetcher would, none started."""
        got = await self.store.claim(
            ME,
            f"{ME}/1",
            now_ms=int(time.time() * 1000) + 1000,
            limit=10,
            in_progress_ttl_ms=60_000,
            holds_ttl_ms=60_000,
            max_payload=10_000,
            retry_ttl_ms=60_000,
        )
        return [(c, Run(c.job_id, f"{ME}/1")) for c in got.jobs]


def noop_app() -> App:
    app = App("t")

    @app.task
    async def noop(ctx: JobContext, x: int) -> int:
        return x + 1

    @app.task
    async def boom(ctx: JobContext) -> None:
        raise ValueError("nope")

    @app.task(max_concurrency=2)
    async def scarce(ctx: JobContext) -> None:
        return None

    return app


# -- the executor alone -------------------------------------------------------------------------


def claimed(job_id: str, fn: str, *args: Any, try_: int = 1, t: int = 1_700_000_000_000) -> Claimed:
    payload = job_payload(fn, args, {}, t, msgpack_dumps)
    return Claimed(job_id, t, try_, payload, len(payload))


async def test_the_executor_turns_a_run_into_one_end_for_the_completer(r: Any) -> None:
    parts = Parts(r, noop_app())
    await parts.executor.run(claimed("a", "noop", 41), Run("a", "tok-a"))
    [end] = parts.completer.ended
    assert (end.op, end.job_id, end.token, end.task, end.queue) == (
        "done",
        "a",
        "tok-a",
        "noop",
        "default",
    )
    assert end.result is not None
    info = deserialize_result(end.result, deserializer=msgpack_loads)  # arq's result record
    assert (info.success, info.result, info.function, list(info.args), info.job_try) == (
        True, 42, "noop", [41], 1,
    )  # fmt: skip
    assert parts.totals["complete"] == 1


async def test_the_executor_fails_sets_aside_and_gives_up_without_the_loop(r: Any) -> None:
    parts = Parts(r, noop_app())
    await parts.executor.run(claimed("b", "boom"), Run("b", "tok-b"))
    await parts.executor.run(claimed("c", "nobody"), Run("c", "tok-c"))  # unknown function
    await parts.executor.run(claimed("d", "noop", 1, try_=99), Run("d", "tok-d"))  # tries used
    ends = {f.job_id: f for f in parts.completer.ended}
    assert {j: f.op for j, f in ends.items()} == {"b": "failed", "c": "failed", "d": "failed"}
    assert b"ValueError" in (ends["b"].failure or b"")
    assert b"unknown function" in (ends["c"].failure or b"")
    assert b"retries exceeded" in (ends["d"].failure or b"")
    assert await r.zcard(KEYS.dead) == 2  # the unknown one and the one out of tries
    assert parts.totals["failed"] == 3


async def test_the_executors_metrics_are_counted_once_a_round(r: Any) -> None:
    metrics = Metrics()
    parts = Parts(r, noop_app(), metrics=metrics)
    for i in range(5):
        await parts.executor.run(claimed(f"j{i}", "noop", i), Run(f"j{i}", "t"))
    await parts.executor.run(claimed("x", "boom"), Run("x", "t"))
    sample = metrics.registry.get_sample_value
    assert sample("worker_jobs_total", {"task": "noop", "outcome": "success"}) is None  # noted
    assert parts.executor.figures is not None
    parts.executor.figures.apply()
    assert sample("worker_jobs_total", {"task": "noop", "outcome": "success"}) == 5
    assert sample("worker_jobs_total", {"task": "boom", "outcome": "failure"}) == 1
    assert sample("worker_job_duration_seconds_count", {"task": "noop"}) == 5
    assert sample("worker_job_duration_seconds_bucket", {"task": "noop", "le": "+Inf"}) == 5
    waited = {"queue": "default", "task": "noop"}
    assert sample("worker_job_wait_seconds_count", waited) == 5
    # due in 2023: every wait is over an hour, so only the +Inf bucket holds them
    assert sample("worker_job_wait_seconds_bucket", {**waited, "le": "3600.0"}) == 0
    assert sample("worker_job_wait_seconds_bucket", {**waited, "le": "+Inf"}) == 5
    parts.executor.figures.apply()  # nothing new: nothing counted twice
    assert sample("worker_jobs_total", {"task": "noop", "outcome": "success"}) == 5


# -- the completer alone ------------------------------------------------------------------------


async def test_the_completer_writes_a_rounds_ends_in_one_finish(r: Any) -> None:
    parts = Parts(r, noop_app())
    ids = [await parts.client.enqueue("noop", i) for i in range(3)]
    got = await parts.claim()
    assert sorted(c.job_id for c, _ in got) == sorted(str(j) for j in ids)
    for c, run in got:
        parts.completer.end(Finish("done", c.job_id, run.token, b"r", 60_000, task="noop"))
    parts.completer.end(Finish("done", "not-ours", "someone-else/9", b"r", 60_000, task="noop"))
    assert parts.completer.pending and len(parts.completer.ended) == 4
    await parts.completer.flush()
    assert not parts.completer.pending
    for j in ids:
        assert await r.get(K.ARQ_RESULT + str(j)) == b"r"
        assert await r.get(K.ARQ_IN_PROGRESS + str(j)) is None
    assert await r.zcard(KEYS.queue) == 0
    assert parts.totals["lost"] == 1  # the run whose claim was not ours wrote nothing
    assert await r.get(K.ARQ_RESULT + "not-ours") is None


async def test_ends_on_their_way_stay_known_and_a_cut_flush_sends_them_again(r: Any) -> None:
    """While a ``FINISH`` is in flight its runs' claims are still ours (a lost claim's give-back
    must not release them); a flush cut short (the drain bounds its last flushes with a
    timeout, which cancels it) keeps its ends and the next flush writes them."""
    parts = Parts(r, noop_app())
    ids = [str(await parts.client.enqueue("noop", i)) for i in range(2)]
    got = await parts.claim()
    for c, run in got:
        parts.completer.end(Finish("done", c.job_id, run.token, b"r", 60_000, task="noop"))
    shards, sent = parts.completer.store, asyncio.Event()
    real_finish = shards.finish

    async def stuck(*args: Any, **kwargs: Any) -> Any:
        sent.set()
        await asyncio.Event().wait()  # the reply never comes

    shards.finish = stuck  # type: ignore[method-assign]
    flush = asyncio.create_task(parts.completer.flush())
    await asyncio.wait_for(sent.wait(), 5)
    assert not parts.completer.ended and parts.completer.known() == set(ids)
    flush.cancel()
    await asyncio.gather(flush, return_exceptions=True)
    assert parts.completer.known() == set(ids) and parts.completer.pending
    shards.finish = real_finish  # type: ignore[method-assign]
    await parts.completer.flush()
    assert not parts.completer.pending
    assert [await r.get(K.ARQ_RESULT + j) for j in ids] == [b"r", b"r"]


# -- the fetcher alone --------------------------------------------------------------------------


async def test_the_fetcher_claims_a_round_and_starts_each_run(r: Any) -> None:
    parts = Parts(r, noop_app())
    assert await parts.fetcher.should_claim()  # the first round claims
    assert await parts.fetcher.claim_round() == 0
    assert not await parts.fetcher.should_claim()  # nothing queued: one look at the head
    ids = [await parts.client.enqueue("noop", i) for i in range(4)]
    assert await parts.fetcher.should_claim()
    assert await parts.fetcher.claim_round() == 4
    assert set(parts.claims.running) == {str(j) for j in ids}
    await asyncio.gather(*(run.task for run in parts.claims.running.values() if run.task))
    assert not parts.claims.running  # each run left the table when it ended
    assert sorted(f.job_id for f in parts.completer.ended) == sorted(str(j) for j in ids)
    await parts.completer.flush()
    assert await r.zcard(KEYS.queue) == 0 and parts.totals["complete"] == 4


# -- pay only when used -------------------------------------------------------------------------

#: The modules of the features a plain task's run does not use, with the default hooks and
#: tracing off: hooks (user hooks), tracing, limits, sync threads, periodic and poll items.
FEATURES = ("hooks.py", "tracing.py", "limits.py", "sync.py", "periodic.py", "poller.py")
WORKER_DIR = str(Path(__file__).resolve().parents[2] / "worker")


def default_hooks(store: Store) -> list[JobHook]:
    """The hooks the wiring registers for every consumer (``roles._consumer``) of an app with
    no periodic job, no poller, no user hook and tracing off."""
    clock = SystemClock()
    return [
        SyncThreadsHook(SyncThreads(), clock),
        LimitsHook(store, clock),
        TickHook(store, [], clock, instance_id=ME),
        InflightHook(store, {}, clock),
    ]


async def calls_into_features(parts: Parts, c: Claimed) -> set[str]:
    """Run ``c`` with a profile hook on: the feature modules any call of the run went into."""
    seen: set[str] = set()

    def spy(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            name = frame.f_code.co_filename
            if name.startswith(WORKER_DIR) and Path(name).name in FEATURES:
                seen.add(f"{Path(name).name}:{frame.f_code.co_name}")

    sys.setprofile(spy)
    try:
        await parts.executor.run(c, Run(c.job_id, "tok"))
    finally:
        sys.setprofile(None)
    return seen


async def test_a_plain_tasks_run_calls_no_feature_it_does_not_use(fake_arq: Any) -> None:
    """With the default hooks, no user hook and tracing off, a plain task's run calls nothing
    in the features' modules (no hook step, no span); a limited task's run does call its
    hook (the spy sees calls: the check is not vacuous)."""
    parts = Parts(fake_arq, noop_app())
    parts = Parts(fake_arq, noop_app(), hooks=default_hooks(parts.store), metrics=Metrics())
    assert await calls_into_features(parts, claimed("p", "noop", 1)) == set()
    assert [f.op for f in parts.completer.ended] == ["done"]
    limited = await calls_into_features(parts, claimed("q", "scarce"))
    assert "limits.py:admit" in limited and "limits.py:release" in limited


async def test_a_no_op_job_costs_about_five_redis_commands(redis_url: str) -> None:
    """The per-job cost on the server, counted by the real server's commandstats over one claim
    round and one ``FINISH`` of 100 no-op jobs: its marker, its try counter (one command on a
    first try), its payload's read, the marker's check and the result's write; the scripts'
    per-batch work shared by the 100 (``bench/RESULTS.md`` §17c: 5.2 a job)."""
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(redis_url)
    try:
        parts = Parts(r, noop_app())
        await parts.client.enqueue_many([("noop", (i,), {}) for i in range(100)])

        async def calls() -> int:
            stats = await r.info("commandstats")
            return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")

        before = await calls()
        assert await parts.fetcher.claim_round() == 100
        await asyncio.gather(*(run.task for run in parts.claims.running.values() if run.task))
        await parts.completer.flush()
        per_job = (await calls() - before) / 100
        assert parts.totals["complete"] == 100
        assert per_job <= 5.5, f"{per_job:.2f} Redis commands per no-op job"
    finally:
        await r.aclose()


# -- timeouts -----------------------------------------------------------------------------------


def _counting_timers(count: list[int]) -> Any:
    """A profile hook counting the event loop's ``call_at`` calls for a minute or more ahead
    (a job's timeout, not a sleep; uvloop's, in C, are all counted)."""

    def spy(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name == "call_at":
            count[0] += frame.f_locals.get("when", 0) > asyncio.get_running_loop().time() + 60
        elif event == "c_call" and getattr(arg, "__name__", "") == "call_at":
            count[0] += 1

    return spy


async def test_the_runs_of_a_batch_share_one_timeout_timer(r: Any) -> None:
    """Runs started together share one timer for their timeouts (a timer per run cost about a
    tenth of a no-op job's CPU); each is still cut at its own timeout (next test)."""
    parts = Parts(r, noop_app())
    timers = [0]
    sys.setprofile(_counting_timers(timers))
    try:
        await asyncio.gather(
            *(parts.executor.run(claimed(f"j{i}", "noop", i), Run(f"j{i}", "t")) for i in range(50))
        )
    finally:
        sys.setprofile(None)
    assert [f.op for f in parts.completer.ended] == ["done"] * 50
    assert 1 <= timers[0] <= 5  # one per 10 ms of starts (a loaded box spreads them): not 50


async def test_a_run_is_cut_at_its_timeout_and_the_others_of_its_batch_are_not(r: Any) -> None:
    """A run over its timeout ends a ``timeout`` failure; one that catches the cancellation
    and returns ends a success (as under ``asyncio.timeout``); the quick ones are untouched."""
    app = App("t")

    @app.task(timeout_s=0.2)
    async def slow(ctx: JobContext) -> None:
        await asyncio.sleep(10)

    @app.task(timeout_s=0.2)
    async def quick(ctx: JobContext) -> None:
        await asyncio.sleep(0.05)

    @app.task(timeout_s=0.2)
    async def stubborn(ctx: JobContext) -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return "kept"
        return "slept"

    parts = Parts(r, app)
    names = ("slow", "quick", "stubborn", "slow2")
    t0 = time.monotonic()
    await asyncio.gather(
        *(parts.executor.run(claimed(n, n.rstrip("2")), Run(n, "t")) for n in names)
    )
    took = time.monotonic() - t0
    ends = {f.job_id: f for f in parts.completer.ended}
    assert {n: ends[n].op for n in names} == {
        "slow": "failed", "quick": "done", "stubborn": "done", "slow2": "failed",
    }  # fmt: skip
    for n in ("slow", "slow2"):
        record = json.loads(ends[n].failure or b"{}")
        assert (record["status"], record["error_type"]) == ("timeout", "TimeoutError")
    kept = deserialize_result(ends["stubborn"].result or b"", deserializer=msgpack_loads)
    assert kept.result == "kept"
    assert 0.2 <= took < 3.0  # cut at 0.2 s (at most 10 ms late; a loaded box adds more)
