"""``worker schedule add|rm|list|show|pause|resume|trigger|backfill``: run-time schedules
(``client.schedules``)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any

from worker.cli.common import run_async
from worker.cli.operate import operations
from worker.core.clock import ms
from worker.core.errors import ConfigError
from worker.core.schedule_spec import ScheduleSpec
from worker.core.terminal import say
from worker.duties.schedules import backfill
from worker.ops import admin
from worker.ops.actions import Operations
from worker.settings import Settings


def cmd_schedule(settings: Settings, args: argparse.Namespace) -> int:
    return run_async(_schedule(settings, args))


async def _schedule(settings: Settings, args: argparse.Namespace) -> int:
    async with operations(settings, f"schedule {args.action}") as ops:
        admin.flush_notes()
        if args.action in ("add", "rm"):
            return await _change(ops, args)
        schedules = ops.client.schedules
        if args.action == "list":
            found = await schedules.list()
            if args.json:
                say(json.dumps([s.as_dict() for s in found]))
            for s in [] if args.json else found:
                say(f"{s.name}  {_line(s)}")
            if not found and not args.json:
                say("no run-time schedules")
            return 0
        if args.action == "show":
            return await _show(ops.client, args)
        if args.action in ("pause", "resume", "trigger"):
            return await _control(ops, args.action, args.name)
        start, end = _time(args.start), _time(args.end)
        done, total = await backfill(ops.client, args.name, start, end)
        say(f"schedule {args.name!r}: {total} ticks in the range, {done} enqueued")
        return 0


async def _show(client: Any, args: argparse.Namespace) -> int:
    spec = await client.schedules.get(args.name)
    if spec is None:
        say(f"no schedule named {args.name!r}")
        return 1
    last = (await client.store.schedule_state()).get(spec.name)
    overlaps = (await client.store.schedule_overlaps()).get(spec.name, 0)
    data = {**spec.as_dict(), "last_tick_ms": last, "overlaps_skipped": overlaps}
    if args.json:
        say(json.dumps(data))
        return 0
    for key, value in data.items():
        say(f"{key:17} {value}")
    say(f"{'schedule':17} {_line(spec)}")
    return 0


async def _change(ops: Operations, args: argparse.Namespace) -> int:
    """``add`` or ``rm``: an operator action (recorded in the audit log, as the console's)."""
    if args.action == "rm":
        outcome = await ops.schedule_remove(args.name)
        say(outcome.message)
        return 0 if outcome.ok else 1
    outcome = await ops.schedule_upsert(
        args.name, args.task,
        _json(args.args, list, "--args"), _json(args.kwargs, dict, "--kwargs"),
        cron=args.cron, every=args.every, tz=args.tz, catch_up=args.catch_up,
        catch_up_limit=args.catch_up_limit, overlap=args.overlap,
    )  # fmt: skip
    if not outcome.ok:
        raise ConfigError(outcome.message)
    spec = await ops.client.schedules.get(args.name)
    say(f"schedule {args.name!r}: {_line(spec) if spec else '?'} ({outcome.message})")
    return 0


async def _control(ops: Operations, action: str, name: str) -> int:
    """``pause``, ``resume`` or ``trigger``: an operator action (recorded in the audit log)."""
    if action == "trigger":
        outcome = await ops.schedule_trigger(name)
    else:
        outcome = await ops.schedule_pause(name, paused=action == "pause")
    say(outcome.message)
    return 0 if outcome.ok else 1


def _line(s: ScheduleSpec) -> str:
    call = ", ".join(
        [*(json.dumps(a) for a in s.args), *(f"{k}={v!r}" for k, v in s.kwargs.items())]
    )
    return f"{s.task}({call}) {s.describe()}, catch_up {s.catch_up}, overlap {s.overlap}"


def _json(text: str, kind: type, flag: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{flag}: not JSON ({exc})") from None
    if not isinstance(value, kind):
        raise ConfigError(f"{flag}: a JSON {'list' if kind is list else 'object'}")
    return value


def _time(text: str) -> int:
    try:
        at = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"not an ISO 8601 time: {text!r}") from None
    return ms((at if at.tzinfo else at.replace(tzinfo=dt.UTC)).timestamp())
