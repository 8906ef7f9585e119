"""Plain ``def`` tasks and periodic jobs: run in a bounded pool of threads, one pool per process.

``@app.task`` and ``@app.periodic`` accept a plain ``def fn(ctx, ...)``: :func:`sync_job` wraps
it at registration in an async adapter, so the consumer awaits it like any task. The adapter
runs the function in the process's :class:`SyncThreads` (``WORKER_SYNC_THREADS`` threads, on
the job's :class:`~worker.context.Context`), with a copy of the caller's ``contextvars`` (a
structlog binding, an OpenTelemetry span), and the event loop goes on meanwhile.

- **Waiting for a thread**: ``WORKER_CONCURRENCY`` bounds the jobs running at once, sync and
  async alike; a sync job beyond the pool's size waits (in the loop, cheaply) for a thread,
  and that wait counts against its timeout.
- **Timeouts**: Python cannot kill a thread. At the job's deadline the run ends as timed out
  (as an async job's does); its thread keeps running the function until it returns and takes
  no other job meanwhile (:attr:`SyncThreads.stuck` counts such threads, logged and exported as
  ``worker_sync_threads_stuck``). The function sees it: ``ctx.sync.cancelled`` is true and
  ``ctx.sync.still_claimed()`` false. While *every* thread is stuck, :class:`SyncThreadsHook`
  defers new sync jobs (back to the queue, try given back, due again a second later) instead
  of piling them up behind threads that may never return.
- **The job's helpers from the thread**: ``ctx.sync`` (:class:`SyncHelpers`) calls the async
  helpers on the event loop and waits for them (``ctx.sync.still_claimed()``,
  ``ctx.sync.enqueue(...)``, ``ctx.sync.run(ctx.redis.get("k"))`` for any coroutine).

The threads are daemon threads (a ``ThreadPoolExecutor``'s are joined at interpreter exit, so
one stuck function would hold the process's exit forever); a stopping process abandons them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import queue
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any, Protocol, TypeVar

import structlog

from worker.core.clock import Clock, ms
from worker.core.jobdefs import NO_RECORD, JobDef, JobHook, TaskFn

log = structlog.get_logger("worker.sync")

T = TypeVar("T")
#: ``WORKER_SYNC_THREADS``'s default: the same on every host (see docs/duties.md).
DEFAULT_SYNC_THREADS = 10
#: While every thread is stuck, a sync job is put back for this long.
STUCK_DEFER_S = 1.0
#: How long ``ctx.sync.still_claimed()`` waits for its answer (a blocked loop: ``False``).
CLAIM_CHECK_TIMEOUT_S = 10.0
#: The attribute marking an adapter made by :func:`sync_job` (``functools.wraps`` carries it).
MARK = "__worker_sync__"


class _JobLike(Protocol):
    """What the helpers need of a :class:`~worker.context.JobContext`."""

    async def still_claimed(self) -> bool: ...
    async def enqueue(self, function: str, *args: Any, **kwargs: Any) -> str | None: ...
    async def once(self, key: str, ttl: float) -> bool: ...
    async def forget(self, key: str) -> None: ...
    async def broadcast(self, topic: str, data: Any = None) -> int | None: ...
    async def progress(self, fraction: float, message: str | None = None) -> None: ...
    def mutex(self, key: str, ttl: float) -> contextlib.AbstractAsyncContextManager[bool]: ...


class SyncHelpers:
    """``ctx.sync`` in a plain ``def`` task: the job context's async helpers, callable from its
    thread (each runs on the event loop; the thread waits for it). Not for the loop's own
    thread (that would deadlock): there, ``await`` the helpers themselves."""

    def __init__(self, ctx: _JobLike, loop: asyncio.AbstractEventLoop) -> None:
        self._ctx = ctx
        self._loop = loop
        self._ended = threading.Event()

    @property
    def cancelled(self) -> bool:
        """``True`` once the run ended without the function: its timeout passed, it was
        aborted or taken over, or the process stopped. Return soon: nothing it writes counts."""
        return self._ended.is_set()

    def run(self, aw: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``aw`` on the event loop and return its result (``ctx.sync.run(ctx.redis.get(k))``);
        ``TimeoutError`` after ``timeout`` seconds."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            aw.close()
            raise RuntimeError("ctx.sync is for plain def tasks; in async code await the helper")
        return asyncio.run_coroutine_threadsafe(aw, self._loop).result(timeout)

    def still_claimed(self) -> bool:
        """:meth:`~worker.context.JobContext.still_claimed` from the thread: ``False`` once the
        run ended (:attr:`cancelled`) or when Redis cannot say within 10 s."""
        if self.cancelled:
            return False
        try:
            return self.run(self._ctx.still_claimed(), CLAIM_CHECK_TIMEOUT_S)
        except (TimeoutError, RuntimeError):
            return False

    def enqueue(self, function: str, *args: Any, **kwargs: Any) -> str | None:
        """:meth:`~worker.client.Client.enqueue` from the thread."""
        return self.run(self._ctx.enqueue(function, *args, **kwargs))

    def once(self, key: str, ttl: float) -> bool:
        return self.run(self._ctx.once(key, ttl))

    def forget(self, key: str) -> None:
        self.run(self._ctx.forget(key))

    def broadcast(self, topic: str, data: Any = None) -> int | None:
        return self.run(self._ctx.broadcast(topic, data))

    def progress(self, fraction: float, message: str | None = None) -> None:
        """:meth:`~worker.context.JobContext.progress` from the thread (throttled the same)."""
        self.run(self._ctx.progress(fraction, message))

    @contextlib.contextmanager
    def mutex(self, key: str, ttl: float) -> Iterator[bool]:
        """``with ctx.sync.mutex(key, ttl) as held:`` — :meth:`~worker.context.Context.mutex`."""
        cm = self._ctx.mutex(key, ttl)
        held = self.run(cm.__aenter__())
        try:
            yield held
        finally:
            self.run(cm.__aexit__(None, None, None))


class SyncThreads:
    """The process's threads for plain ``def`` jobs: at most ``size`` run at once; a thread
    whose job ended before its function returned is *stuck* until it does (module docstring).
    Built once per process (the runtime's, the test harness's); :meth:`close` at shutdown."""

    def __init__(self, size: int = DEFAULT_SYNC_THREADS) -> None:
        if size < 1:
            raise ValueError("SyncThreads size must be at least 1")
        self.size = size
        #: Threads running a function now (stuck ones included).
        self.busy = 0
        #: Threads still running a function whose job already ended (timed out, aborted).
        self.stuck = 0
        self._work: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[[], Any]]]
        self._work = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._threads: list[threading.Thread] = []
        self._slots: asyncio.Semaphore | None = None
        self._closed = False

    @property
    def all_stuck(self) -> bool:
        return self.stuck >= self.size

    async def call(self, fn: Callable[..., Any], ctx: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(ctx, *args, **kwargs)`` in a thread once one is free; its result or exception.
        Cancelled (a timeout, an abort), it returns at once and the thread runs on, stuck."""
        if self._closed:
            raise RuntimeError("the sync threads are closed (the process is stopping)")
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.size)
        loop = asyncio.get_running_loop()
        helpers = SyncHelpers(ctx, loop)
        if hasattr(ctx, "sync_helpers"):
            ctx.sync_helpers = helpers
        await self._slots.acquire()
        self.busy += 1
        run = functools.partial(contextvars.copy_context().run, fn, ctx, *args, **kwargs)
        future = asyncio.wrap_future(self._submit(run), loop=loop)
        started = time.monotonic()
        future.add_done_callback(functools.partial(self._returned, helpers, started))
        try:
            result = await asyncio.shield(future)
        except asyncio.CancelledError:
            if not future.done():
                self._abandoned(helpers, fn)
            raise
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise TypeError(f"{_name(fn)} returned an awaitable: declare it with async def")
        return result

    def close(self) -> None:
        """No new calls; idle threads exit; stuck ones are left to the process's exit."""
        self._closed = True
        for _ in self._threads:
            self._work.put((concurrent.futures.Future(), _stop))

    def _submit(self, run: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._work.put((cf, run))
        if not self._idle.acquire(blocking=False) and len(self._threads) < self.size:
            t = threading.Thread(
                target=self._serve, name=f"worker-sync-{len(self._threads) + 1}", daemon=True
            )
            self._threads.append(t)
            t.start()
        return cf

    def _serve(self) -> None:
        while True:
            cf, run = self._work.get()
            if run is _stop:
                return
            if cf.set_running_or_notify_cancel():
                try:
                    cf.set_result(run())
                except BaseException as exc:
                    cf.set_exception(exc)
            del cf, run  # a finished job's values are not held by an idle thread
            self._idle.release()

    def _abandoned(self, helpers: SyncHelpers, fn: Callable[..., Any]) -> None:
        helpers._ended.set()
        self.stuck += 1
        log.warning(
            "sync job ended before its function returned; its thread runs on until it does "
            "(Python cannot kill a thread)",
            function=_name(fn),
            stuck=self.stuck,
            threads=self.size,
        )
        if self.all_stuck:
            log.error(
                f"{self.stuck} sync threads still running past their job's end: every thread "
                "is stuck; sync jobs are deferred until one returns",
                threads=self.size,
            )

    def _returned(self, helpers: SyncHelpers, started: float, future: asyncio.Future[Any]) -> None:
        self.busy -= 1
        assert self._slots is not None
        self._slots.release()
        if not future.cancelled():
            future.exception()  # retrieved: an abandoned run's error is not "never retrieved"
        if helpers.cancelled:
            self.stuck -= 1
            log.info(
                "a stuck sync thread returned",
                ran_s=round(time.monotonic() - started, 3),
                stuck=self.stuck,
            )


def _stop() -> None:
    """The sentinel :meth:`SyncThreads.close` queues: the thread that takes it exits."""


def _name(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__qualname__", getattr(fn, "__name__", fn)))


def threads_of(ctx: Any) -> SyncThreads:
    """The pool of the process running ``ctx``'s job (its :class:`~worker.context.Context`'s)."""
    threads = getattr(getattr(ctx, "context", None), "threads", None)
    if not isinstance(threads, SyncThreads):
        raise RuntimeError("a plain def job needs a worker JobContext (ctx.context.threads)")
    return threads


def sync_job(fn: Callable[..., Any]) -> TaskFn:
    """The async adapter the consumer awaits for a plain ``def fn(ctx, ...)``."""

    @functools.wraps(fn)
    async def run(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        return await threads_of(ctx).call(fn, ctx, *args, **kwargs)

    setattr(run, MARK, True)
    return run


def is_sync(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is (or wraps) a :func:`sync_job` adapter."""
    return bool(getattr(fn, MARK, False))


class SyncThreadsHook(JobHook):
    """Defers sync jobs while every thread is stuck past its job's end (they would only wait
    behind threads that may never return); logs once per such episode."""

    def __init__(self, threads: SyncThreads, clock: Clock) -> None:
        self.threads = threads
        self.clock = clock
        self._deferring = False

    def concerns(self, job: JobDef) -> bool:
        return is_sync(job.fn)

    async def admit(
        self, job: JobDef, job_id: str, record: Mapping[str, Any] = NO_RECORD
    ) -> int | None:
        if not self.threads.all_stuck or not is_sync(job.fn):
            self._deferring = False
            return None
        if not self._deferring:
            self._deferring = True
            log.warning(
                "every sync thread is stuck; deferring sync jobs",
                threads=self.threads.size,
                defer_s=STUCK_DEFER_S,
            )
        return ms(self.clock.time() + STUCK_DEFER_S)
