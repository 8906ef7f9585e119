"""``workflow ID [--json|--cancel]`` and ``workflows --state ...``: workflows as the store reads
them (:mod:`worker.storage.workflows`), printed."""

from __future__ import annotations

import argparse
import datetime as dt
import json

from worker.cli.common import run_async
from worker.cli.operate import operations
from worker.core.serializer import get_serializer
from worker.core.terminal import safe, say
from worker.ops import admin
from worker.settings import Settings


def cmd_workflow(settings: Settings, args: argparse.Namespace) -> int:
    """One workflow: its state and every step's; ``--cancel`` cancels it."""
    return run_async(_workflow(settings, args))


async def _workflow(settings: Settings, args: argparse.Namespace) -> int:
    deserialize = get_serializer(settings.serializer)[1]
    if args.cancel:  # through the one door for operator actions: audited
        async with operations(settings, "workflow") as ops:
            outcome = await ops.cancel_workflow(args.workflow_id)
        admin.flush_notes()
        say(outcome.message)
        return 0 if outcome.ok else 1
    async with admin.connect(settings, "workflow") as a:
        info = await a.store.read_workflow(args.workflow_id, deserialize)
    admin.flush_notes()
    if info is None:
        say(f"{args.workflow_id}: no such workflow (unknown, or expired)")
        return 1
    if args.json:
        say(json.dumps(info.as_json(), indent=2, default=str))
        return 0
    say(f"workflow {safe(info.id, one_line=True)}: {info.state} (on_failure={info.on_failure}, "
        f"created {_time(info.created_ms)})")  # fmt: skip
    for s in info.steps:
        after = ",".join(str(p) for p in s.parents) or "-"
        tail = s.error if s.error is not None else repr(s.result) if s.state == "done" else ""
        cols = [str(s.index), s.state, s.function, f"after {after}", s.job_id, tail]
        say("  ".join(safe(c, one_line=True) for c in cols))
    return 0


def cmd_workflows(settings: Settings, args: argparse.Namespace) -> int:
    """The newest workflows kept, in a state or every state."""
    return run_async(_workflows(settings, args))


async def _workflows(settings: Settings, args: argparse.Namespace) -> int:
    async with admin.connect(settings, "workflows") as a:
        rows = await a.store.list_workflows(args.limit if args.state is None else 10 * args.limit)
    admin.flush_notes()
    shown = [r for r in rows if args.state is None or r[1] == args.state][: args.limit]
    if args.json:
        say(json.dumps([{"id": w, "state": s, "created_ms": c} for w, s, c in shown], indent=2))
        return 0
    for wid, state, created in shown:
        say("  ".join([safe(wid, one_line=True), state, _time(created)]))
    say(f"{len(shown)} workflow(s) shown")
    return 0


def _time(value: int) -> str:
    return dt.datetime.fromtimestamp(value / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
