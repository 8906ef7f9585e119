"""Command line: ``python -m worker COMMAND`` (also the installed ``worker`` script).

``run`` (the default) runs a worker process; ``plan`` shows what a role runs; ``status``,
``health``, ``doctor`` and ``dead`` look at the cluster; ``trigger``, ``pause`` and ``resume``
act on its schedules. ``worker COMMAND --help`` lists a command's own options.

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
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import structlog

from worker.app import App, load_app
from worker.errors import ConfigError
from worker.settings import Settings, likely_typos, load_settings
from worker.terminal import safe, say

T = TypeVar("T")
EXIT_CONFIG = 2

log = structlog.get_logger("worker.cli")

Command = Callable[[Settings, argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``worker: error: …``) and exit 2."""

    def error(self, message: str) -> NoReturn:
        _fail(f"{message} (see: {self.prog} --help)")


def _common(p: argparse.ArgumentParser, *, top: bool = False) -> None:
    """Options every command takes. On the top-level parser too, so ``worker --app X status``
    works; a subcommand's copy defaults to "not given" so it never hides the top-level one."""
    default = None if top else argparse.SUPPRESS
    p.add_argument(
        "--app", default=default, help="package.module:attribute of the App (env WORKER_APP)"
    )
    p.add_argument(
        "--redis-url",
        default=default,
        help="redis://, rediss://, unix://, redis+sentinel://h1:26379,h2:26379/<name>/<db> or "
        "redis+cluster://h1:7000,h2:7001 (env WORKER_REDIS_URL)",
    )


def _json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON (the default into a pipe)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="worker",
        description="Role-split background workers on arq. Without a command: run.",
        epilog="`worker COMMAND --help` shows a command's options. Settings come from "
        "WORKER_* variables (README: Configuration); flags win.",
    )
    _common(p, top=True)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def command(name: str, summary: str, description: str) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=summary, description=description)
        _common(c)
        return c

    run = command(
        "run",
        "run a worker process in its role (the default command)",
        "Run a worker process until SIGTERM (drains: not ready, drain delay, in-flight jobs "
        "finish) or Ctrl-C (the same, without the drain delay). A second signal exits at once. "
        "--role all without a Redis URL starts a private embedded server.",
    )
    run.add_argument("--role", help="all | leader | consumer (env WORKER_ROLE, default all)")
    run.add_argument("--instance-name", help="name in logs and status (env WORKER_INSTANCE_NAME)")
    run.add_argument(
        "--processes", type=int, help="worker processes to run (env WORKER_PROCESSES, 1)"
    )
    run.add_argument(
        "--health-port",
        type=int,
        help="probe port (env WORKER_HEALTH_PORT; default 8080, or the next free one locally)",
    )
    run.add_argument(
        "--burst",
        action="store_true",
        help="consume until no job is due, then exit (1 if a job failed); a consumer only",
    )

    plan = command(
        "plan",
        "show the components a role runs (no Redis needed)",
        "Print which components --role enables and disables for the app.",
    )
    plan.add_argument("--role", help="all | leader | consumer (env WORKER_ROLE, default all)")

    status = command(
        "status",
        "the cluster as Redis sees it",
        "Apps, instances, leader and lease, queues, periodic jobs, pollers, initializers, "
        "per_key services, dead letters. Describes the app the live instances run (--app to "
        "choose another). Without WORKER_REDIS_URL it uses a local worker's embedded server.",
    )
    _json(status)

    health = command(
        "health",
        "exit 0 if a local worker's /healthz answers 200",
        "Probe /healthz of the worker processes on this host (each one found by the port it "
        "bound), or of the one named by --instance; with WORKER_HEALTH_PORT set, that port "
        "(containers: Docker HEALTHCHECK, exec probes).",
    )
    health.add_argument("--instance", metavar="NAME", help="the instance name to probe")

    doctor = command(
        "doctor",
        "the N-replica acceptance checklist (exit 1 if a check fails)",
        "Check the live cluster: one leader, lease and epochs, eviction policy, heartbeats, "
        "versions, clocks, schedules, pollers, queue lag, dead letters, orphaned holds.",
    )
    _json(doctor)

    dead = command(
        "dead",
        "list, re-queue or purge dead-lettered jobs",
        "Without an action: list one page of dead letters, newest first.",
    )
    _json(dead)
    action = dead.add_mutually_exclusive_group()
    action.add_argument(
        "--retry", action="append", metavar="JOB_ID", help="re-queue this one (repeatable)"
    )
    action.add_argument("--retry-all", action="store_true", help="re-queue every one")
    action.add_argument("--purge", action="store_true", help="forget every one")
    dead.add_argument("--page", type=int, help="page of 100 to list (default 1)")

    trigger = command(
        "trigger",
        "run a periodic job once now",
        "Enqueue one run of a periodic job now, outside its schedule (ctx.tick is now); its "
        "recorded last tick does not move.",
    )
    trigger.add_argument("job", metavar="PERIODIC_JOB", help="the periodic job's name")

    for name, verb in (("pause", "Pause"), ("resume", "Resume")):
        c = command(
            name,
            f"{name} a periodic job or a poller, cluster-wide",
            f"{verb} a periodic job (paused: its ticks are skipped, not caught up) or a poller "
            "(paused: nothing is dispatched; items wait). Shown in status. NAME may be "
            "written periodic:NAME or poller:NAME when both exist.",
        )
        c.add_argument("name", metavar="NAME", help="a periodic job or a poller")

    web = command(
        "web",
        "the operator console (a web page on this cluster)",
        "Serve the operator console: instances, leader, periodic jobs, pollers, queues, dead "
        "letters, leadership history; token-guarded actions. Reads only Redis. Without "
        "WORKER_REDIS_URL it uses a local worker's embedded server.",
    )
    web.add_argument("--host", help="address to listen on (env WORKER_WEB_HOST, 127.0.0.1)")
    web.add_argument("--port", type=int, help="port (env WORKER_WEB_PORT, 8090; 0: any free)")
    web.add_argument(
        "--no-auth", action="store_true", help="viewing without the token (actions need it)"
    )
    web.add_argument(
        "--allow-remote-no-auth",
        action="store_true",
        help="allow --no-auth on an address other than loopback (env "
        "WORKER_WEB_ALLOW_REMOTE_NO_AUTH)",
    )

    handoff = command(
        "handoff",
        "move the leader lease to a standby (planned)",
        "Ask the leader to stop its singletons and release the lease so a standby takes over "
        "at once; waits and prints who leads (exit 1 if refused or nothing moved).",
    )
    handoff.add_argument("--force", action="store_true", help="ask even with no live standby")
    return p


#: Options that take a value (to find the command in ``worker --app X status`` and to see
#: that ``worker --role all`` names none).
_VALUE_OPTIONS = {
    "--app", "--redis-url", "--role", "--instance-name", "--processes", "--health-port",
    "--instance", "--page", "--retry", "--host", "--port",
}  # fmt: skip


def _with_command(argv: Sequence[str], commands: Sequence[str]) -> list[str]:
    """``argv`` with ``run`` inserted when it names no command (``worker --role all``)."""
    args = list(argv)
    i = 0
    while i < len(args):
        token = args[i]
        if token in ("-h", "--help") or token in commands:
            return args
        if token in _VALUE_OPTIONS:
            i += 2
        elif token.startswith("-"):
            i += 1
        else:
            return args  # an unknown command: argparse names it
    return ["run", *args]


def _warn_secret_in_argv(url: str | None) -> None:
    """A password in ``--redis-url`` is in the command line, which every user of this host
    reads (``ps``, ``/proc/<pid>/cmdline``): say so, once, and where it belongs instead."""
    from worker.settings import mask_url

    if url and mask_url(url) != url:
        say(
            "worker: warning: --redis-url carries a password, and every user of this host can "
            "read a command line (ps); put the URL in a file readable only by you and set "
            "WORKER_REDIS_URL_FILE to its path (or WORKER_REDIS_URL in the environment)",
            file=sys.stderr,
        )


def _fail(message: str) -> NoReturn:
    say(f"worker: error: {message}", file=sys.stderr)
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
    commands: dict[str, Command] = {
        "run": cmd_run,
        "plan": cmd_plan,
        "status": cmd_status,
        "health": cmd_health,
        "doctor": cmd_doctor,
        "dead": cmd_dead,
        "trigger": cmd_trigger,
        "pause": cmd_pause,
        "resume": cmd_resume,
        "web": cmd_web,
        "handoff": cmd_handoff,
    }
    args = _parser().parse_args(
        _with_command(sys.argv[1:] if argv is None else argv, list(commands))
    )
    _warn_secret_in_argv(args.redis_url)
    try:
        settings = load_settings(
            role=getattr(args, "role", None),
            instance_name=getattr(args, "instance_name", None),
            app=args.app,
            redis_url=args.redis_url,
            processes=getattr(args, "processes", None),
            health_port=getattr(args, "health_port", None),
        )
        if args.command not in ("run", "web"):
            # what the one-shot commands print is stdout's; a warning met on the way (a
            # malformed Redis entry skipped) goes to stderr (run and web configure their own)
            from worker.logs import configure_logging

            configure_logging("WARNING", settings.log_format)
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
    say(f"instance: {settings.instance_name}")
    say(f"app: {settings.app}")
    say("\n".join(p.lines()))
    return 0


def cmd_run(settings: Settings, args: argparse.Namespace) -> int:
    """Run a worker process in its role until SIGTERM/SIGINT (or, ``--burst``, until no job
    is due)."""
    from worker.runtime import Runtime

    if args.burst:
        settings = _burst_settings(settings)
    _setup_logging(settings)
    for warning in likely_typos():
        log.warning(warning)
    app = load_app(settings.app)
    embedded, announced = None, None
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
    try:
        if embedded is not None:
            announced = _announce_embedded(settings, url)
        if settings.processes > 1:  # a parent: N children, each a Runtime (worker.processes)
            from worker.processes import run_processes

            return run_processes(settings, redis_url=url, environ=os.environ)
        return _run_async(Runtime(settings, app, redis_url=url, burst=args.burst).run())
    finally:
        if embedded is not None:
            from worker import local

            local.withdraw(announced)
            embedded.stop()


def _burst_settings(settings: Settings) -> Settings:
    """``--burst`` runs a consumer: no leader duties, one process."""
    if "role" in settings.model_fields_set and settings.role != "consumer":
        raise ConfigError(
            f"--burst runs a consumer only (it drains the queue and exits); drop --role "
            f"{settings.role} (WORKER_ROLE)"
        )
    if settings.processes > 1:
        raise ConfigError("--burst runs one process; drop --processes (WORKER_PROCESSES)")
    return settings.model_copy(update={"role": "consumer"})


def _announce_embedded(settings: Settings, url: str) -> Path | None:
    """Say where the private server is, ready to paste, and tell local admin commands."""
    from worker import local

    path = local.announce("embedded", {"url": url, "instance": settings.instance_name})
    n = settings.processes
    who = "this process" if n == 1 else f"the {n} worker processes of this run"
    log.warning(
        f"NO WORKER_REDIS_URL: STARTED A PRIVATE EMBEDDED REDIS SERVER for {who} only; its "
        "data is deleted on exit. Set WORKER_REDIS_URL for anything real.",
        redis=url,
    )
    found = "" if path else "  (set it: this machine has no runtime directory for the CLI)"
    say(
        "\nworker: a private Redis for this run (deleted on exit). In a second terminal:\n"
        f"    python -m worker status          # finds it by itself{found}\n"
        f"    export WORKER_REDIS_URL={url}   # for anything else\n",
        file=sys.stderr,
        flush=True,
    )
    return path


def cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    """Print the cluster's state from Redis."""
    return _run_async(_status(settings, None, as_json=args.json or not sys.stdout.isatty()))


async def _status(settings: Settings, app: App | None, *, as_json: bool) -> int:
    """``status`` of ``app`` (``None``: the one the live instances run, see ``worker.admin``)."""
    from worker import admin, status

    async with admin.connect(settings, "status") as a:
        app = app or await admin.resolve_app(settings, a.store)
        data = await status.collect(a.redis, a.keys, app, allow_eviction=settings.allow_eviction)
    admin.flush_notes()
    say(json.dumps(data, indent=2) if as_json else status.render(data))
    return 0


def cmd_dead(settings: Settings, args: argparse.Namespace) -> int:
    """List, re-queue or purge dead-lettered jobs."""
    return _run_async(_dead(settings, args))


async def _dead(settings: Settings, args: argparse.Namespace) -> int:
    from worker import admin, dead

    async with admin.connect(settings, "dead") as a:
        admin.flush_notes()
        if args.purge:
            say(f"purged {await dead.purge_dead(a.store)} dead-lettered jobs")
            return 0
        ids = list(args.retry or [])
        if args.retry_all:
            ids += await dead.all_dead_ids(a.store)
        if ids:
            ok = True
            for job_id in ids:  # one at a time: a long list never sits in memory twice
                outcome = await dead.retry_dead(a.store, job_id)
                ok = ok and outcome == "requeued"
                say(f"{job_id}: {outcome}")
            return 0 if ok else 1
        page = max(1, args.page or 1)
        records = await dead.list_dead(a.store, limit=dead.PAGE, offset=(page - 1) * dead.PAGE)
        total = await dead.count_dead(a.store)
    if args.json or not sys.stdout.isatty():
        say(json.dumps(records, indent=2))
    else:
        for r in records:
            size = f"{r.get('size')} B" if r.get("size") is not None else "?"
            job_id, reason, instance = (
                safe(str(r.get(k)), one_line=True) for k in ("job_id", "reason", "instance")
            )
            say(f"{job_id}  {reason}  ({size}, instance {instance})")
        pages = max(1, -(-total // dead.PAGE))
        say(f"page {page} of {pages}: {len(records)} of {total} dead-lettered jobs shown")
    return 0


def cmd_doctor(settings: Settings, args: argparse.Namespace) -> int:
    """The N-replica acceptance checklist (``worker.doctor``); exit 1 if a check fails."""
    from worker import admin, doctor

    async def run() -> doctor.Report:
        async with admin.connect(settings, "doctor") as a:
            app = await admin.resolve_app(settings, a.store)
            limits = doctor.Limits.from_settings(settings)
            return await doctor.diagnose(a.redis, a.keys, app, limits=limits)

    report = _run_async(run())
    admin.flush_notes()
    say(json.dumps(report.to_json(), indent=2) if args.json else doctor.render(report))
    return 0 if report.ok else 1


def cmd_trigger(settings: Settings, args: argparse.Namespace) -> int:
    """Enqueue one run of a periodic job now."""
    from worker import admin
    from worker.client import Client
    from worker.periodic import trigger
    from worker.serializer import get_serializer

    async def run() -> int:
        async with admin.connect(settings, "trigger") as a:
            app = await admin.resolve_app(settings, a.store)
            job = app.periodics.get(args.job)
            if job is None:
                raise ConfigError(
                    f"trigger: app {app.name!r} has no periodic job {args.job!r}; it has: "
                    f"{', '.join(app.periodics) or 'none'}"
                )
            serialize = get_serializer(settings.serializer)[0]  # what the consumers read
            client = Client(a.redis, keys=a.keys, serialize=serialize, app=app, store=a.store)
            job_id = await trigger(client, job)
        admin.flush_notes()
        if job_id is None:
            say(f"{args.job}: a run for this instant is already enqueued")
            return 1
        say(f"{args.job}: enqueued {job_id} in queue {job.queue!r}")
        return 0

    return _run_async(run())


def cmd_pause(settings: Settings, args: argparse.Namespace) -> int:
    """Pause a periodic job or a poller cluster-wide."""
    return _run_async(_pause(settings, args.name, pause=True))


def cmd_resume(settings: Settings, args: argparse.Namespace) -> int:
    """Resume a paused periodic job or poller."""
    return _run_async(_pause(settings, args.name, pause=False))


async def _pause(settings: Settings, name: str, *, pause: bool) -> int:
    from worker import admin

    what = "pause" if pause else "resume"
    async with admin.connect(settings, what) as a:
        app = await admin.resolve_app(settings, a.store)
        duty = _duty(app, name, what)
        changed = await (a.store.pause(duty) if pause else a.store.resume(duty))
    admin.flush_notes()
    kind, _, bare = duty.partition(":")
    label = f"periodic job {bare!r}" if kind == "periodic" else f"poller {bare!r}"
    if pause:
        effect = "ticks are skipped, not caught up" if kind == "periodic" else "items wait"
        state = "paused" if changed else "was already paused"
        say(f"{label} {state} cluster-wide ({effect}; `worker resume {bare}` to undo)")
    else:
        say(f"{label} {'resumed' if changed else 'was not paused'}")
    return 0


def _duty(app: App, name: str, what: str) -> str:
    """``periodic:<name>`` or ``poller:<name>`` for ``name`` (which may carry the prefix)."""
    kind, sep, bare = name.partition(":")
    if sep and kind in ("periodic", "poller"):
        known = app.periodics if kind == "periodic" else app.pollers
        if bare not in known:
            raise ConfigError(f"{what}: app {app.name!r} has no {kind} {bare!r}")
        return name
    found = [f"periodic:{name}"] * (name in app.periodics) + [f"poller:{name}"] * (
        name in app.pollers
    )
    if len(found) == 1:
        return found[0]
    if found:
        raise ConfigError(
            f"{what}: {name!r} is a periodic job and a poller; write periodic:{name} or "
            f"poller:{name}"
        )
    raise ConfigError(
        f"{what}: app {app.name!r} has no periodic job or poller {name!r}; periodic jobs: "
        f"{', '.join(app.periodics) or 'none'}; pollers: {', '.join(app.pollers) or 'none'}"
    )


def cmd_health(settings: Settings, args: argparse.Namespace) -> int:
    """Exit 0 if the worker(s) asked about answer ``/healthz`` with 200, else 1."""
    from worker import local

    if args.instance is None and settings.health_port_explicit:
        if not settings.health_port:
            say("health server disabled (WORKER_HEALTH_PORT=0)", file=sys.stderr)
            return 1
        # --processes N with a configured port: process i listens on WORKER_HEALTH_PORT + i
        host = _probe_host(settings.health_host)
        ports = [settings.health_port + i for i in range(settings.processes)]
        return max(_healthz(f"http://{host}:{port}/healthz") for port in ports)
    workers = [w for w in local.discover("worker") if w.data.get("health_port")]
    if args.instance is not None:
        workers = [w for w in workers if w.data.get("instance") == args.instance]
        if not workers:
            say(f"no local worker named {args.instance!r} serves probes", file=sys.stderr)
            return 1
    if not workers:  # none announced: the default port, as before
        if not settings.health_port:
            say("health server disabled (WORKER_HEALTH_PORT=0)", file=sys.stderr)
            return 1
        host = _probe_host(settings.health_host)
        return _healthz(f"http://{host}:{settings.health_port}/healthz")
    codes = []
    for w in workers:
        host = _probe_host(str(w.data.get("health_host") or "127.0.0.1"))
        url = f"http://{host}:{w.data['health_port']}/healthz"
        if len(workers) > 1:
            say(f"{w.data.get('instance')} (pid {w.pid}):", file=sys.stderr)
        codes.append(_healthz(url))
    return max(codes)


def _probe_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def cmd_web(settings: Settings, args: argparse.Namespace) -> int:
    """The operator console (``worker.web``) until SIGTERM/SIGINT."""
    from worker.web import serve
    from worker.web.app import check_auth, check_exposure

    _setup_logging(settings)
    auth = False if args.no_auth else None
    remote = True if args.allow_remote_no_auth else None
    view_needs_token = settings.web_auth if auth is None else auth
    check_auth(settings.web_token, view_needs_token)  # before Redis
    check_exposure(
        args.host or settings.web_host,
        view_needs_token,
        settings.web_allow_remote_no_auth if remote is None else remote,
    )
    settings, app = _run_async(_admin_target(settings, "web"))
    return _run_async(
        serve(settings, app, host=args.host, port=args.port, auth=auth, allow_remote=remote)
    )


def cmd_handoff(settings: Settings, args: argparse.Namespace) -> int:
    """Ask the leader for a planned handoff to a standby (``worker.actions``)."""
    from worker.actions import handoff_command

    settings, app = _run_async(_admin_target(settings, "handoff"))
    return _run_async(handoff_command(settings, app, force=args.force))


async def _admin_target(settings: Settings, what: str) -> tuple[Settings, App]:
    """The Redis (configured, else the local embedded server) and the app (the one the live
    instances run, unless ``--app``) that a long-lived admin command works on."""
    from worker import admin

    async with admin.connect(settings, what) as a:
        app = await admin.resolve_app(settings, a.store)
    admin.flush_notes()
    return settings.model_copy(update={"redis_url": a.url}), app


def _healthz(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            say(resp.read().decode(errors="replace"))
            return 0 if resp.status == 200 else 1
    except urllib.error.HTTPError as exc:
        say(exc.read().decode(errors="replace") or str(exc), file=sys.stderr)
        return 1
    except OSError as exc:
        say(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1
