"""The way in for arq's users (:mod:`worker.arqcompat`): an unchanged arq ``WorkerSettings``
class runs on the framework (``python -m worker --arq-settings module:WorkerSettings``).

The real-process test runs arq's README demo (harness/apps/arq_demo.py, with a cron job every
second) as three ``--role all`` processes and enqueues with a real arq client: every cron tick
runs once, every job once, each process opens and closes its session. The unit tests pin the
mapping (functions, ``arq.func`` options, cron fields, hooks, settings, the Redis URL) and the
refusals (one line naming the option). They need arq (``pip install 'fenced-worker[arq]'``):
without it they skip, except where ``WORKER_REQUIRE_ARQ=1`` (CI's arq environment).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import signal
import time
import warnings
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis as redis_sync

from harness import ROOT, CliRun, WorkerProc
from harness.arqfmt import require_arq
from harness.docpages import python_block
from harness.procs import repo_env
from harness.timings import FAST_ENV
from worker import App, ConfigError, JobOutcome, from_arq
from worker.arqcompat import arq_environ, redis_url
from worker.core.ids import JobIds
from worker.manifest import describe, manifest
from worker.testing import Harness

require_arq(module_level=True)
from arq import create_pool, cron, func  # noqa: E402 (arq only once it is known to be there)
from arq.connections import RedisSettings  # noqa: E402

SPEC = "harness.apps.arq_demo:WorkerSettings"


def _ticks(r: redis_sync.Redis) -> dict[int, int]:
    ids = JobIds("arq:")
    out = {}
    for job_id, n in r.hgetall("arqdemo:ticks").items():
        parsed = ids.parse_periodic(job_id.decode())
        assert parsed is not None and parsed[0] == "cron.heartbeat", job_id
        out[parsed[1]] = int(n)
    return out


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_arq_demo_runs_unchanged_on_three_processes(
    redis_url: str, rsync: redis_sync.Redis, tmp_path: Path
) -> None:
    env = repo_env(**FAST_ENV, WORKER_REDIS_URL=redis_url, PYTHONUNBUFFERED="1")
    procs = [
        WorkerProc(
            ["--role", "all", "--arq-settings", SPEC, "--instance-name", f"arq-{i}"],
            env,
            tmp_path / f"arq-{i}.log",
            f"arq-{i}",
        )
        for i in range(3)
    ]
    pool = await create_pool(RedisSettings.from_dsn(redis_url))
    try:
        deadline = time.monotonic() + 20
        while int(rsync.hget("arqdemo:sessions", "opened") or 0) < 3:
            assert time.monotonic() < deadline, [p.log()[-2000:] for p in procs]
            assert all(p.alive() for p in procs), [p.log()[-2000:] for p in procs]
            await asyncio.sleep(0.1)
        # a job as arq's own worker enqueues for its cron (an old arq worker beside these)
        arq_tick = await pool.enqueue_job("cron:heartbeat", _job_id="cron:heartbeat:1")
        assert arq_tick is not None and await arq_tick.result(timeout=15, poll_delay=0.1) is None
        assert rsync.hget("arqdemo:ticks", "cron:heartbeat:1") == b"1"  # it ran, once
        rsync.hdel("arqdemo:ticks", "cron:heartbeat:1")
        urls = [f"https://example.com/{i}" for i in range(12)]
        jobs = [await pool.enqueue_job("download_content", u) for u in urls]
        assert all(j is not None for j in jobs)
        # arq's client reads the results the framework wrote (pickle, arq's own format)
        results = [await j.result(timeout=15, poll_delay=0.1) for j in jobs if j is not None]
        assert results == [len(f"<html>{u}</html>") for u in urls]
        while len(_ticks(rsync)) < 5:  # at least five ticks while all three run
            assert time.monotonic() < deadline + 10, [p.log()[-2000:] for p in procs]
            await asyncio.sleep(0.2)
        for p in procs:
            p.signal(signal.SIGTERM)
        codes = [p.proc.wait(30) for p in procs]
        assert codes == [0, 0, 0], [p.log()[-2000:] for p in procs]
    finally:
        await pool.aclose()
        for p in procs:
            p.close()
    downloads = {k.decode(): int(v) for k, v in rsync.hgetall("arqdemo:downloads").items()}
    assert downloads == dict.fromkeys(urls, 1)  # every job once
    ticks = _ticks(rsync)
    assert set(ticks.values()) == {1}, ticks  # no tick twice
    seconds = sorted(ticks)
    assert seconds == list(range(seconds[0], seconds[-1] + 1, 1000)), seconds  # none missing
    sessions = {k.decode(): int(v) for k, v in rsync.hgetall("arqdemo:sessions").items()}
    assert sessions == {"opened": 3, "closed": 3}


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_side_by_side_with_an_arq_worker(
    redis_url: str, rsync: redis_sync.Redis, tmp_path: Path
) -> None:
    """The rollout (docs/moving-from-arq.md): arq's own Worker, with its cron job, and a
    framework consumer on one queue. While ours is frozen arq runs the jobs; with both running
    every job runs once, whoever takes it (the consumer also runs the ``cron:heartbeat`` jobs
    arq's worker enqueues); once arq's worker is gone (the switch) ours runs the rest."""
    from arq.worker import Worker

    from harness.apps.arq_demo import WorkerSettings

    env = repo_env(**FAST_ENV, WORKER_REDIS_URL=redis_url, PYTHONUNBUFFERED="1")
    args = ["--role", "consumer", "--arq-settings", SPEC, "--instance-name", "new"]
    ours = WorkerProc(args, env, tmp_path / "new.log", "new")
    settings = {k: v for k, v in vars(WorkerSettings).items() if not k.startswith("_")}
    arq_worker = Worker(
        **settings, redis_settings=RedisSettings.from_dsn(redis_url), handle_signals=False,
        poll_delay=0.2,
    )  # fmt: skip
    running = asyncio.create_task(arq_worker.async_run())
    pool = await create_pool(RedisSettings.from_dsn(redis_url))
    urls = [f"https://example.com/side/{i}" for i in range(60)]

    async def run(batch: list[str]) -> None:
        jobs = [await pool.enqueue_job("download_content", u) for u in batch]
        results = [await j.result(timeout=15, poll_delay=0.1) for j in jobs if j is not None]
        assert len(results) == len(batch)

    arq_closed = False
    try:
        deadline = time.monotonic() + 20
        while int(rsync.hget("arqdemo:sessions", "opened") or 0) < 2:  # both started
            assert time.monotonic() < deadline and ours.alive(), ours.log()[-2000:]
            await asyncio.sleep(0.1)
        ours.pause()  # the old workers alone
        try:
            await run(urls[:20])
        finally:
            ours.resume()
        by_arq_alone = arq_worker.jobs_complete
        await run(urls[20:40])  # side by side
        while len(rsync.hkeys("arqdemo:ticks")) < 4:  # arq's cron, ticking
            assert time.monotonic() < deadline + 10, ours.log()[-2000:]
            await asyncio.sleep(0.2)
        with warnings.catch_warnings():  # arq 0.26-0.28 call redis-py's deprecated close()
            warnings.simplefilter("ignore", DeprecationWarning)
            await arq_worker.close()
        arq_closed = True
        running.cancel()
        by_arq = arq_worker.jobs_complete
        await run(urls[40:])  # the switch: ours alone
    finally:
        if not arq_closed:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                await arq_worker.close()
        running.cancel()
        await pool.aclose()
        ours.terminate()
        ours.close()
    downloads = {k.decode(): int(v) for k, v in rsync.hgetall("arqdemo:downloads").items()}
    assert downloads == dict.fromkeys(urls, 1)
    ticks = {k.decode(): int(v) for k, v in rsync.hgetall("arqdemo:ticks").items()}
    assert set(ticks.values()) == {1} and all(k.startswith("cron:heartbeat:") for k in ticks)
    assert by_arq_alone >= 20 and by_arq == arq_worker.jobs_complete, (by_arq_alone, by_arq)


# -- the mapping -------------------------------------------------------------------------------
async def _noop(ctx: dict[str, Any]) -> None:
    return None


async def _job(ctx: dict[str, Any], x: int) -> int:
    return x + ctx["offset"]


def test_functions_and_their_arq_options_become_tasks() -> None:
    class S:
        functions = [_job, func(_noop, name="named", timeout=7, max_tries=2, keep_result=9)]  # noqa: RUF012

    app = from_arq(S)
    assert isinstance(app, App)
    assert app.tasks["_job"].timeout_s is None
    named = app.tasks["named"]
    assert (named.timeout_s, named.max_tries, named.keep_result_s) == (7, 2, 9)


def test_cron_fields_become_a_schedule_with_seconds() -> None:
    class S:
        cron_jobs = [  # noqa: RUF012
            cron(_noop, name="reports", weekday="mon", hour={9, 18}, minute=12, second={0, 30}),
            cron(_noop, weekday={0, 6}, hour=3, minute=0),
        ]
        timezone = ZoneInfo("Europe/Paris")

    app = from_arq(S)
    reports = app.periodics["reports"].schedule
    assert reports.describe() == "cron '12 9,18 * * 1' second 0,30 Europe/Paris"
    monday = dt.datetime(2026, 12, 7, 9, 12, 0, tzinfo=ZoneInfo("Europe/Paris"))
    start = int(monday.timestamp() * 1000)
    assert reports.ticks(start - 1, start + 60_000, 10) == [start, start + 30_000]
    # arq counts Monday 0 and Sunday 6; cron Sunday 0
    assert (
        app.periodics["cron._noop"].schedule.describe()
        == "cron '0 3 * * 0,1' second 0 Europe/Paris"
    )


def test_the_manifest_keeps_the_seconds() -> None:
    """``status`` and ``doctor`` read the schedule from the manifest in Redis."""
    from harness.apps.arq_demo import WorkerSettings

    app = from_arq(WorkerSettings)
    described = describe(manifest(app, written_ms=0)).app
    schedule = described.periodics["cron.heartbeat"].schedule
    assert schedule.describe() == "cron '* * * * *' second * UTC"
    assert schedule.next(10_000) == 11_000


def test_settings_become_worker_settings() -> None:
    class S:
        functions = [_noop]  # noqa: RUF012
        queue_name = "shop:queue"
        max_jobs = 25
        job_timeout = dt.timedelta(minutes=2)
        keep_result = 60
        max_tries = 3
        redis_settings = RedisSettings(host="db", port=6380, database=2, password="p@ss", ssl=True)
        poll_delay = 2  # ignored: consumers are woken

    assert arq_environ(S) == {
        "WORKER_KEY_PREFIX": "shop:",
        "WORKER_SERIALIZER": "pickle",
        "WORKER_REDIS_URL": "rediss://:p%40ss@db:6380/2",
        "WORKER_CONCURRENCY": "25",
        "WORKER_JOB_TIMEOUT_S": "120",
        "WORKER_KEEP_RESULT_S": "60",
        "WORKER_MAX_TRIES": "3",
    }


def test_redis_settings_urls() -> None:
    assert redis_url(RedisSettings()) == "redis://localhost:6379/0"
    assert redis_url(RedisSettings(username="u", password="pw")) == "redis://u:pw@localhost:6379/0"
    sentinels = RedisSettings(host=[("s1", 26379), ("s2", 26380)], sentinel=True)
    assert redis_url(sentinels) == "redis+sentinel://s1:26379,s2:26380/mymaster/0"
    with pytest.raises(ConfigError, match="ssl_ca_certs"):
        redis_url(RedisSettings(ssl=True, ssl_ca_certs="/ca.pem"))


def test_a_named_arq_queue_is_a_queue_of_the_prefix() -> None:
    class S:
        functions = [_noop]  # noqa: RUF012
        queue_name = "arq:queue:emails"

    assert arq_environ(S)["WORKER_KEY_PREFIX"] == "arq:"
    assert arq_environ(S)["WORKER_CONCURRENCY"] == "10"  # arq's default max_jobs
    app = from_arq(S)
    assert app.queue_names() == ["emails"] and app.tasks["_noop"].queue == "emails"


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("job_serializer", staticmethod(lambda o: b"")),
        ("allow_abort_jobs", True),
        ("health_check_key", "my:health"),
        ("keep_result_forever", True),
        ("retry_jobs", False),
        ("expires_extra_ms", 1000),
        ("queue_name", "jobs"),
    ],
)
def test_unsupported_options_are_refused_naming_them(option: str, value: Any) -> None:
    s = type("S", (), {"functions": [_noop], option: value})
    with pytest.raises(ConfigError, match=option) as caught:
        from_arq(s)
        arq_environ(s)
    assert "\n" not in str(caught.value)


def test_what_arq_ignores_is_ignored() -> None:
    """arq's Worker reads the class's own attributes that are Worker options, nothing else."""

    class Base:
        allow_abort_jobs = True  # inherited: arq does not read it

    class S(Base):
        functions = [_noop]  # noqa: RUF012
        helper_constant = 3  # not a Worker option

    assert from_arq(S).tasks.keys() == {"_noop"}


def test_unsupported_cron_options_are_refused() -> None:
    for job, what in (
        (cron(_noop, run_at_startup=True), "run_at_startup"),
        (cron(_noop, job_id="fixed"), "job_id"),
    ):
        with pytest.raises(ConfigError, match=what):
            from_arq(type("S", (), {"cron_jobs": [job]}))


async def test_hooks_get_arq_ctx_and_jobs_see_what_startup_stored() -> None:
    seen: list[str] = []

    async def startup(ctx: dict[str, Any]) -> None:
        ctx["offset"] = 100
        seen.append("redis" if "redis" in ctx else "no redis")

    async def job_start(ctx: dict[str, Any]) -> None:
        seen.append(f"start {ctx['job_id']} {ctx['offset']}")

    async def job_end(ctx: dict[str, Any]) -> None:
        seen.append(f"end {ctx['job_id']}")

    class S:
        functions = [_job]  # noqa: RUF012
        on_startup = startup
        on_job_start = job_start
        on_job_end = job_end
        ctx = {"base": 1}  # noqa: RUF012

    app = from_arq(S)
    async with Harness(app) as h:
        ctx = h.job_context(job_id="j1")
        for hook in app.job_start_hooks:
            await hook(ctx)
        assert await app.tasks["_job"].fn(ctx, 1) == 101
        for end in app.job_end_hooks:
            await end(ctx, JobOutcome("success", "_job", "j1", 1, 0.0))
        assert h.context.state["base"] == 1
    assert seen == ["redis", "start j1 100", "end j1"]


def test_the_cli_refuses_in_one_line(cli: CliRun, tmp_path: Path) -> None:
    (tmp_path / "badarq.py").write_text(
        "async def f(ctx): ...\n"
        "class WorkerSettings:\n    functions = [f]\n    allow_abort_jobs = True\n"
    )
    out = cli("plan", "--arq-settings", "badarq:WorkerSettings",
              env={"PYTHONPATH": f"{ROOT}:{tmp_path}"})  # fmt: skip
    assert out.returncode == 2, out
    assert out.stderr.strip().count("\n") == 0 and "allow_abort_jobs" in out.stderr, out.stderr
    ok = cli("plan", "--arq-settings", SPEC)
    assert ok.returncode == 0 and f"app: {SPEC}" in ok.stdout and "periodic" in ok.stdout, ok


def test_the_class_gives_defaults_and_the_environment_wins(
    cli: CliRun, tmp_path: Path, redis_url: str
) -> None:
    (tmp_path / "shoparq.py").write_text(
        "from arq.connections import RedisSettings\n"
        "async def f(ctx): ...\n"
        "class WorkerSettings:\n    functions = [f]\n    queue_name = 'shop:queue'\n"
        "    redis_settings = RedisSettings(host='127.0.0.1', port=1)\n"
    )
    path = {"PYTHONPATH": f"{ROOT}:{tmp_path}"}
    spec = "shoparq:WorkerSettings"
    refused = cli("status", "--arq-settings", spec, env=path)
    assert refused.returncode == 2 and "127.0.0.1:1" in refused.stderr, refused  # the class's
    ok = cli("status", "--arq-settings", spec, env={**path, "WORKER_REDIS_URL": redis_url})
    assert ok.returncode == 0 and "key prefix 'shop:'" in ok.stdout + ok.stderr, ok


def test_the_moving_from_arq_example_runs() -> None:
    code = python_block("moving-from-arq", "Run it as it is")
    scope: dict[str, Any] = {"__name__": "moving_from_arq"}
    exec(compile(code, "docs/moving-from-arq.md", "exec"), scope)
    app = scope["app"]
    assert isinstance(app, App) and "download_content" in app.tasks
    assert app.periodics["cron.report"].schedule.describe() == "cron '0 9,18 * * *' second 0 UTC"
    assert arq_environ(scope["WorkerSettings"])["WORKER_CONCURRENCY"] == "20"
