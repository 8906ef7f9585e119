"""``status``, ``doctor`` and the ``dead`` listing: the cluster's read model, printed."""

from __future__ import annotations

import argparse
import json

from worker.app import App
from worker.cli.common import run_async
from worker.consumer import dead
from worker.core.terminal import safe, say
from worker.ops import admin, doctor, snapshot, status
from worker.settings import Settings


def cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    """Print the cluster's state from Redis."""
    return run_async(show_status(settings, None, as_json=args.json))


async def show_status(settings: Settings, app: App | None, *, as_json: bool) -> int:
    """``status`` of ``app`` (``None``: the one the live instances run, see
    ``worker.ops.admin``)."""
    async with admin.connect(settings, "status") as a:
        app = app or await admin.resolve_app(settings, a.store)
        snap = await snapshot.read(
            a.store, app, checks=False, shards=a.shards.stores if a.shards else ()
        )
    data = status.view(snap, app, allow_eviction=settings.allow_eviction)
    admin.flush_notes()
    say(json.dumps(data, indent=2) if as_json else status.render(data))
    return 0


def cmd_doctor(settings: Settings, args: argparse.Namespace) -> int:
    """The N-replica acceptance checklist (``worker.ops.doctor``); exit 1 if a check fails."""

    async def run() -> doctor.Report:
        async with admin.connect(settings, "doctor") as a:
            app = await admin.resolve_app(settings, a.store)
            snap = await snapshot.read(a.store, app, shards=a.shards.stores if a.shards else ())
        return doctor.judge(snap, app, doctor.Limits.from_settings(settings))

    report = run_async(run())
    admin.flush_notes()
    say(json.dumps(report.to_json(), indent=2) if args.json else doctor.render(report))
    return 0 if report.ok else 1


def cmd_dead(settings: Settings, args: argparse.Namespace) -> int:
    """List dead-lettered jobs; re-queue or purge them through the operations' door."""
    if args.purge or args.retry or args.retry_all:
        from worker.cli.operate import dead_action

        return run_async(dead_action(settings, args))
    return run_async(_list_dead(settings, args))


async def _list_dead(settings: Settings, args: argparse.Namespace) -> int:
    async with admin.connect(settings, "dead") as a:
        admin.flush_notes()
        page = max(1, args.page or 1)
        records = await dead.list_dead(a.store, limit=dead.PAGE, offset=(page - 1) * dead.PAGE)
        total = await dead.count_dead(a.store)
    if args.json:
        say(json.dumps(records, indent=2))
        return 0
    for r in records:
        size = f"{r.get('size')} B" if r.get("size") is not None else "?"
        job_id, reason, instance = (
            safe(str(r.get(k)), one_line=True) for k in ("job_id", "reason", "instance")
        )
        say(f"{job_id}  {reason}  ({size}, instance {instance})")
    pages = max(1, -(-total // dead.PAGE))
    say(f"page {page} of {pages}: {len(records)} of {total} dead-lettered jobs shown")
    return 0
