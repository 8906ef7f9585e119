"""``--processes N``: one parent runs N worker processes of one role, restarts them, stops them."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from worker.core.clock import Clock, SystemClock
from worker.core.component import Backoff
from worker.runtime.embedded import death_signal_hook
from worker.settings import ENV_PREFIX, Settings

log = structlog.get_logger("worker.processes")

#: A child exiting with this code on its first start hit a configuration error (the CLI's exit
#: code 2: Redis unreachable, health port taken, eviction policy): starting it again cannot
#: help, so the parent stops the others and exits with it, as a single process would.
EXIT_CONFIG = 2
#: How often the parent looks for children that exited.
POLL_S = 0.1


class Child(Protocol):
    """What the supervisor needs of a started process; ``subprocess.Popen`` is one."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...


#: Starts child ``index`` (0-based) and returns it.
Spawn = Callable[[int], Child]


def exit_status(returncode: int) -> int:
    """An exit status from ``Popen.returncode``: killed by signal N (-N) becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def child_name(settings: Settings, index: int) -> str:
    """Instance name of child ``index``: ``<name>-<index>``."""
    return f"{settings.instance_name}-{index}"


def child_health_port(settings: Settings, index: int) -> int | None:
    """Health port of child ``index``: ``WORKER_HEALTH_PORT + index`` when the port is
    configured (0 stays 0: disabled); ``None`` at the default port: each child takes the first
    free port from it (``python -m worker health`` finds them)."""
    if not settings.health_port_explicit:
        return None
    return settings.health_port + index if settings.health_port else 0


@dataclass
class Slot:
    """Child ``index``: its running process, its restart backoff, when it starts again."""

    index: int
    backoff: Backoff
    child: Child | None = None
    starts: int = 0
    started_at: float = 0.0  # monotonic
    restart_at: float | None = None  # monotonic; set while waiting out a backoff
    last_code: int | None = None  # exit status of the last run, None while one runs


@dataclass
class Supervisor:
    """Keeps ``count`` children running until :meth:`request_stop`, then waits for each.

    A child that exits while not stopping (any code) is started again after a capped,
    jittered exponential backoff (:class:`~worker.core.component.Backoff`, reset once a run lasted
    ``reset_after_s``), so a child crashing at once cannot spin. Exception: exit code 2 on a
    child's first start (a configuration error) stops everything. :meth:`run` returns 0 when
    every child's last run ended with 0, else the first non-zero status in order of exit.
    """

    spawn: Spawn
    count: int
    clock: Clock = field(default_factory=SystemClock)
    backoff: Callable[[], Backoff] = Backoff
    poll_s: float = POLL_S
    slots: list[Slot] = field(init=False)
    stopping: bool = field(init=False, default=False)
    signals: int = field(init=False, default=0)
    restarts: int = field(init=False, default=0)
    exit_code: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.slots = [Slot(i, self.backoff()) for i in range(self.count)]

    def request_stop(self, sig: int = signal.SIGTERM) -> None:
        """Forward ``sig`` to every running child and restart nothing from now on. Called
        again, forward again: a worker's second signal makes it exit at once."""
        self.signals += 1
        self.stopping = True
        running = [s for s in self.slots if s.child is not None]
        log.info(
            "stopping worker processes" if self.signals == 1 else "signal again: forwarded",
            signal=signal.Signals(sig).name,
            running=len(running),
        )
        for slot in self.slots:
            if slot.child is None:
                slot.restart_at = None
                if slot.last_code is not None:  # waiting out a backoff: its crash counts
                    self._final(slot.last_code)
                    slot.last_code = None
                continue
            with contextlib.suppress(ProcessLookupError):  # exited: the next poll collects it
                slot.child.send_signal(sig)

    async def run(self) -> int:
        """Start the children, keep them running, and after :meth:`request_stop` wait until
        every one has exited; return the exit status for this process."""
        if not self.stopping:
            for slot in self.slots:
                self._start(slot)
        while True:
            now = self.clock.monotonic()
            for slot in self.slots:
                if slot.child is not None:
                    code = slot.child.poll()
                    if code is not None:
                        self._exited(slot, exit_status(code), now)
                if (
                    not self.stopping
                    and slot.child is None
                    and slot.restart_at is not None
                    and now >= slot.restart_at
                ):
                    self._start(slot)
            if self.stopping and all(s.child is None for s in self.slots):
                return self.exit_code
            await self.clock.sleep(self.poll_s)

    # -- internals ----------------------------------------------------------------------------
    def _final(self, code: int) -> None:
        if code and not self.exit_code:
            self.exit_code = code

    def _start(self, slot: Slot) -> None:
        slot.restart_at = None
        slot.last_code = None
        slot.starts += 1
        if slot.starts > 1:
            self.restarts += 1
        slot.started_at = self.clock.monotonic()
        try:
            slot.child = self.spawn(slot.index)
        except OSError as exc:  # fork failed (EAGAIN, ENOMEM): try again later
            log.error("cannot start worker process", index=slot.index, error=str(exc))
            self._backoff(slot, slot.started_at)
            return
        log.info("worker process started", index=slot.index, pid=slot.child.pid, run=slot.starts)

    def _exited(self, slot: Slot, code: int, now: float) -> None:
        pid = slot.child.pid if slot.child is not None else None
        slot.child = None
        up_s = round(now - slot.started_at, 1)
        if self.stopping:
            log.info("worker process stopped", index=slot.index, pid=pid, code=code)
            self._final(code)
            return
        slot.last_code = code
        if code == EXIT_CONFIG and slot.starts == 1:
            log.error(
                "worker process failed to start (configuration error, see its last line); "
                "stopping the others",
                index=slot.index,
                pid=pid,
                code=code,
            )
            self.request_stop(signal.SIGTERM)
            return
        delay = self._backoff(slot, now)
        log.warning(
            "worker process exited unexpectedly; restarting",
            index=slot.index,
            pid=pid,
            code=code,
            up_s=up_s,
            retry_in_s=round(delay, 2),
        )

    def _backoff(self, slot: Slot, now: float) -> float:
        if now - slot.started_at >= slot.backoff.reset_after_s:
            slot.backoff.attempt = 0  # it ran long enough: a fresh failure, not a crash loop
        delay = slot.backoff.next_delay()
        slot.restart_at = now + delay
        return delay


@dataclass(frozen=True)
class Launcher:
    """Starts child ``index`` as ``python -m worker run`` with this command's settings.

    The child is instance ``<name>-<index>`` on health port ``base + index`` (a configured
    port; at the default each child takes the next free one), gets
    ``WORKER_PROCESSES=1`` (it never starts children itself) and the parent's environment
    otherwise. ``redis_url``, when given (a ``--redis-url`` flag, the shared embedded server),
    is passed in the environment, never on the command line; a URL read from
    ``WORKER_REDIS_URL_FILE`` is left to each child to read. Children run in their own session
    (a terminal's Ctrl-C reaches only the parent, which forwards it once) with the
    parent-death signal armed: if the parent is killed, they get SIGTERM.
    """

    settings: Settings
    environ: Mapping[str, str]
    redis_url: str | None = None

    def command(self, index: int) -> list[str]:
        s = self.settings
        name = child_name(s, index)
        return [
            sys.executable, "-m", "worker", "run",
            "--role", s.role, "--instance-name", name, "--app", s.app,
        ]  # fmt: skip

    def env(self, index: int) -> dict[str, str]:
        env = dict(self.environ)
        env[f"{ENV_PREFIX}PROCESSES"] = "1"
        port = child_health_port(self.settings, index)
        if port is not None:
            env[f"{ENV_PREFIX}HEALTH_PORT"] = str(port)
        if self.redis_url is not None and not self.settings.redis_url_file:
            env[f"{ENV_PREFIX}REDIS_URL"] = self.redis_url
            env[f"{ENV_PREFIX}REDIS_URL_FILE"] = ""  # outranks one in WORKER_CONFIG_FILE
        return env

    def __call__(self, index: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.command(index),
            env=self.env(index),
            stdin=subprocess.DEVNULL,
            preexec_fn=death_signal_hook(),
            start_new_session=True,
        )


def run_processes(settings: Settings, *, redis_url: str | None, environ: Mapping[str, str]) -> int:
    """Run ``settings.processes`` worker processes until SIGTERM/SIGINT; return the exit code."""
    structlog.contextvars.bind_contextvars(component="processes")
    sup = Supervisor(
        Launcher(settings, environ, redis_url),
        settings.processes,
        backoff=lambda: Backoff(settings.restart_backoff_base_s, settings.restart_backoff_cap_s),
    )
    log.info(
        "starting worker processes",
        processes=settings.processes,
        instances=[child_name(settings, i) for i in range(settings.processes)],
        health_ports=[child_health_port(settings, i) for i in range(settings.processes)],
    )

    async def main() -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, sup.request_stop, sig)
        return await sup.run()

    code = asyncio.run(main())
    log.info("worker processes stopped", exit_code=code, restarts=sup.restarts)
    return code
