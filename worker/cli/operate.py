"""``trigger``, ``pause``, ``resume``, ``handoff`` and the ``dead`` actions: each one call of
:class:`worker.ops.actions.Operations` (the console's door, audited), then its result printed."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from worker.app import App
from worker.cli.common import admin_target, run_async
from worker.client import Client
from worker.core.dutykinds import Kind, either
from worker.core.errors import ConfigError
from worker.core.ids import ALL_QUEUES, parse_duty
from worker.core.jobdefs import with_lanes
from worker.core.serializer import get_serializer
from worker.core.terminal import say
from worker.duties import kinds
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
            a.redis, keys=a.keys, serialize=serializer[0], deserialize=serializer[1], app=app,
            store=a.store, shards=a.shards, max_payload_bytes=settings.max_payload_bytes,
        )  # fmt: skip
        yield Operations(
            client,
            app,
            Actor.local(),
            serializer=serializer,
            keep_result_s=settings.keep_result_s,
        )


def cmd_trigger(settings: Settings, args: argparse.Namespace) -> int:
    """Enqueue one run of a duty now (of a kind that can be run now)."""

    async def run() -> int:
        async with operations(settings, "trigger") as ops:
            known = [(k, k.declared(ops.app)) for k in kinds.triggerable()]
            job = next((d[args.job] for _, d in known if args.job in d), None)
            if job is None:
                nouns = either([k.noun for k, _ in known])
                names = ", ".join(n for _, d in known for n in d)
                raise ConfigError(
                    f"trigger: app {ops.app.name!r} has no {nouns} {args.job!r}; it has: "
                    f"{names or 'none'}"
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
    """Pause a periodic job, a poller or a queue (``queue:NAME``, ``--all``) cluster-wide."""
    return run_async(_pause(settings, args, pause=True))


def cmd_resume(settings: Settings, args: argparse.Namespace) -> int:
    """Resume a paused periodic job, poller or queue."""
    return run_async(_pause(settings, args, pause=False))


async def _pause(settings: Settings, args: argparse.Namespace, *, pause: bool) -> int:
    what, name = ("pause" if pause else "resume"), args.name
    if args.all or (name or "").startswith("queue:"):
        return await _pause_queue(settings, None if args.all else name[6:], what)
    if not name:
        raise ConfigError(f"{what}: name {kinds.each(kinds.pausable())} or queue:NAME (or --all)")
    async with operations(settings, what) as ops:
        kind, bare = _duty(ops.app, name, what)
        outcome = await (ops.pause(kind.name, bare) if pause else ops.resume(kind.name, bare))
    admin.flush_notes()
    changed = outcome.details.get("changed")
    label = f"{kind.noun} {bare!r}"
    if pause:
        state = "paused" if changed else "was already paused"
        say(f"{label} {state} cluster-wide ({kind.pause_effect}; `worker resume {bare}` to undo)")
    else:
        say(f"{label} {'resumed' if changed else 'was not paused'}")
    return 0


async def _pause_queue(settings: Settings, queue: str | None, what: str) -> int:
    """``pause|resume queue:NAME`` or ``--all``."""
    if queue is not None and (not queue or queue == ALL_QUEUES):
        raise ConfigError(f"{what}: name a queue (queue:NAME) or write --all")
    async with operations(settings, what) as ops:
        outcome = await ops.pause_queue(queue, paused=what == "pause")
        known = ops.app.queue_names()
    admin.flush_notes()
    label = f"queue {queue!r}" if queue is not None else "every queue"
    if queue is not None and queue not in with_lanes(known):  # a queue or its duty lane
        say(f"note: app {ops.app.name!r} has no task on queue {queue!r} ({', '.join(known)})")
    if what == "pause":
        state = "paused" if outcome.details["changed"] else "was already paused"
        say(f"{label} {state} cluster-wide (consumers start none of its jobs from their next "
            f"claim; enqueues go on; `worker resume {outcome.target}` to undo)")  # fmt: skip
    else:
        say(f"{label} {'resumed' if outcome.details['changed'] else 'was not paused'}")
    return 0


def _duty(app: App, name: str, what: str) -> tuple[Kind, str]:
    """The kind and name of the duty ``name`` names (``<kind>:NAME``, or a bare name that only
    one kind that pauses has)."""
    parsed = parse_duty(name, (k.name for k in kinds.pausable()))
    if parsed is not None:
        kind_name, bare = parsed
        kind = next(k for k in kinds.pausable() if k.name == kind_name)
        if bare not in kind.declared(app):
            raise ConfigError(f"{what}: app {app.name!r} has no {kind_name} {bare!r}")
        return kind, bare
    pausable = kinds.pausable()
    found = [k for k in pausable if name in k.declared(app)]
    if len(found) == 1:
        return found[0], name
    if found:
        raise ConfigError(
            f"{what}: {name!r} is a {' and a '.join(k.noun for k in found)}; write "
            + " or ".join(f"{k.name}:{name}" for k in found)
        )
    nouns = either([k.noun for k in pausable])
    listed = "; ".join(f"{k.plural}: {', '.join(k.declared(app)) or 'none'}" for k in pausable)
    raise ConfigError(f"{what}: app {app.name!r} has no {nouns} {name!r}; {listed}")


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
