"""``jobs`` and ``job``: the jobs read model (:mod:`worker.ops.jobsview`) printed, and ``job ID
--retry`` / ``--cancel``, one :class:`~worker.ops.actions.Operations` call each (audited)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any

from worker.cli.common import run_async
from worker.cli.operate import operations
from worker.core.serializer import get_serializer
from worker.core.terminal import safe, say
from worker.ops import admin, jobsview
from worker.settings import Settings

#: How long ``job ID --cancel`` waits for a running job to stop (the bound is 2 s).
CANCEL_WAIT_S = 5.0


def cmd_jobs(settings: Settings, args: argparse.Namespace) -> int:
    """One page of jobs in a state, as a table or JSON."""
    return run_async(_jobs(settings, args))


async def _jobs(settings: Settings, args: argparse.Namespace) -> int:
    async with admin.connect(settings, "jobs") as a:
        app = await admin.resolve_app(settings, a.store)
        try:
            page = await jobsview.list_jobs(
                a.store,
                state=args.state,
                queue=args.queue,
                task=args.task,
                search=args.search,
                limit=args.limit,
                cursor=args.cursor,
                queues=app.queue_names(),
                deserialize=get_serializer(settings.serializer)[1],
                shards=a.shards.stores if a.shards else (),
            )
        except ValueError as exc:
            say(f"jobs: {exc}")
            return 1
    admin.flush_notes()
    if args.json:
        say(json.dumps(page.to_json(), indent=2))
        return 0
    for j in page.items:
        when = j.finished_ms if args.state in ("failed", "done") else j.due_ms
        cols = [j.job_id, j.state, j.task or "?", j.queue or "?", _time(when), j.args or ""]
        say("  ".join(safe(str(c), one_line=True) for c in cols))
    more = f"; more: --cursor {page.next_cursor}" if page.next_cursor else ""
    say(f"{len(page.items)} {args.state} job(s) shown ({page.scanned} read){more}")
    return 0


def cmd_job(settings: Settings, args: argparse.Namespace) -> int:
    """One job's detail; ``--retry`` or ``--cancel`` it."""
    if args.retry or args.cancel:
        return run_async(_act(settings, args))
    return run_async(_detail(settings, args))


async def _detail(settings: Settings, args: argparse.Namespace) -> int:
    async with operations(settings, "job") as ops:
        d = await ops.detail(args.job_id)
    admin.flush_notes()
    if d is None:
        say(f"{args.job_id}: no such job (nothing of it is left in Redis)")
        return 1
    if args.json:
        say(json.dumps(d.to_json(), indent=2, default=str))
        return 0
    say(render(d.to_json()))
    return 0


async def _act(settings: Settings, args: argparse.Namespace) -> int:
    async with operations(settings, "job") as ops:
        outcome = await (ops.cancel_job(args.job_id) if args.cancel else ops.retry_job(args.job_id))
        admin.flush_notes()
        say(outcome.message)
        if not outcome.ok or outcome.details.get("state") != "cancelling":
            return 0 if outcome.ok else 1
        start = ops.client.clock.monotonic()
        while ops.client.clock.monotonic() - start < CANCEL_WAIT_S:
            d = await ops.detail(args.job_id)
            if d is None or d.state != "running":
                took = ops.client.clock.monotonic() - start
                say(f"{args.job_id}: {d.state if d else 'gone'} after {took:.1f} s")
                return 0
            await ops.client.clock.sleep(0.1)
    say(f"{args.job_id}: still running after {CANCEL_WAIT_S:.0f} s (is its consumer alive?)")
    return 1


def _time(value: int | None) -> str:
    if value is None:
        return "-"
    try:
        return dt.datetime.fromtimestamp(int(value) / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"  # not a time in range (a record written by someone else)


def render(d: dict[str, Any]) -> str:
    """A job's detail as lines of ``field: value`` (the traceback last, as it was)."""
    lines = []
    for key in (
        "job_id", "task", "queue", "state", "tries", "instance", "enqueued_ms", "due_ms",
        "started_ms", "finished_ms", "progress", "progress_message", "args", "kwargs",
        "result", "abort_requested", "undecodable",
    ):  # fmt: skip
        value = d.get(key)
        if value is None or value is False:
            continue
        shown = _time(value) if key.endswith("_ms") else str(value)
        lines.append(f"{key.removesuffix('_ms')}: {safe(shown, one_line=True)}")
    error = d.get("error")
    if error:
        lines.append(f"error: {safe(str(error.get('type')), one_line=True)}: "
                     f"{safe(str(error.get('message')), one_line=True)}")  # fmt: skip
        if error.get("traceback"):
            lines.append(safe(str(error["traceback"])))
    if d.get("dead"):
        lines.append(f"dead letter: {safe(str(d['dead'].get('reason')), one_line=True)}")
    return "\n".join(lines)
