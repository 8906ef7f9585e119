"""The commands, their options and help: argparse, one group of commands per function."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import NoReturn

from worker.cli.common import fail
from worker.version import describe

#: Makes a subcommand parser: ``(name, summary, description)``.
AddCommand = Callable[[str, str, str], argparse.ArgumentParser]


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``worker: error: …``) and exit 2."""

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see: {self.prog} --help)")


def _common(p: argparse.ArgumentParser, *, top: bool = False) -> None:
    """Options every command takes. On the top-level parser too, so ``worker --app X status``
    works; a subcommand's copy defaults to "not given" so it never hides the top-level one."""
    default = None if top else argparse.SUPPRESS
    p.add_argument(
        "--app", default=default, help="package.module:attribute of the App (env WORKER_APP)"
    )
    p.add_argument(
        "--arq-settings",
        default=default,
        help="package.module:WorkerSettings of an arq app, run unchanged (instead of --app; "
        "docs/moving-from-arq.md)",
    )
    p.add_argument(
        "--redis-url",
        default=default,
        help="redis://, rediss://, unix://, redis+sentinel://h1:26379,h2:26379/<name>/<db> or "
        "redis+cluster://h1:7000,h2:7001 (env WORKER_REDIS_URL)",
    )


def _json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON (else a table, piped too)")


def build() -> argparse.ArgumentParser:
    """The ``worker`` parser with every command."""
    p = _Parser(
        prog="worker",
        description="Role-split background workers on arq. Without a command: run.",
        epilog="`worker COMMAND --help` shows a command's options. Settings come from "
        "WORKER_* variables (docs/configuration.md); flags win.",
    )
    _common(p, top=True)
    p.add_argument("--version", action="version", version=describe(), help="print the version")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def command(name: str, summary: str, description: str) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=summary, description=description)
        _common(c)
        return c

    _process_commands(command)
    _cluster_commands(command)
    _action_commands(command)
    _job_commands(command)
    _schedule_commands(command)
    return p


def _job_commands(command: AddCommand) -> None:
    """``jobs``, ``job``: browse jobs; retry or cancel one."""
    jobs = command(
        "jobs",
        "list jobs by state (queued, scheduled, running, failed, done)",
        "One page of jobs in a state, read in bounded pages (a filter reads at most 10 x "
        "--limit entries per call and prints a cursor to read on).",
    )
    jobs.add_argument(
        "--state",
        choices=("queued", "scheduled", "running", "failed", "done"),
        default="queued",
        help="which jobs (default queued: due now)",
    )
    jobs.add_argument("--queue", help="only this queue (default: every queue of the app)")
    jobs.add_argument("--task", help="only jobs of this task")
    jobs.add_argument("--search", metavar="TEXT", help="text in the id, task or arguments")
    jobs.add_argument("--limit", type=int, default=50, help="jobs per page (default 50, <= 500)")
    jobs.add_argument("--cursor", help="the cursor a previous page printed")
    jobs.add_argument("--json", action="store_true", help="print JSON")
    job = command(
        "job",
        "one job's detail; --retry or --cancel it",
        "Show a job (state, task, queue, tries, times, instance, progress, arguments, result "
        "or error with traceback); exit 1 if Redis holds nothing of it. --retry runs a failed "
        "or dead job again under its id; --cancel stops a running job (within 2 s by "
        "default) or takes a queued one off its queue. Both are audited.",
    )
    job.add_argument("job_id", metavar="ID", help="the job id")
    job.add_argument("--json", action="store_true", help="print JSON")
    act = job.add_mutually_exclusive_group()
    act.add_argument("--retry", action="store_true", help="run a failed or dead job again")
    act.add_argument("--cancel", action="store_true", help="cancel a queued or running job")
    flow = command(
        "workflow",
        "one workflow's state and steps; --cancel it",
        "Show a workflow (its state, each step's state, task, parents, job id, result or "
        "error); exit 1 if Redis holds nothing of it. --cancel: no step starts any more, "
        "running steps are aborted.",
    )
    flow.add_argument("workflow_id", metavar="ID", help="the workflow id")
    flow_act = flow.add_mutually_exclusive_group()
    flow_act.add_argument("--json", action="store_true", help="print JSON")
    flow_act.add_argument("--cancel", action="store_true", help="cancel the workflow")
    flows = command("workflows", "the newest workflows", "The newest workflows kept, newest first.")
    flows.add_argument("--state", choices=("running", "done", "failed", "cancelled"))
    flows.add_argument("--limit", type=int, default=50, help="workflows shown (default 50)")
    flows.add_argument("--json", action="store_true", help="print JSON")


def _process_commands(command: AddCommand) -> None:
    """``run``, ``plan``, ``health``: a worker process on this host."""
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
    health = command(
        "health",
        "exit 0 if a local worker's /healthz answers 200",
        "Probe /healthz of the worker processes on this host (each one found by the port it "
        "bound), or of the one named by --instance; with WORKER_HEALTH_PORT set, that port "
        "(containers: Docker HEALTHCHECK, exec probes).",
    )
    health.add_argument("--instance", metavar="NAME", help="the instance name to probe")


def _cluster_commands(command: AddCommand) -> None:
    """``status``, ``doctor``, ``dead``, ``web``: the cluster as Redis holds it."""
    status = command(
        "status",
        "the cluster as Redis sees it",
        "Apps, instances, leader and lease, queues, periodic jobs, pollers, initializers, "
        "per_key services, dead letters. Describes the app the live instances run (--app to "
        "choose another). Without WORKER_REDIS_URL it uses a local worker's embedded server.",
    )
    _json(status)
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


def _action_commands(command: AddCommand) -> None:
    """``trigger``, ``pause``, ``resume``, ``handoff``: operator actions."""
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
            f"{name} a periodic job, a poller or a queue, cluster-wide",
            f"{verb} a periodic job (paused: its ticks are skipped, not caught up), a poller "
            "(paused: nothing is dispatched; items wait) or a queue, queue:NAME or --all "
            "(paused: no consumer starts its jobs; enqueues go on, running jobs finish). Shown "
            "in status. NAME may be written periodic:NAME or poller:NAME when both exist.",
        )
        c.add_argument(
            "name", metavar="NAME", nargs="?", help="a periodic job, a poller or queue:NAME"
        )
        c.add_argument("--all", action="store_true", help="every queue (the duty lanes too)")
    handoff = command(
        "handoff",
        "move the leader lease to a standby (planned)",
        "Ask the leader to stop its singletons and release the lease so a standby takes over "
        "at once; waits and prints who leads (exit 1 if refused or nothing moved).",
    )
    handoff.add_argument("--force", action="store_true", help="ask even with no live standby")


def _schedule_commands(command: AddCommand) -> None:
    """``schedule add|rm|list|show|backfill``: run-time schedules."""
    p = command(
        "schedule",
        "add, change, remove, list or backfill run-time schedules",
        "Schedules made at run time (client.schedules): a task of the app once per tick of a "
        "cron (in a time zone) or an interval, ticked by the leader with the guarantees of "
        "@app.periodic. A change takes effect at the next tick, without a restart.",
    )
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = sub.add_parser("add", help="create a schedule or replace its definition")
    add.add_argument("name", metavar="NAME")
    add.add_argument("task", metavar="TASK", help="a task the app declares")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", help="five-field cron expression, e.g. '0 7 * * *'")
    when.add_argument("--every", type=float, metavar="SECONDS", help="an interval (>= 1 s)")
    add.add_argument("--tz", default="UTC", help="time zone of --cron (default UTC)")
    add.add_argument("--args", default="[]", metavar="JSON", help="positional arguments (list)")
    add.add_argument("--kwargs", default="{}", metavar="JSON", help="keyword arguments (object)")
    add.add_argument("--catch-up", default="all", choices=("all", "latest", "skip"))
    add.add_argument("--catch-up-limit", type=int, default=10)
    add.add_argument("--overlap", default="allow", choices=("allow", "skip"))
    rm = sub.add_parser("rm", help="remove a schedule (it never ticks again)")
    rm.add_argument("name", metavar="NAME")
    ls = sub.add_parser("list", help="every schedule")
    ls.add_argument("--json", action="store_true", help="print JSON")
    show = sub.add_parser("show", help="one schedule, its last tick and skipped overlaps")
    show.add_argument("name", metavar="NAME")
    show.add_argument("--json", action="store_true", help="print JSON")
    fill = sub.add_parser("backfill", help="enqueue the ticks of a past range, each once")
    fill.add_argument("name", metavar="NAME")
    fill.add_argument("--from", dest="start", required=True, help="ISO 8601 time (UTC if bare)")
    fill.add_argument("--to", dest="end", required=True, help="ISO 8601 time (UTC if bare)")


#: Options that take a value (to find the command in ``worker --app X status`` and to see
#: that ``worker --role all`` names none).
_VALUE_OPTIONS = {
    "--app", "--arq-settings", "--redis-url", "--role", "--instance-name", "--processes",
    "--health-port", "--instance", "--page", "--retry", "--host", "--port", "--state", "--queue",
    "--task", "--search", "--limit", "--cursor",
}  # fmt: skip


def with_command(argv: Sequence[str], commands: Sequence[str]) -> list[str]:
    """``argv`` with ``run`` inserted when it names no command (``worker --role all``)."""
    args = list(argv)
    i = 0
    while i < len(args):
        token = args[i]
        if token in ("-h", "--help", "--version") or token in commands:
            return args
        if token in _VALUE_OPTIONS:
            i += 2
        elif token.startswith("-"):
            i += 1
        else:
            return args  # an unknown command: argparse names it
    return ["run", *args]
