"""``worker``'s entry point: parse, load the settings, run the command, map errors to exits."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

import worker.cli.cluster as cluster
import worker.cli.flows as flows
import worker.cli.jobs as jobs
import worker.cli.operate as operate
import worker.cli.process as process
import worker.cli.runtime_schedules as schedules
from worker.cli.common import fail
from worker.cli.parser import build, with_command
from worker.core.errors import ConfigError
from worker.core.terminal import say
from worker.settings import Settings, load_settings

Command = Callable[[Settings, argparse.Namespace], int]

COMMANDS: dict[str, Command] = {
    "run": process.cmd_run,
    "plan": process.cmd_plan,
    "status": cluster.cmd_status,
    "health": process.cmd_health,
    "doctor": cluster.cmd_doctor,
    "dead": cluster.cmd_dead,
    "trigger": operate.cmd_trigger,
    "pause": operate.cmd_pause,
    "resume": operate.cmd_resume,
    "web": process.cmd_web,
    "handoff": operate.cmd_handoff,
    "jobs": jobs.cmd_jobs,
    "job": jobs.cmd_job,
    "workflow": flows.cmd_workflow,
    "workflows": flows.cmd_workflows,
    "schedule": schedules.cmd_schedule,
}


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m worker`` and the ``worker`` console script."""
    _import_from_cwd()
    args = build().parse_args(with_command(sys.argv[1:] if argv is None else argv, [*COMMANDS]))
    _warn_secret_in_argv(args.redis_url)
    try:
        _arq_settings(args)
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
            from worker.core.logs import configure_logging

            configure_logging("WARNING", settings.log_format)
        code = COMMANDS[args.command](settings, args)
        sys.stdout.flush()  # inside the try: a closed pipe surfaces here, not at exit
    except ConfigError as exc:
        fail(str(exc))
    except BrokenPipeError:
        if args.command == "run":
            raise  # run prints nothing on stdout: this is a real error
        _stdout_closed()
    raise SystemExit(code)


def _arq_settings(args: argparse.Namespace) -> None:
    """``--arq-settings module:WorkerSettings``: the class is the app, and the settings it
    implies (queue, Redis, limits; :func:`worker.arqcompat.arq_environ`) are defaults in the
    environment (so the processes of ``--processes N`` get them too): a ``WORKER_*`` variable
    or a flag already given wins."""
    spec = getattr(args, "arq_settings", None)
    if not spec:
        return
    if args.app:
        raise ConfigError("--arq-settings names the app: drop --app (WORKER_APP)")
    from worker.arqcompat import arq_environ, load_class

    for name, value in arq_environ(load_class(spec)).items():
        if name == "WORKER_REDIS_URL" and (args.redis_url or os.environ.get(f"{name}_FILE")):
            continue
        os.environ.setdefault(name, value)
    os.environ["WORKER_APP"] = args.app = spec


def _import_from_cwd() -> None:
    """``--app mod:app`` is found in the current folder by the installed script too, as with
    ``python -m worker`` (whose ``sys.path`` starts with it) and as uvicorn and celery do."""
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.insert(0, cwd)


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


def _stdout_closed() -> NoReturn:
    """Whoever read stdout went away (``status | head -1``): exit quietly with 1, as the Python
    docs recommend. stdout now points at devnull so the interpreter's final flush cannot fail
    again. (SIGPIPE stays ignored, as Python sets it: a broken Redis socket must raise, never
    kill the process.)"""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    raise SystemExit(1)
