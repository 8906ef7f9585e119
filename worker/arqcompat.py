"""The way in for arq's users: an unchanged arq ``WorkerSettings`` class as an :class:`App`.

``python -m worker --arq-settings module:WorkerSettings`` (or ``worker.from_arq(WorkerSettings)``
for the :class:`App` alone) runs what arq's ``Worker`` would: ``functions`` (plain coroutines and
``arq.func(...)``), ``cron_jobs`` (``arq.cron(...)``, which become fenced periodic jobs: once per
tick cluster-wide), the four hooks, and the worker options that have a counterpart here
(:func:`arq_environ`). An option without one is refused at start with one line naming it
(:class:`ConfigError`, exit 2), or ignored where it is harmless; docs/moving-from-arq.md has the
table. The only module that knows arq's settings; arq itself is never imported here (an arq
``Function`` or ``CronJob`` is read by its attributes).
"""

from __future__ import annotations

import datetime as dt
import functools
import importlib
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import quote

from worker.app import App, _check_name, _job_fn, load_app
from worker.context import Context, JobContext
from worker.core.errors import ConfigError
from worker.core.jobdefs import JobDef, JobOutcome
from worker.core.schedule import Cron
from worker.duties.periodic import PeriodicDef
from worker.storage.keys import DEFAULT_QUEUE

#: arq's options that become this framework's settings (``WORKER_*``), by :func:`arq_environ`.
TO_SETTINGS = (
    "queue_name",
    "redis_settings",
    "max_jobs",
    "job_timeout",
    "keep_result",
    "max_tries",
)
#: Options read by :func:`from_arq` itself.
TO_APP = ("functions", "cron_jobs", "on_startup", "on_shutdown", "on_job_start", "on_job_end",
          "after_job_end", "ctx", "timezone")  # fmt: skip
#: Options ignored, with the reason (harmless here: the framework does it its own way).
IGNORED = {
    "poll_delay": "consumers wake on announcements (WORKER_POLL_DELAY_S)",
    "queue_read_limit": "consumers claim in bounded batches",
    "health_check_interval": "probes: /healthz, /readyz, python -m worker health",
    "handle_signals": "the process handles SIGTERM and SIGINT (drain)",
    "job_completion_wait": "shutdown drains in-flight jobs (WORKER_SHUTDOWN_TIMEOUT_S)",
    "burst": "use --burst",
    "max_burst_jobs": "use --burst",
    "log_results": "jobs are logged by the framework",
}
#: Options refused unless at arq's default, with the reason.
REFUSED: dict[str, tuple[Any, str]] = {
    "job_serializer": (None, "arq's default (pickle) is used; a custom serializer is not"),
    "job_deserializer": (None, "arq's default (pickle) is used; a custom serializer is not"),
    "keep_result_forever": (False, "results are kept at most a week (keep_result)"),
    "health_check_key": (None, "no health-check key is written: probe /healthz instead"),
    "allow_abort_jobs": (
        False,
        "arq's Job.abort() is not read: use python -m worker job ID --cancel or Client.abort",
    ),
    "retry_jobs": (True, "Retry and cancelled jobs always run again while tries remain"),
    "expires_extra_ms": (86_400_000, "jobs do not expire unstarted"),
    "redis_pool": (None, "give redis_settings (or WORKER_REDIS_URL)"),
}
_ARQ_DEFAULT_QUEUE = "arq:queue"
_WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def options(settings: object) -> dict[str, Any]:
    """The options of an arq settings class (or dict), as arq's ``Worker`` gets them: the
    class's own attributes (not inherited ones) that are ``Worker`` options; arq ignores any
    other, and so does this."""
    d = settings if isinstance(settings, Mapping) else vars(settings)
    known = {*TO_SETTINGS, *TO_APP, *IGNORED, *REFUSED}
    return {k: v for k, v in d.items() if k in known}


def load_class(spec: str) -> object:
    """Import ``package.module:WorkerSettings``; :class:`ConfigError` (one line) if it cannot
    be imported or does not look like arq settings."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"--arq-settings: {spec!r} is not of the form package.module:Class")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise ConfigError(f"--arq-settings: cannot import {spec!r}: {reason}") from None
    if not is_arq_settings(obj):
        raise ConfigError(f"--arq-settings: {spec!r} names no functions nor cron_jobs")
    return obj


def load(spec: str) -> App:
    """The :class:`App` ``spec`` (``package.module:attribute``) names: an arq settings class
    made one by :func:`from_arq`, anything else as :func:`worker.app.load_app` loads it."""
    module_name, _, attr = spec.partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attr, None) if attr else None
    except Exception:  # load_app says why, in one line
        obj = None
    if is_arq_settings(obj):
        app = from_arq(obj)
        app.validate()
        return app
    return load_app(spec)


def is_arq_settings(obj: object) -> bool:
    """``obj`` looks like an arq ``WorkerSettings`` class (it names ``functions`` or
    ``cron_jobs``) rather than an :class:`App`."""
    return isinstance(obj, type) and any(hasattr(obj, a) for a in ("functions", "cron_jobs"))


def check(opts: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` (one line, naming it) for an option that cannot be honoured."""
    for name, value in opts.items():
        if name in TO_SETTINGS or name in TO_APP or name in IGNORED:
            continue
        default, why = REFUSED[name]
        if value != default:
            raise ConfigError(f"arq setting {name}={value!r} is not supported: {why}")


def from_arq(settings: object, *, name: str = "arq") -> App:
    """An :class:`App` running an arq ``WorkerSettings`` class (or dict) unchanged.

    ``functions`` become tasks (``arq.func`` options: name, timeout, max_tries, keep_result);
    ``cron_jobs`` become periodic jobs (arq's month/day/weekday/hour/minute/second fields, in
    ``timezone`` or UTC; catch-up ``all``); ``on_startup``/``on_shutdown`` get arq's ctx dict
    (``ctx["redis"]`` and whatever the startup hook stores, which every job's ``ctx`` then
    holds); ``on_job_start``/``on_job_end``/``after_job_end`` get the job's ctx. The worker
    options (queue, Redis, limits) are settings: :func:`arq_environ`. :class:`ConfigError` for
    an option that cannot be honoured."""
    opts = options(settings)
    check(opts)
    queue = queue_of(opts.get("queue_name") or _ARQ_DEFAULT_QUEUE)[1]
    app = App(name, queues=None if queue == DEFAULT_QUEUE else (queue,))
    base = dict(opts.get("ctx") or {})
    for f in opts.get("functions") or ():
        job = _task(f, queue)
        app._unique_name(job.name)
        app.tasks[job.name] = job
    tz = _tz_name(opts.get("timezone"))
    for c in opts.get("cron_jobs") or ():
        p = _periodic(c, tz, queue)
        app._unique_name(p.name)
        app.periodics[p.name] = p
        # the jobs arq's own workers enqueue for it ("cron:fn"), run here too while both run
        if c.name != p.name:
            app.tasks.setdefault(c.name, JobDef(c.name, p.fn, p.timeout_s, queue=queue))
    _hooks(app, opts, base)
    return app


def queue_of(queue_name: str) -> tuple[str, str]:
    """``(key prefix, queue)`` for arq's ``queue_name``: ``<prefix>queue`` is the framework's
    ``default`` queue of that prefix (``arq:queue``: prefix ``arq:``), ``<prefix>queue:<name>``
    its queue ``name``."""
    head, sep, tail = queue_name.rpartition("queue:")
    if sep and head and tail:
        return head, _check_name("queue", tail)
    if queue_name.endswith("queue") and len(queue_name) > len("queue"):
        return queue_name.removesuffix("queue"), DEFAULT_QUEUE
    raise ConfigError(
        f"arq setting queue_name={queue_name!r} is not supported: the framework's queue keys "
        "are <prefix>queue and <prefix>queue:<name> (arq's default is 'arq:queue')"
    )


def arq_environ(settings: object) -> dict[str, str]:
    """The ``WORKER_*`` settings an arq settings class implies (``queue_name`` → the key
    prefix, ``redis_settings`` → the URL, ``max_jobs`` → concurrency, ``job_timeout``,
    ``keep_result``, ``max_tries``; arq's pickle serializer, and arq's ``max_jobs`` of 10 when
    the class sets none). Used as defaults: a variable already set wins."""
    opts = options(settings)
    check(opts)
    env = {
        "WORKER_KEY_PREFIX": queue_of(opts.get("queue_name") or _ARQ_DEFAULT_QUEUE)[0],
        "WORKER_SERIALIZER": "pickle",
        "WORKER_CONCURRENCY": "10",  # arq's max_jobs default (the framework's is 100)
    }
    if opts.get("redis_settings") is not None:
        env["WORKER_REDIS_URL"] = redis_url(opts["redis_settings"])
    pairs = (("max_jobs", "CONCURRENCY"), ("job_timeout", "JOB_TIMEOUT_S"),
             ("keep_result", "KEEP_RESULT_S"), ("max_tries", "MAX_TRIES"))  # fmt: skip
    for arq_name, ours in pairs:
        if opts.get(arq_name) is not None:
            env[f"WORKER_{ours}"] = _number(opts[arq_name])
    return env


def redis_url(rs: Any) -> str:
    """A redis URL for arq's ``RedisSettings`` (host, port, database, username, password, ssl,
    unix socket, sentinel); its TLS file options are refused (``WORKER_REDIS_URL`` then)."""
    for attr, default in (("ssl_keyfile", None), ("ssl_certfile", None), ("ssl_ca_certs", None),
                          ("ssl_ca_data", None), ("ssl_cert_reqs", "required")):  # fmt: skip
        if getattr(rs, attr, default) != default:
            raise ConfigError(
                f"arq redis_settings.{attr} is not supported: set WORKER_REDIS_URL (TLS "
                "options as URL parameters, docs/configuration.md)"
            )
    user, password = getattr(rs, "username", None), getattr(rs, "password", None)
    auth = ""
    if password is not None or user is not None:
        auth = quote(user or "", safe="") + (f":{quote(password, safe='')}" if password else "")
        auth += "@"
    db = int(getattr(rs, "database", 0) or 0)
    if getattr(rs, "unix_socket_path", None):
        return f"unix://{auth}{rs.unix_socket_path}?db={db}"
    scheme = "rediss" if getattr(rs, "ssl", False) else "redis"
    host = rs.host
    if getattr(rs, "sentinel", False):
        nodes = ",".join(f"{h}:{p}" for h, p in host) if isinstance(host, list) else host
        return f"{scheme}+sentinel://{auth}{nodes}/{rs.sentinel_master}/{db}"
    if isinstance(host, list):
        raise ConfigError("arq redis_settings.host is a list without sentinel=True")
    return f"{scheme}://{auth}{host}:{int(rs.port)}/{db}"


def _number(value: Any) -> str:
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else value
    return f"{seconds:g}" if isinstance(seconds, float) else str(int(seconds))


def _seconds(value: Any) -> float | None:
    return value.total_seconds() if isinstance(value, dt.timedelta) else value


def _with_state(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """``fn`` called with a job ctx that also holds what the startup hook stored in arq's ctx
    (arq copies its worker ctx into every job's): paid only by arq apps."""

    @functools.wraps(fn)
    async def run(ctx: JobContext, *args: Any, **kwargs: Any) -> Any:
        for k, v in ctx.state.items():
            ctx.setdefault(k, v)
        return await fn(ctx, *args, **kwargs)

    return run


def _task(f: Any, queue: str) -> JobDef:
    """A task for an entry of ``functions``: a coroutine function or an ``arq.func(...)``."""
    coroutine = getattr(f, "coroutine", None)
    if coroutine is None:  # a plain coroutine function
        if not callable(f):
            raise ConfigError(f"arq functions: {f!r} is neither a function nor arq.func(...)")
        n = _check_name("task", getattr(f, "__qualname__", getattr(f, "__name__", "")))
        return JobDef(n, _with_state(_job_fn("task", f)), queue=queue)
    if getattr(f, "keep_result_forever", None):
        raise ConfigError(f"arq func {f.name!r}: keep_result_forever is not supported")
    return JobDef(
        _check_name("task", f.name),
        _with_state(_job_fn("task", coroutine)),
        timeout_s=f.timeout_s,
        max_tries=f.max_tries,
        keep_result_s=f.keep_result_s,
        queue=queue,
    )


def _field(value: Any, name: str, weekday: bool = False) -> str:
    """arq's cron field (``None``, an int, a set; weekday also ``"mon"``…) as a cron field
    (weekday: arq counts Monday 0, cron Sunday 0)."""
    if value is None:
        return "*"
    values = sorted(value) if isinstance(value, set | frozenset | list | tuple) else [value]
    out = []
    for v in values:
        if weekday:
            i = _WEEKDAYS.index(v.lower()) if isinstance(v, str) else v
            v = (int(i) + 1) % 7
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"arq cron {name}={value!r}: use ints (or weekday names)")
        out.append(str(v))
    unique = sorted(set(out), key=int)
    every = {"second": 60, "minute": 60, "hour": 24}.get(name)
    return (
        "*" if every is not None and unique == [str(i) for i in range(every)] else ",".join(unique)
    )


def _periodic(c: Any, tz: str, queue: str) -> PeriodicDef:
    """A periodic job for an ``arq.cron(...)``."""
    n = _check_name("arq cron", c.name.replace(":", "."))  # arq's "cron:fn" is "cron.fn"
    if getattr(c, "run_at_startup", False):
        raise ConfigError(f"arq cron {n!r}: run_at_startup is not supported (python -m worker "
                          "trigger runs a tick now)")  # fmt: skip
    if getattr(c, "job_id", None) is not None:
        raise ConfigError(f"arq cron {n!r}: job_id is not supported (each tick has its own id)")
    expr = " ".join(
        _field(getattr(c, a), a, weekday=a == "weekday")
        for a in ("minute", "hour", "day", "month", "weekday")
    )
    schedule = Cron(expr, tz, seconds=_field(c.second, "second"))
    return PeriodicDef(n, _with_state(_job_fn("arq cron", c.coroutine)), schedule,
                       timeout_s=_seconds(c.timeout_s), queue=queue)  # fmt: skip


def _tz_name(tz: Any) -> str:
    """arq's ``timezone`` (a ``ZoneInfo`` or ``datetime.timezone``) as a zone name."""
    if tz is None:
        return "UTC"
    key = getattr(tz, "key", None)
    if isinstance(key, str):
        return key
    if isinstance(tz, dt.timezone) and tz.utcoffset(None) == dt.timedelta(0):
        return "UTC"
    raise ConfigError(f"arq setting timezone={tz!r} is not supported: use a zoneinfo.ZoneInfo")


def _hooks(app: App, opts: Mapping[str, Any], base: dict[str, Any]) -> None:
    """arq's hooks on the framework's: the process hooks get arq's ctx dict (the process
    context's ``state``, seeded with ``redis`` and arq's ``ctx`` option), the job hooks the
    job's ctx."""

    async def seed(ctx: Context) -> None:
        for k, v in base.items():
            ctx.state.setdefault(k, v)
        ctx.state.setdefault("redis", ctx.redis)

    app.startup_hooks.append(seed)
    for attr in ("on_startup", "on_shutdown", "on_job_start", "on_job_end", "after_job_end"):
        fn = opts.get(attr)
        if fn is None:
            continue
        if not inspect.iscoroutinefunction(fn):
            raise ConfigError(f"arq setting {attr}: {fn!r} is not an async function")
        if attr in ("on_startup", "on_shutdown"):
            (app.startup_hooks if attr == "on_startup" else app.shutdown_hooks).append(
                _process_hook(fn)
            )
        elif attr == "on_job_start":
            app.job_start_hooks.append(_with_state(fn))
        else:
            app.job_end_hooks.append(_end_hook(fn))


def _process_hook(
    fn: Callable[[dict[str, Any]], Awaitable[Any]],
) -> Callable[[Context], Awaitable[None]]:
    async def hook(ctx: Context) -> None:
        await fn(ctx.state)

    return hook


def _end_hook(
    fn: Callable[[dict[str, Any]], Awaitable[Any]],
) -> Callable[[JobContext, JobOutcome], Awaitable[None]]:
    async def hook(ctx: JobContext, outcome: JobOutcome) -> None:
        await fn(ctx)

    return hook
