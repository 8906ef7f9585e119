"""Command line: ``python -m worker [run|plan|status|health]`` (also the ``worker`` script).

Bad input exits with code 2 and one line on stderr naming the variable and what is accepted;
no traceback. Output into a closed pipe (``status | head -1``) exits quietly with code 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Coroutine, Sequence
from contextlib import asynccontextmanager
from typing import Any, NoReturn, TypeVar

import structlog

from worker.app import App, load_app
from worker.errors import ConfigError
from worker.settings import Settings, likely_typos, load_settings, mask_url

T = TypeVar("T")
EXIT_CONFIG = 2

log = structlog.get_logger("worker.cli")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="worker",
        description="Role-split background worker on arq. Commands: run (default), plan, "
        "status, health, dead, doctor.",
    )
    p.add_argument(
        "command", nargs="?", default="run", help="run | plan | status | health (default: run)"
    )
    p.add_argument("--role", help="all | leader | consumer (env WORKER_ROLE, default all)")
    p.add_argument("--instance-name", help="name in logs and status (env WORKER_INSTANCE_NAME)")
    p.add_argument("--app", help="package.module:attribute of the App (env WORKER_APP)")
    p.add_argument("--redis-url", help="redis://, rediss:// or unix:// (env WORKER_REDIS_URL)")
    p.add_argument(
        "--processes", type=int, help="run: worker processes to run (env WORKER_PROCESSES, 1)"
    )
    p.add_argument("--json", action="store_true", help="status, dead, doctor: print JSON")
    p.add_argument(
        "--retry",
        action="append",
        metavar="JOB_ID",
        help="dead: re-queue this dead-lettered job (repeatable)",
    )
    p.add_argument("--retry-all", action="store_true", help="dead: re-queue every one")
    p.add_argument("--purge", action="store_true", help="dead: forget every one")
    p.add_argument("--page", type=int, help="dead: page of 100 to list, newest first (default 1)")
    p.add_argument("--host", help="web: address to listen on (env WORKER_WEB_HOST, 127.0.0.1)")
    p.add_argument("--port", type=int, help="web: port (env WORKER_WEB_PORT, 8090)")
    p.add_argument(
        "--no-auth", action="store_true", help="web: viewing without the token (actions need it)"
    )
    p.add_argument("--force", action="store_true", help="handoff: ask even with no standby")
    return p


def _fail(message: str) -> NoReturn:
    print(f"worker: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_CONFIG)


def _stdout_closed() -> NoReturn:
    """Whoever read stdout went away (``status | head -1``): exit quietly with 1, as the Python
    docs recommend. stdout now points at devnull so the interpreter's final flush cannot fail
    again. (SIGPIPE stays ignored, as Python sets it: a broken Redis socket must raise, never
    kill the process.)"""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    raise SystemExit(1)


def _run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on uvloop when it is installed, else the default loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on CPython/Linux
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m worker`` and the ``worker`` console script."""
    args = _parser().parse_args(argv)
    commands = {
        "run": cmd_run,
        "plan": cmd_plan,
        "status": cmd_status,
        "health": cmd_health,
        "dead": cmd_dead,
        "doctor": cmd_doctor,
        "web": cmd_web,
        "handoff": cmd_handoff,
    }
    if args.command not in commands:
        _fail(f"unknown command {args.command!r}; use one of: {', '.join(commands)}")
    try:
        settings = load_settings(
            role=args.role,
            instance_name=args.instance_name,
            app=args.app,
            redis_url=args.redis_url,
            processes=args.processes,
        )
        code = commands[args.command](settings, args)
        sys.stdout.flush()  # inside the try: a closed pipe surfaces here, not at exit
    except ConfigError as exc:
        _fail(str(exc))
    except BrokenPipeError:
        if args.command == "run":
            raise  # run prints nothing on stdout: this is a real error
        _stdout_closed()
    raise SystemExit(code)


def _setup_logging(settings: Settings) -> None:
    from worker.logs import configure_logging

    # Lines from the main task say component=runtime; each component's task rebinds its name.
    configure_logging(
        settings.log_level,
        settings.log_format,
        role=settings.role,
        instance=settings.instance_name,
        component="runtime",
    )
    logging.captureWarnings(True)


def cmd_plan(settings: Settings, _: argparse.Namespace) -> int:
    """Print which components the role enables and disables; no Redis needed."""
    from worker.roles import plan

    app = load_app(settings.app)
    p = plan(settings.role, app, settings)
    print(f"instance: {settings.instance_name}")
    print(f"app: {settings.app}")
    print("\n".join(p.lines()))
    return 0


def cmd_run(settings: Settings, _: argparse.Namespace) -> int:
    """Run a worker process in its role until SIGTERM/SIGINT."""
    from worker.runtime import Runtime

    _setup_logging(settings)
    for warning in likely_typos():
        log.warning(warning)
    app = load_app(settings.app)
    embedded = None
    url = settings.redis_url
    if url is None:
        if settings.role != "all":
            raise ConfigError(
                f"WORKER_REDIS_URL is required for role {settings.role!r}: a private embedded "
                "server cannot be shared between processes (only --role all runs one)"
            )
        from worker.embedded import EmbeddedServer

        embedded = EmbeddedServer()
        url = embedded.start()
        n = settings.processes
        who = "for this process" if n == 1 else f"shared by the {n} worker processes of this run"
        log.warning(
            f"NO WORKER_REDIS_URL: STARTED A PRIVATE EMBEDDED REDIS SERVER {who} "
            "only; its data is deleted on exit. Set WORKER_REDIS_URL for anything real.",
            redis=url,
        )
    try:
        if settings.processes > 1:  # a parent: N children, each a Runtime (worker.processes)
            from worker.processes import run_processes

            return run_processes(settings, redis_url=url, environ=os.environ)
        return _run_async(Runtime(settings, app, redis_url=url).run())
    finally:
        if embedded is not None:
            embedded.stop()


def cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    """Print the cluster's state from Redis."""
    if settings.redis_url is None:
        raise ConfigError("WORKER_REDIS_URL is required for status (which Redis to read?)")
    app = load_app(settings.app)
    return _run_async(_status(settings, app, as_json=args.json or not sys.stdout.isatty()))


@asynccontextmanager
async def _admin_redis(settings: Settings, what: str) -> AsyncIterator[tuple[Any, Any]]:
    """A short-lived client for an admin command; Redis errors become one-line ConfigErrors."""
    from worker import keys as K
    from worker.client import connect_redis
    from worker.serializer import get_serializer

    if settings.redis_url is None:
        raise ConfigError(f"WORKER_REDIS_URL is required for {what} (which Redis to read?)")
    keys = K.Keys(settings.key_prefix)
    ser, de = get_serializer("msgpack")  # admin commands copy payloads as raw bytes
    redis = connect_redis(settings.redis_url, queue_name=keys.queue, serialize=ser, deserialize=de)
    try:
        yield redis, keys
    except (ConfigError, BrokenPipeError):  # BrokenPipeError: printing into a closed pipe
        raise
    except Exception as exc:
        raise ConfigError(
            f"{what}: cannot use Redis at {mask_url(settings.redis_url)}: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    finally:
        await redis.aclose(close_connection_pool=True)


async def _status(settings: Settings, app: App, *, as_json: bool) -> int:
    from worker import status

    async with _admin_redis(settings, "status") as (redis, keys):
        data = await status.collect(redis, keys, app, allow_eviction=settings.allow_eviction)
    print(json.dumps(data, indent=2) if as_json else status.render(data))
    return 0


def cmd_dead(settings: Settings, args: argparse.Namespace) -> int:
    """List, re-queue or purge dead-lettered jobs."""
    return _run_async(_dead(settings, args))


async def _dead(settings: Settings, args: argparse.Namespace) -> int:
    from worker import dead

    async with _admin_redis(settings, "dead") as (redis, keys):
        if args.purge:
            print(f"purged {await dead.purge_dead(redis, keys)} dead-lettered jobs")
            return 0
        ids = list(args.retry or [])
        if args.retry_all:
            ids += await dead.all_dead_ids(redis, keys)
        if ids:
            ok = True
            for job_id in ids:  # one at a time: a long list never sits in memory twice
                outcome = await dead.retry_dead(redis, keys, job_id)
                ok = ok and outcome == "requeued"
                print(f"{job_id}: {outcome}")
            return 0 if ok else 1
        page = max(1, args.page or 1)
        records = await dead.list_dead(redis, keys, limit=dead.PAGE, offset=(page - 1) * dead.PAGE)
        total = await dead.count_dead(redis, keys)
    if args.json or not sys.stdout.isatty():
        print(json.dumps(records, indent=2))
    else:
        for r in records:
            size = f"{r.get('size')} B" if r.get("size") is not None else "?"
            print(f"{r.get('job_id')}  {r.get('reason')}  ({size}, instance {r.get('instance')})")
        pages = max(1, -(-total // dead.PAGE))
        print(f"page {page} of {pages}: {len(records)} of {total} dead-lettered jobs shown")
    return 0


def cmd_doctor(settings: Settings, args: argparse.Namespace) -> int:
    """The N-replica acceptance checklist (``worker.doctor``); exit 1 if a check fails."""
    from worker import doctor

    app = load_app(settings.app)

    async def run() -> doctor.Report:
        async with _admin_redis(settings, "doctor") as (redis, keys):
            limits = doctor.Limits.from_settings(settings)
            return await doctor.diagnose(redis, keys, app, limits=limits)

    report = _run_async(run())
    print(json.dumps(report.to_json(), indent=2) if args.json else doctor.render(report))
    return 0 if report.ok else 1


def cmd_web(settings: Settings, args: argparse.Namespace) -> int:
    """The operator console (``worker.web``) until SIGTERM/SIGINT."""
    from worker.web import serve

    if settings.redis_url is None:
        raise ConfigError("WORKER_REDIS_URL is required for web (which Redis to show?)")
    _setup_logging(settings)
    auth = False if args.no_auth else None
    app = load_app(settings.app)
    return _run_async(serve(settings, app, host=args.host, port=args.port, auth=auth))


def cmd_handoff(settings: Settings, args: argparse.Namespace) -> int:
    """Ask the leader for a planned handoff to a standby (``worker.actions``)."""
    from worker.actions import handoff_command

    return _run_async(handoff_command(settings, load_app(settings.app), force=args.force))


def cmd_health(settings: Settings, _: argparse.Namespace) -> int:
    """Exit 0 if this host's worker answers ``/healthz`` with 200, else 1."""
    if not settings.health_port:
        print("health server disabled (WORKER_HEALTH_PORT=0)", file=sys.stderr)
        return 1
    host = "127.0.0.1" if settings.health_host in ("0.0.0.0", "", "::") else settings.health_host
    # --processes N: process i listens on WORKER_HEALTH_PORT + i; every one must be healthy
    ports = [settings.health_port + i for i in range(settings.processes)]
    return max(_healthz(f"http://{host}:{port}/healthz") for port in ports)


def _healthz(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            print(resp.read().decode())
            return 0 if resp.status == 200 else 1
    except urllib.error.HTTPError as exc:
        print(exc.read().decode() or str(exc), file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1
