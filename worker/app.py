"""The user-facing registry: tasks, periodic jobs, pollers, initializers, services, broadcasts.

Every background duty declares its cardinality here and the framework enforces it::

    from worker import App

    app = App("shop")

    @app.task(timeout_s=30)
    async def send_receipt(ctx, order_id: int) -> None: ...

    @app.periodic(cron="* * * * *", tz="Asia/Shanghai")   # enqueued once per tick by the leader
    async def order_expire(ctx) -> None: ...

    cards = app.poller("cards", task="poll_card", shards=4)  # leader dispatches due items

    @app.initializer(version="2026-11-01", poller="cards")   # once per cluster per version
    async def load_cards(ctx, cursor):
        yield "next-cursor", {"card-1": 0.0}

    @app.service(cardinality="singleton", sla_s=60)          # long-running loop, one cluster-wide
    async def imap_idle(ctx, stop) -> None: ...              # ctx.alive() at least every 60 s

    @app.health_check(timeout_s=5, interval_s=30)            # a dependency: fails readiness
    async def database(ctx) -> None: ...

    @app.on_broadcast("pricing")                             # in every process, each message once
    async def drop_prices(ctx, data) -> None: ...
"""

from __future__ import annotations

import datetime as dt
import importlib
import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, overload

from worker.consumer.limits import parse_rate
from worker.context import Context, JobContext
from worker.core.errors import ConfigError
from worker.core.flow import Coalesce, FlowKeyOf, Mode, TaskFlow
from worker.core.jobdefs import JobDef, JobOutcome
from worker.core.retry import RetryDelay, as_delay
from worker.core.schedule import make_schedule
from worker.core.topics import BroadcastDef, OnStart
from worker.duties.checks import HealthCheckDef
from worker.duties.initializer import InitializerDef
from worker.duties.periodic import CatchUp, PeriodicDef
from worker.duties.services import Cardinality, ServiceDef, ServiceKeys
from worker.polls import PollerDef
from worker.storage.keys import DEFAULT_QUEUE
from worker.sync import sync_job

F = TypeVar("F", bound=Callable[..., Any])
Hook = Callable[[Context], Awaitable[None]]
#: a decorated function keeps its own type (a user's ``mypy --strict`` sees what they wrote)
C = TypeVar("C", bound=Hook)
JobStartHook = Callable[[JobContext], Awaitable[None]]
JobEndHook = Callable[[JobContext, JobOutcome], Awaitable[None]]

_NAME = re.compile(r"^[A-Za-z_][\w.-]*$")


def _check_name(kind: str, name: str) -> str:
    if not _NAME.match(name):
        raise ConfigError(f"{kind} name {name!r}: use letters, digits, '_', '.', '-'")
    return name


@dataclass
class App:
    """A set of background duties. Pass it as ``--app package.module:attribute``."""

    name: str = "app"
    tasks: dict[str, JobDef] = field(default_factory=dict)
    periodics: dict[str, PeriodicDef] = field(default_factory=dict)
    pollers: dict[str, PollerDef] = field(default_factory=dict)
    initializers: dict[str, InitializerDef] = field(default_factory=dict)
    services: dict[str, ServiceDef] = field(default_factory=dict)
    broadcasts: list[BroadcastDef] = field(default_factory=list)
    health_checks: dict[str, HealthCheckDef] = field(default_factory=dict)
    startup_hooks: list[Hook] = field(default_factory=list)
    shutdown_hooks: list[Hook] = field(default_factory=list)
    job_start_hooks: list[JobStartHook] = field(default_factory=list)
    job_end_hooks: list[JobEndHook] = field(default_factory=list)
    #: Queues in priority order (consumers drain the first before the next). Unset: ``default``
    #: then every other queue a task or periodic job names, in the order they were declared.
    queues: tuple[str, ...] | None = None
    #: Flow keys' weights in fair queues: a key of weight 4 is served 4 jobs per turn (others 1).
    flow_weights: dict[str, int] = field(default_factory=dict)

    # -- registration -------------------------------------------------------------------------
    @overload
    def task(self, fn: F) -> F: ...

    @overload
    def task(
        self,
        fn: None = None,
        *,
        name: str | None = None,
        timeout_s: float | None = None,
        max_tries: int | None = None,
        keep_result_s: float | None = None,
        queue: str = DEFAULT_QUEUE,
        retry_on: type[BaseException] | tuple[type[BaseException], ...] = (),
        retry_delay: float | RetryDelay | None = None,
        max_concurrency: int | None = None,
        rate: str | None = None,
        flow_key: FlowKeyOf | None = None,
        fair: bool = False,
        max_concurrency_per_key: int | None = None, rate_per_key: str | None = None,
        expires_in: float | None = None,
        coalesce: Mode | None = None, debounce_s: float | None = None,
        max_wait_s: float | None = None, throttle_s: float | None = None,
        parents: Literal["args", "context"] = "args",
    ) -> Callable[[F], F]: ...  # fmt: skip

    def task(
        self,
        fn: F | None = None,
        *,
        name: str | None = None,
        timeout_s: float | None = None,
        max_tries: int | None = None,
        keep_result_s: float | None = None,
        queue: str = DEFAULT_QUEUE,
        retry_on: type[BaseException] | tuple[type[BaseException], ...] = (),
        retry_delay: float | RetryDelay | None = None,
        max_concurrency: int | None = None,
        rate: str | None = None,
        flow_key: FlowKeyOf | None = None,
        fair: bool = False,
        max_concurrency_per_key: int | None = None, rate_per_key: str | None = None,
        expires_in: float | None = None,
        coalesce: Mode | None = None, debounce_s: float | None = None,
        max_wait_s: float | None = None, throttle_s: float | None = None,
        parents: Literal["args", "context"] = "args",
    ) -> Any:  # fmt: skip
        """Register ``async def fn(ctx, *args, **kwargs)`` as a job consumers run; a plain
        ``def`` runs in the process's sync threads (``WORKER_SYNC_THREADS``, :mod:`worker.sync`).

        ``queue``: where its jobs wait (consumers take queues in priority order, see
        :attr:`App.queues`). ``retry_on``/``retry_delay``: exceptions retried automatically
        while tries remain, and the wait before each retry (seconds, or a callable of the try
        number; see :mod:`worker.core.retry`). ``max_concurrency``: at most this many run at once
        across the cluster; ``rate``: at most ``"N/s"`` (``/m``, ``/h``) start cluster-wide.
        Jobs over a limit wait (deferred), they never fail for it. ``flow_key``: a job's flow
        key from its arguments (``flow_key(*args, **kwargs)``) when its enqueue names none;
        ``fair``: its jobs are taken round-robin across flow keys (:attr:`flow_weights`);
        ``max_concurrency_per_key``, ``rate_per_key``: the limits above, per flow key; the
        defaults of ``enqueue``'s ``expires_in`` and ``coalesce`` (docs/flow-control.md);
        ``parents``: a workflow step's parents' results as first argument or ``ctx.parents``.
        """
        on = retry_on if isinstance(retry_on, tuple) else (retry_on,)
        for what, most in (("", max_concurrency), ("_per_key", max_concurrency_per_key)):
            if most is not None and most < 1:
                raise ConfigError(f"task max_concurrency{what} must be at least 1")
        parsed_rate = parse_rate(rate) if rate is not None else None
        key_rate = parse_rate(rate_per_key) if rate_per_key is not None else None
        how = Coalesce.of(coalesce, debounce_s, max_wait_s, throttle_s)
        flow = TaskFlow.of(flow_key, expires_in, how)
        if parents not in ("args", "context"):
            raise ConfigError(f"task parents: 'args' or 'context', not {parents!r}")

        def register(f: F) -> F:
            n = _check_name("task", name or f.__name__)
            self._unique_name(n)
            self.tasks[n] = JobDef(
                n,
                _job_fn("task", f),
                timeout_s,
                max_tries,
                keep_result_s,
                queue=_check_name("queue", queue),
                retry_on=on,
                retry_delay=as_delay(retry_delay),
                max_concurrency=max_concurrency,
                rate=parsed_rate,
                flow=flow,
                fair=fair,
                max_concurrency_per_key=max_concurrency_per_key,
                rate_per_key=key_rate,
                parents=parents,
            )
            return f

        return register(fn) if fn is not None else register

    def periodic(
        self,
        *,
        cron: str | None = None,
        every: float | dt.timedelta | None = None,
        tz: str = "UTC",
        name: str | None = None,
        catch_up: CatchUp = "all",
        catch_up_limit: int = 10,
        catch_up_window: float | dt.timedelta | None = None,
        timeout_s: float | None = None,
        queue: str = DEFAULT_QUEUE,
        max_staleness: float | dt.timedelta | None = None,
    ) -> Callable[[F], F]:
        """Register ``async def fn(ctx)`` (or a plain ``def``, run in a thread as tasks are) to
        run once per tick of ``cron`` or ``every``.

        See :class:`PeriodicDef` for the catch-up policy after a failover. ``max_staleness``:
        the job's last success may be at most this old (seconds or a timedelta); ``doctor``
        fails, and the leader reports the job as stale (``/status``, ``/readyz`` body,
        ``worker_periodic_stale``), beyond it.
        """
        schedule = make_schedule(cron, every, tz)
        if catch_up not in ("skip", "latest", "all"):
            raise ConfigError(f"periodic catch_up={catch_up!r}: use 'skip', 'latest' or 'all'")
        if catch_up_limit < 1:
            raise ConfigError("periodic catch_up_limit must be at least 1")
        window = (
            catch_up_window.total_seconds()
            if isinstance(catch_up_window, dt.timedelta)
            else catch_up_window
        )
        if window is not None and window <= 0:
            raise ConfigError("periodic catch_up_window must be positive")
        staleness = _seconds(max_staleness)
        if staleness is not None and staleness <= 0:
            raise ConfigError("periodic max_staleness must be positive")

        def register(f: F) -> F:
            n = _check_name("periodic", name or f.__name__)
            self._unique_name(n)
            self.periodics[n] = PeriodicDef(
                n, _job_fn("periodic", f), schedule, catch_up, catch_up_limit, timeout_s, window,
                queue=_check_name("queue", queue), max_staleness_s=staleness,
            )  # fmt: skip
            return f

        return register

    def poller(
        self,
        name: str,
        *,
        task: str,
        shards: int = 1,
        batch_size: int = 500,
        interval_s: float = 1.0,
        busy_defer_s: float = 1.0,
        failure_delay_s: float = 60.0,
    ) -> PollerDef:
        """Declare a poller whose due items are dispatched to ``task`` (one job per item); an
        item whose job fails for good is due again ``failure_delay_s`` later."""
        _check_name("poller", name)
        if name in self.pollers:
            raise ConfigError(f"poller {name!r} is registered twice")
        if not 1 <= shards <= 1024:
            raise ConfigError(f"poller {name!r}: shards must be 1..1024")
        if batch_size < 1 or interval_s <= 0 or busy_defer_s <= 0:
            raise ConfigError(f"poller {name!r}: batch_size, interval_s, busy_defer_s must be > 0")
        if failure_delay_s < 0:
            raise ConfigError(f"poller {name!r}: failure_delay_s must be >= 0")
        p = PollerDef(name, task, shards, batch_size, interval_s, busy_defer_s, failure_delay_s)
        self.pollers[name] = p
        return p

    def initializer(
        self, *, version: str, name: str | None = None, poller: str | None = None
    ) -> Callable[[F], F]:
        """Register an async generator run once per cluster per ``version`` (see
        :class:`InitializerDef`)."""

        def register(f: F) -> F:
            if not inspect.isasyncgenfunction(f):
                raise ConfigError(
                    f"initializer {f.__name__!r} must be an async generator "
                    "(async def ... yield cursor, items)"
                )
            n = _check_name("initializer", name or f.__name__)
            if n in self.initializers:
                raise ConfigError(f"initializer {n!r} is registered twice")
            self.initializers[n] = InitializerDef(n, f, str(version), poller)
            return f

        return register

    def service(
        self,
        *,
        cardinality: Cardinality = "singleton",
        name: str | None = None,
        keys: ServiceKeys | None = None,
        sla_s: float | None = None,
    ) -> Callable[[F], F]:
        """Register a loop that runs until ``stop`` is set: ``async def fn(ctx, stop)``, or for
        ``cardinality="per_key"`` ``async def fn(ctx, stop, key)`` with ``keys=`` a collection
        or a ``(ctx) -> keys`` callable.

        ``sla_s``: the loop (each key's loop) must report progress within this many seconds,
        by calling ``ctx.alive()`` or, written as an async generator, by yielding; otherwise
        ``/healthz`` fails on the process running it."""
        if cardinality not in ("singleton", "per_process", "per_key"):
            raise ConfigError(
                f"service cardinality={cardinality!r}: use 'singleton', 'per_process' or 'per_key'"
            )
        if (cardinality == "per_key") != (keys is not None):
            raise ConfigError("service keys=... is required for per_key services and only for them")
        if sla_s is not None and sla_s <= 0:
            raise ConfigError("service sla_s must be positive")

        def register(f: F) -> F:
            if not inspect.isasyncgenfunction(f):
                self._require_async("service", f)
            n = _check_name("service", name or f.__name__)
            if n in self.services:
                raise ConfigError(f"service {n!r} is registered twice")
            self.services[n] = ServiceDef(n, f, cardinality, keys, sla_s)
            return f

        return register

    def on_broadcast(
        self, topic: str, *, on_start: OnStart = "latest", tries: int = 5
    ) -> Callable[[F], F]:
        """Handle ``topic``'s broadcasts in every process, whatever its role:
        ``async def fn(ctx, data) -> None``. A topic may have several handlers; each runs once
        per message, in order, retried with backoff up to ``tries`` runs. ``on_start``:
        ``"latest"`` hands a starting process the topic's newest message, ``"none"`` only what
        is sent after (see :mod:`worker.duties.broadcast`)."""
        _check_name("broadcast topic", topic)
        if on_start not in ("latest", "none"):
            raise ConfigError(f"on_broadcast on_start={on_start!r}: use 'latest' or 'none'")
        if tries < 1:
            raise ConfigError("on_broadcast tries must be at least 1")

        def register(f: F) -> F:
            self._require_async("broadcast handler", f)
            self.broadcasts.append(BroadcastDef(topic, f, on_start, tries))
            return f

        return register

    @overload
    def health_check(self, fn: C) -> C: ...

    @overload
    def health_check(
        self,
        fn: None = None,
        *,
        name: str | None = None,
        timeout_s: float = 5.0,
        interval_s: float = 15.0,
    ) -> Callable[[C], C]: ...

    def health_check(
        self,
        fn: C | None = None,
        *,
        name: str | None = None,
        timeout_s: float = 5.0,
        interval_s: float = 15.0,
    ) -> C | Callable[[C], C]:
        """Register ``async def fn(ctx) -> None`` that raises when a dependency (a database, an
        IMAP server) is unusable. Every process runs it in the background every ``interval_s``
        seconds, cancelled after ``timeout_s``; never on a probe request. While its latest run
        failed (or before its first run ended) ``/readyz`` answers 503; ``/healthz`` stays 200
        (restarting the process does not bring a database back). ``/status`` shows each."""
        if timeout_s <= 0 or interval_s <= 0:
            raise ConfigError("health_check timeout_s and interval_s must be positive")

        def register(f: C) -> C:
            self._require_async("health_check", f)
            n = _check_name("health_check", name or str(getattr(f, "__name__", "check")))
            if n in self.health_checks:
                raise ConfigError(f"health_check {n!r} is registered twice")
            self.health_checks[n] = HealthCheckDef(n, f, timeout_s, interval_s)
            return f

        return register(fn) if fn is not None else register

    def on_startup(self, fn: C) -> C:
        """Run ``async def fn(ctx)`` once per process before any component starts."""
        self.startup_hooks.append(fn)
        return fn

    def on_shutdown(self, fn: C) -> C:
        """Run ``async def fn(ctx)`` once per process after every component stopped."""
        self.shutdown_hooks.append(fn)
        return fn

    def on_job_start(self, fn: JobStartHook) -> JobStartHook:
        """Run ``async def fn(ctx)`` before every job's function (tasks and periodic jobs), in
        the consumer that runs it; several hooks run in the order registered. A hook that
        raises is logged and the job runs; one that hangs is cancelled after
        ``WORKER_JOB_HOOK_TIMEOUT_S``."""
        self._require_async("on_job_start hook", fn)
        self.job_start_hooks.append(fn)
        return fn

    def on_job_end(self, fn: JobEndHook) -> JobEndHook:
        """Run ``async def fn(ctx, outcome)`` after every run that started, with its
        :class:`~worker.core.jobdefs.JobOutcome` (``status``: success, failed, retry, cancelled,
        timeout or dead; ``error``, ``result``, ``duration_s``, ``job_try``, ``task``,
        ``job_id``). The run's end is recorded before the hook runs: a hook that raises or
        hangs (cancelled after ``WORKER_JOB_HOOK_TIMEOUT_S``) is logged and changes nothing."""
        self._require_async("on_job_end hook", fn)
        self.job_end_hooks.append(fn)
        return fn

    def jobs(self) -> list[JobDef]:
        """Everything a consumer runs: the tasks and one job per periodic job."""
        return [*self.tasks.values(), *(p.job() for p in self.periodics.values())]

    def job_names(self) -> list[str]:
        """The names a client may enqueue: the tasks and the periodic jobs."""
        return [*self.tasks, *self.periodics]

    # -- checks -------------------------------------------------------------------------------
    def queue_names(self) -> list[str]:
        """Every queue the app uses, in priority order (see :attr:`queues`)."""
        if self.queues is not None:
            return list(self.queues)
        out = [DEFAULT_QUEUE]
        for job in self.jobs():
            if job.queue not in out:
                out.append(job.queue)
        return out

    def queue_of(self, function: str) -> str:
        """The queue jobs of ``function`` go to (``default`` for a name the app does not know)."""
        job = self.tasks.get(function) or (
            self.periodics[function].job() if function in self.periodics else None
        )
        return job.queue if job is not None else DEFAULT_QUEUE

    def fair_queues(self) -> tuple[str, ...]:
        """The queues fair tasks' jobs wait in."""
        return tuple(dict.fromkeys(j.queue for j in self.tasks.values() if j.fair))

    def validate(self) -> None:
        """Cross-checks that need the whole app (raise :class:`ConfigError`)."""
        if any(type(w) is not int or w < 1 for w in self.flow_weights.values()):
            raise ConfigError(f"App(flow_weights={self.flow_weights!r}): integers of at least 1")
        if self.queues is not None:
            for q in self.queues:
                _check_name("queue", q)
            for job in self.jobs():
                if job.queue not in self.queues:
                    raise ConfigError(
                        f"{job.name!r}: queue {job.queue!r} is not in App(queues={self.queues!r})"
                    )
        for p in self.pollers.values():
            if p.task not in self.tasks:
                raise ConfigError(f"poller {p.name!r}: task {p.task!r} is not registered")
        for i in self.initializers.values():
            if i.poller is not None and i.poller not in self.pollers:
                raise ConfigError(f"initializer {i.name!r}: poller {i.poller!r} is not declared")

    def _unique_name(self, name: str) -> None:
        if name in self.tasks or name in self.periodics:
            raise ConfigError(f"job name {name!r} is registered twice")

    @staticmethod
    def _require_async(kind: str, f: Callable[..., Any]) -> None:
        if not inspect.iscoroutinefunction(f):
            raise ConfigError(f"{kind} {getattr(f, '__name__', f)!r} must be an async function")


def _job_fn(kind: str, f: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """What the consumer awaits for a task or periodic job: ``f`` itself when it is async, the
    thread adapter (:func:`worker.sync.sync_job`) for a plain ``def``."""
    if inspect.iscoroutinefunction(f):
        return f
    if inspect.isasyncgenfunction(f) or inspect.isgeneratorfunction(f):
        raise ConfigError(
            f"{kind} {getattr(f, '__name__', f)!r} is a generator: use async def or a plain def"
        )
    if not callable(f):
        raise ConfigError(f"{kind} {f!r} is not a function")
    return sync_job(f)


def load_app(spec: str) -> App:
    """Import ``package.module:attribute`` and return the :class:`App` it names.

    Raises :class:`ConfigError` (one line) if it cannot be imported or is not an ``App``.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"WORKER_APP: {spec!r} is not of the form package.module:attribute")
    try:
        module = importlib.import_module(module_name)
    except ConfigError:
        raise
    except ImportError as exc:
        raise ConfigError(
            f"WORKER_APP: cannot import module {module_name!r}: {_one_line(exc)}"
        ) from None
    except Exception as exc:
        raise ConfigError(
            f"WORKER_APP: importing {module_name!r} raised {type(exc).__name__}: {_one_line(exc)}"
        ) from None
    obj = getattr(module, attr, None)
    if obj is None:
        raise ConfigError(f"WORKER_APP: module {module_name!r} has no attribute {attr!r}")
    if callable(obj) and not isinstance(obj, App):
        obj = _from_factory(spec, obj)
    if not isinstance(obj, App):
        raise ConfigError(f"WORKER_APP: {spec!r} is a {type(obj).__name__}, not a worker.App")
    obj.validate()
    return obj


def _from_factory(spec: str, factory: Callable[..., Any]) -> object:
    """What a factory (a callable taking no argument) named by ``--app`` returns; one line
    (:class:`ConfigError`) for a callable that takes arguments or raises."""
    kind = "function" if inspect.isfunction(factory) else type(factory).__name__
    try:
        inspect.signature(factory).bind()
    except TypeError:
        raise ConfigError(
            f"WORKER_APP: {spec!r} is a {kind}, not a worker.App (nor a factory taking no "
            "argument that returns one)"
        ) from None
    except ValueError:  # no signature to read (a builtin): try it
        pass
    try:
        made = factory()
    except Exception as exc:
        raise ConfigError(
            f"WORKER_APP: {spec!r} is a {kind}; calling it raised {type(exc).__name__}: "
            f"{_one_line(exc)}"
        ) from None
    if not isinstance(made, App):
        raise ConfigError(
            f"WORKER_APP: {spec!r} is a {kind} that returned a {type(made).__name__}, not a "
            "worker.App"
        )
    return made


def _seconds(value: float | dt.timedelta | None) -> float | None:
    return value.total_seconds() if isinstance(value, dt.timedelta) else value


def _one_line(exc: BaseException) -> str:
    """The exception's message with newlines collapsed (ConfigError messages are one line)."""
    return " ".join(str(exc).split())
