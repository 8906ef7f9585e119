"""``trigger``, ``pause``, ``resume``, ``handoff`` and the ``dead`` actions: each one call of
:class:`worker.ops.actions.Operations` (the console's door, audited), then its result printed."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Container
from contextlib import asynccontextmanager

from worker.app import App
from worker.cli.common import admin_target, run_async
from worker.client import Client
from worker.core.errors import ConfigError
from worker.core.ids import DutyKind, parse_duty
from worker.core.serializer import get_serializer
from worker.core.terminal import say
from worker.ops import admin
from worker.ops.actions import Actor, Operations
from worker.settings import Settings


@asynccontextmanager
async def operations(
    settings: Settings, what: str, *, app: App | None = None
) -> AsyncIterator[Operations]:
    """The actions on the configured cluster, on behalf of this host's user; ``app`` (else
    the one the live instances run) names what the actions may act on."""
    async with admin.connect(settings, what) as a:
        app = app or await admin.resolve_app(settings, a.store)
        serializer = get_serializer(settings.serializer)  # what the consumers read
        client = Client(
            a.redis, keys=a.keys, serialize=serializer[0], app=app, store=a.store,
            shards=a.shards, max_payload_bytes=settings.max_payload_bytes,
        )  # fmt: skip
        yield Operations(
            client,
            app,
            Actor.local(),
            serializer=serializer,
            keep_result_s=settings.keep_result_s,
        )


def cmd_trigger(settings: Settings, args: argparse.Namespace) -> int:
    """Enqueue one run of a periodic job now."""

    async def run() -> int:
        async with operations(settings, "trigger") as ops:
            job = ops.app.periodics.get(args.job)
            if job is None:
                raise ConfigError(
                    f"trigger: app {ops.app.name!r} has no periodic job {args.job!r}; it has: "
                    f"{', '.join(ops.app.periodics) or 'none'}"
                )
            outcome = await ops.trigger(args.job)
        admin.flush_notes()
        if not outcome.ok:
            say(f"{args.job}: a run for this instant is already enqueued")
            return 1
        say(f"{args.job}: enqueued {outcome.details['job']} in queue {job.queue!r}")
        return 0

    return run_async(run())


def cmd_pause(settings: Settings, args: argparse.Namespace) -> int:
    """Pause a periodic job or a poller cluster-wide."""
    return run_async(_pause(settings, args.name, pause=True))


def cmd_resume(settings: Settings, args: argparse.Namespace) -> int:
    """Resume a paused periodic job or poller."""
    return run_async(_pause(settings, args.name, pause=False))


async def _pause(settings: Settings, name: str, *, pause: bool) -> int:
    what = "pause" if pause else "resume"
    async with operations(settings, what) as ops:
        kind, bare = _duty(ops.app, name, what)
        outcome = await (ops.pause(kind, bare) if pause else ops.resume(kind, bare))
    admin.flush_notes()
    changed = outcome.details.get("changed")
    label = f"periodic job {bare!r}" if kind == "periodic" else f"poller {bare!r}"
    if pause:
        effect = "ticks are skipped, not caught up" if kind == "periodic" else "items wait"
        state = "paused" if changed else "was already paused"
        say(f"{label} {state} cluster-wide ({effect}; `worker resume {bare}` to undo)")
    else:
        say(f"{label} {'resumed' if changed else 'was not paused'}")
    return 0


def _duty(app: App, name: str, what: str) -> tuple[DutyKind, str]:
    """The kind and name of the duty ``name`` names (``periodic:NAME``/``poller:NAME``, or a
    bare name that only one kind has)."""
    parsed = parse_duty(name)
    if parsed is not None:
        kind, bare = parsed
        if bare not in (app.periodics if kind == "periodic" else app.pollers):
            raise ConfigError(f"{what}: app {app.name!r} has no {kind} {bare!r}")
        return parsed
    kinds: tuple[tuple[DutyKind, Container[str]], ...] = (
        ("periodic", app.periodics),
        ("poller", app.pollers),
    )
    found = [kind for kind, known in kinds if name in known]
    if len(found) == 1:
        return found[0], name
    if found:
        raise ConfigError(
            f"{what}: {name!r} is a periodic job and a poller; write periodic:{name} or "
            f"poller:{name}"
        )
    raise ConfigError(
        f"{what}: app {app.name!r} has no periodic job or poller {name!r}; periodic jobs: "
        f"{', '.join(app.periodics) or 'none'}; pollers: {', '.join(app.pollers) or 'none'}"
    )


async def dead_action(settings: Settings, args: argparse.Namespace) -> int:
    """``dead --purge``, ``--retry ID`` (repeatable) or ``--retry-all``."""
    # dead letters need no app: no manifest read, no note about one
    async with operations(settings, "dead", app=App("?")) as ops:
        admin.flush_notes()
        if args.purge:
            outcome = await ops.purge_dead()
            say(f"purged {outcome.details['purged']} dead-lettered jobs")
            return 0
        ids = None if args.retry_all else list(args.retry)
        outcome = await ops.requeue_dead(ids, each=lambda job_id, r: say(f"{job_id}: {r}"))
    return 0 if outcome.ok or not outcome.details["results"] else 1


def cmd_handoff(settings: Settings, args: argparse.Namespace) -> int:
    """Ask the leader for a planned handoff to a standby, wait and print who leads. Exit 0
    when the lease moved, 1 when the request was refused or nothing moved in time."""
    settings, app = run_async(admin_target(settings, "handoff"))
    return run_async(_handoff(settings, app, force=args.force))


async def _handoff(settings: Settings, app: App, *, force: bool) -> int:
    client = await Client.from_settings(settings, app=app)
    try:
        outcome = await Operations(client, app, Actor.local()).handoff(force=force)
        say(outcome.message)
        if not outcome.ok:
            return 1
        epoch = outcome.details["epoch"]
        deadline = (
            client.clock.monotonic() + settings.leader_ttl_s + settings.leader_poll_interval_s
        )
        while client.clock.monotonic() < deadline:
            lock, _ = await client.store.read_lock()
            if lock is not None and lock.epoch > epoch:
                history = await client.store.leader_history(5)
                who = next(
                    (h.instance for h in history if h.epoch == lock.epoch and h.instance),
                    "a standby",
                )
                say(f"epoch {lock.epoch} is held by {who}")
                return 0
            await client.clock.sleep(0.1)
        say("the lease did not move in time; `python -m worker status` shows who leads")
        return 1
    finally:
        await client.close()
