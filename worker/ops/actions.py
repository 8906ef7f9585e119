"""Operator actions, one implementation for the console and the command line.

Re-queue and purge dead letters, run a duty now, pause and resume a duty (the kinds that
allow it, :mod:`worker.duties.kinds`), ask the leader for a planned handoff. Each action returns
an :class:`Outcome` and is recorded with who asked, through what and when: one structlog line
(``operator action``) and an entry in the capped ``<prefix>audit`` list the console shows. The
work is done by the modules that own it (:mod:`worker.consumer.dead`, the kind's ``trigger``,
:meth:`Store.pause <worker.storage.Store.pause>`, :meth:`Store.request_handoff
<worker.storage.Store.request_handoff>`): the same effect whichever door an action came through.
"""

from __future__ import annotations

import asyncio
import getpass
import socket
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from worker.app import App
from worker.client import Client
from worker.consumer import dead
from worker.core import codec
from worker.core.clock import ms, on_server_time
from worker.core.dutykinds import either
from worker.core.ids import ALL_QUEUES, duty, paused_queue
from worker.core.serializer import Deserialize, Serialize, msgpack_dumps, msgpack_loads
from worker.duties import kinds
from worker.ops import jobsview
from worker.ops.jobrecords import queue_name
from worker.ops.outcome import Outcome as Outcome  # re-exported: the actions' result
from worker.ops.schedule_actions import ScheduleActions

log = structlog.get_logger("worker.actions")

#: Operator actions kept in ``<prefix>audit``.
AUDIT_KEEP = 200
#: How long a handoff request stands when no leader acts on it.
HANDOFF_REQUEST_TTL_S = 30.0
#: The component every leader candidate runs (standbys included).
CANDIDATE = "leader-election"


@dataclass(frozen=True)
class Actor:
    """Who asks: a name (as the operator gave it), the door (``web`` or ``cli``) and, for
    the console, the peer address."""

    name: str
    via: str
    remote: str | None = None

    @classmethod
    def local(cls) -> Actor:
        """The user running a command on this host (``user@host``, through ``cli``)."""
        try:
            user = getpass.getuser()
        except Exception:  # no user name in a container without one
            user = "unknown"
        return cls(f"{user}@{socket.gethostname()}", "cli")


class Operations(ScheduleActions):
    """The actions on one cluster (``client``: the workers' settings; ``app``: what they
    run), on behalf of ``actor``; those on run-time schedules in :mod:`.schedule_actions`."""

    def __init__(
        self,
        client: Client,
        app: App,
        actor: Actor,
        *,
        serializer: tuple[Serialize, Deserialize] = (msgpack_dumps, msgpack_loads),
        keep_result_s: float = 3600.0,
    ) -> None:
        self.client = client
        self.app = app
        self.actor = actor
        self.store = client.store
        #: what the consumers read and write (``WORKER_SERIALIZER``)
        self.serialize, self.deserialize = serializer
        #: how long a cancelled job's result is kept (``WORKER_KEEP_RESULT_S``)
        self.keep_result_s = keep_result_s

    # -- jobs ---------------------------------------------------------------------------------
    async def _now_ms(self) -> int:
        await on_server_time(self.client.clock, self.store.server_time_ms)
        return ms(self.client.clock.time())

    async def detail(self, job_id: str) -> jobsview.JobDetail | None:
        """``job_id``'s detail (:func:`.jobsview.job_detail`) in the queue shard it names."""
        return await jobsview.job_detail(
            self.client.shards.of(job_id),
            job_id,
            queues=self.app.queue_names(),
            deserialize=self.deserialize,
        )

    async def cancel_job(self, job_id: str) -> Outcome:
        """Cancel a job: one that has not started is taken off its queue and never starts (its
        result says ``CancelledError``, as arq's for a job aborted before it starts); a running
        one gets an abort request its consumer's claim check acts on within a quarter of its
        doubt window (1.25 s by default), ending as cancelled. Refused for
        a job that has ended or is unknown, and for another app's job (``foreign``)."""
        d = await self.detail(job_id)
        if d is not None and await self._foreign(job_id, d):
            return await self._record(self._not_ours("cancel", job_id))
        if d is None or d.state not in ("queued", "scheduled", "running"):
            msg = f"{job_id}: {'unknown' if d is None else d.state}; nothing to cancel"
            return await self._record(Outcome("cancel", job_id, ok=False, message=msg))
        now = await self._now_ms()
        running = d.state == "running"
        result = None if running else await self._cancelled_result(job_id, d.queue, now)
        found = await self.client.shards.of(job_id).cancel_queued(
            job_id,
            self.app.queue_names(),
            result=result,
            result_ttl_ms=ms(self._keep(d.task)),
            now_ms=now,
        )
        message = {
            1: f"{job_id}: cancelled before it started (taken off queue {d.queue!r})",
            2: f"{job_id}: running; asked its consumer to cancel it",
            0: f"{job_id}: it ended meanwhile; nothing to cancel",
        }[found]
        state = {1: "cancelled", 2: "cancelling", 0: "ended"}[found]
        return await self._record(
            Outcome("cancel", job_id, ok=found > 0, message=message, details={"state": state})
        )

    async def cancel_workflow(self, workflow_id: str) -> Outcome:
        """Cancel a workflow (:meth:`Client.cancel_workflow`): no step of it starts any more."""
        ok = await self.client.cancel_workflow(workflow_id)
        msg = f"{workflow_id}: {'cancelled' if ok else 'not running; nothing to cancel'}"
        return await self._record(Outcome("cancel-workflow", workflow_id, ok=ok, message=msg))

    async def _foreign(self, job_id: str, d: jobsview.JobDetail) -> bool:
        """Whether ``job_id`` is another app's job on the same server, whose per-job keys
        (``arq:job:<id>`` …) are server-wide, so an operator could name it: its id lies
        outside the app's prefix (every id the framework makes starts with it), it is in none
        of the app's queues, its result names none of them, and the app keeps no dead letter
        or failure record of it."""
        store = self.client.shards.of(job_id)
        if job_id.startswith(store.keys.prefix) or d.dead is not None:
            return False
        if d.queue in self.app.queue_names():  # in a queue of ours, or its result names one
            return False
        return await store.failure(job_id) is None

    def _not_ours(self, action: str, job_id: str) -> Outcome:
        """The refusal of an action on another app's job: nothing of it is touched."""
        return Outcome(
            action,
            job_id,
            ok=False,
            message=f"{job_id}: no such job in this app (its id is outside the key prefix "
            f"{self.store.keys.prefix!r} and no record of it is in this app's keys); "
            "nothing done",
            details={"state": "foreign"},
        )

    def _keep(self, task: str | None) -> float:
        job = self.app.tasks.get(task) if task is not None else None
        keep = getattr(job, "keep_result_s", None)
        return float(keep) if keep is not None else self.keep_result_s

    async def _cancelled_result(self, job_id: str, queue: str | None, now: int) -> bytes | None:
        """arq's result record of a job cancelled before it started (arq writes the same for
        a job aborted before its start); ``None`` when its record does not decode."""
        store = self.client.shards.of(job_id)
        rec = (await store.job_records([job_id]))[0]
        try:
            job = self.deserialize(rec.payload) if rec.payload is not None else {}
        except Exception:
            return None
        f = codec.job_fields(job)
        return codec.encode_result(
            str(f.function or "?"), tuple(f.args or ()), dict(f.kwargs or {}),
            int(f.job_try or rec.tries or 0), int(f.enqueued or now), False,
            asyncio.CancelledError(f"cancelled by {self.actor.name} ({self.actor.via})"),
            now, now, f"{job_id}:{f.function}", store.keys.queue_of(queue or "default"),
            job_id=job_id, serializer=self.serialize,
        )  # fmt: skip

    async def retry_job(self, job_id: str) -> Outcome:
        """Run an ended job again under its own id (so a unique key, a tick or a poll item
        keeps its meaning, as ``dead --retry`` does): a dead-lettered job from its dead
        letter, a failed, timed-out or cancelled one from its kept result record (its
        function and arguments). Refused for a job that is queued, running, done or unknown,
        and for another app's job (``foreign``: arq's per-job keys are server-wide)."""
        d = await self.detail(job_id)
        if d is not None and await self._foreign(job_id, d):
            return await self._record(self._not_ours("retry", job_id))
        if d is None or d.state not in ("failed", "timeout", "cancelled", "dead", "expired"):
            what = "unknown" if d is None else d.state
            hint = "" if d is None else "; retry re-runs a failed or dead job"
            return await self._record(
                Outcome("retry", job_id, ok=False, message=f"{job_id}: {what}{hint}")
            )
        if d.state == "dead" and d.dead is not None:
            result = await dead.retry_dead(self.client.shards.of(job_id), job_id)
        else:
            result = await self._rerun(job_id)
        ok = result == "requeued"
        message = f"{job_id}: {'queued again' if ok else result}"
        return await self._record(
            Outcome("retry", job_id, ok=ok, message=message, details={"result": result})
        )

    async def _rerun(self, job_id: str) -> str:
        store = self.client.shards.of(job_id)
        rec = (await store.job_records([job_id], results=True))[0]
        if rec.result is None:
            return "no result record left to run it from"
        try:
            r = codec.decode_result(rec.result, self.deserialize)
        except Exception as exc:
            return f"its result record does not decode ({type(exc).__name__})"
        queue = queue_name(r.queue_name, store.keys.prefix) or "default"
        now = await self._now_ms()
        payload = codec.encode_job(r.function, r.args, r.kwargs, now, self.serialize)
        out = await store.rerun_ended(job_id, queue, payload, codec.EXPIRES_EXTRA_MS, now)
        return {1: "requeued", 0: "live", -1: "no result record left to run it from"}[out]

    # -- dead letters -------------------------------------------------------------------------
    async def requeue_dead(
        self,
        job_ids: Sequence[str] | None = None,
        each: Callable[[str, str], None] | None = None,
    ) -> Outcome:
        """Put dead-lettered jobs back on their queue (``None``: every one), as
        ``python -m worker dead --retry ID`` / ``--retry-all`` do. ``each(job_id, result)``
        hears every job's result as it comes (``requeued``, ``missing``, ``truncated``…)."""
        ids = list(job_ids) if job_ids is not None else await self._all_dead()
        results: Counter[str] = Counter()
        failed: dict[str, str] = {}
        for job_id in ids:  # one at a time, as the CLI: each is its own script call
            outcome = await dead.retry_dead(self.client.shards.of(job_id), job_id)
            results[outcome] += 1
            if each is not None:
                each(job_id, outcome)
            if outcome != "requeued" and len(failed) < 100:
                failed[job_id] = outcome
        target = "all" if job_ids is None else _ids(ids)
        n = results["requeued"]
        message = f"re-queued {n} of {len(ids)} dead-lettered job{'s' if len(ids) != 1 else ''}"
        if failed:
            message += " (" + ", ".join(f"{k}: {v}" for k, v in sorted(results.items())) + ")"
        details = {"results": dict(results), "not_requeued": failed}
        return await self._record(
            Outcome("requeue", target, bool(ids) and not failed, message, details)
        )

    async def purge_dead(self, job_ids: Sequence[str] | None = None) -> Outcome:
        """Forget dead letters (``None``: every one, as ``dead --purge``)."""
        shards = self.client.shards  # every job is set aside in its own queue shard
        if job_ids is None:
            n = sum([await dead.purge_dead(s) for s in shards.stores])
            target = "all"
        else:
            n = sum([await s.dead_remove(ids) for s, ids in shards.group(job_ids)])
            target = _ids(job_ids)
        message = f"purged {n} dead-lettered job{'s' if n != 1 else ''}"
        return await self._record(
            Outcome("purge", target, ok=True, message=message, details={"purged": n})
        )

    async def _all_dead(self) -> list[str]:
        return [j for s in self.client.shards.stores for j in await dead.all_dead_ids(s)]

    # -- duties: run one now, pause, resume (see worker.duties.kinds) -------------------------
    async def trigger(self, name: str) -> Outcome:
        """Run duty ``name`` once now (of a kind with a ``trigger``)."""
        kind = next((k for k in kinds.triggerable() if name in k.declared(self.app)), None)
        if kind is None or kind.trigger is None:
            nouns = either([k.noun for k in kinds.triggerable()])
            return await self._record(
                Outcome("trigger", name, ok=False, message=f"no {nouns} {name!r}")
            )
        job_id = await kind.trigger(self.client, kind.declared(self.app)[name])
        enqueued = "a run for this instant is already enqueued" if job_id is None else ""
        message = f"{name}: {enqueued or f'enqueued {job_id}'}"
        return await self._record(
            Outcome(
                "trigger", name, ok=job_id is not None, message=message, details={"job": job_id}
            )
        )

    async def pause(self, kind: str, name: str) -> Outcome:
        """Pause duty ``name`` of ``kind`` cluster-wide (what that does: the kind's
        ``pause_effect``), see :meth:`Store.pause <worker.storage.Store.pause>`."""
        return await self._set_paused(kind, name, paused=True)

    async def resume(self, kind: str, name: str) -> Outcome:
        return await self._set_paused(kind, name, paused=False)

    async def _set_paused(self, kind: str, name: str, *, paused: bool) -> Outcome:
        action = "pause" if paused else "resume"
        known = next((k for k in kinds.pausable() if k.name == kind), None)
        target = duty(kind, name)
        if known is None or name not in known.declared(self.app):
            return await self._record(
                Outcome(action, target, ok=False, message=f"no {kind} {name!r}")
            )
        changed = await (self.store.pause(target) if paused else self.store.resume(target))
        state = "paused" if paused else "running"
        message = f"{target}: {state}" + ("" if changed else f" (it already was {state})")
        return await self._record(
            Outcome(action, target, ok=True, message=message, details={"changed": changed})
        )

    async def pause_queue(self, queue: str | None, *, paused: bool = True) -> Outcome:
        """Pause (``paused=False``: resume) ``queue`` (``None``: every queue) on every queue
        shard: no consumer takes its jobs from its next claim on (docs/flow-control.md)."""
        entry, now_ms = paused_queue(queue or ALL_QUEUES), await self._now_ms()
        changed = False
        for s in self.client.shards.stores:
            changed |= await (s.pause(entry) if paused else s.resume_queue(entry, now_ms))
        state = "paused" if paused else "running"
        message = f"{entry}: {state}" + ("" if changed else f" (it already was {state})")
        action, details = ("pause" if paused else "resume"), {"changed": changed}
        return await self._record(Outcome(action, entry, True, message, details))

    # -- leadership ---------------------------------------------------------------------------
    async def handoff(self, *, force: bool = False) -> Outcome:
        """Ask the leader to hand the lease over: it stops its singletons, releases the lease
        and stays a standby for a while, so another candidate takes over at once. Refused
        when no live standby would take it (``force``: ask anyway; the same process then
        leads again after its pause)."""
        lock, _ = await self.store.read_lock()
        if lock is None:
            return await self._record(
                Outcome("handoff", "leader", ok=False, message="no leader holds the lease")
            )
        standbys = [
            rec.get("name") or i
            for i, _, rec in await self.store.instances()
            if rec is not None
            and CANDIDATE in (rec.get("components") or [])
            and not rec.get("is_leader")
        ]
        if not standbys and not force:
            message = "no live standby (a leader or all process not leading) would take the lease"
            return await self._record(Outcome("handoff", f"epoch {lock.epoch}", False, message))
        epoch = await self.store.request_handoff(ms(HANDOFF_REQUEST_TTL_S))
        if epoch is None:
            return await self._record(
                Outcome("handoff", "leader", ok=False, message="no leader holds the lease")
            )
        return await self._record(
            Outcome(
                "handoff",
                f"epoch {epoch}",
                ok=True,
                message=f"asked the leader of epoch {epoch} to hand over; standbys: "
                + (", ".join(map(str, standbys)) or "none"),
                details={"epoch": epoch, "standbys": standbys},
            )
        )

    # -- the record ---------------------------------------------------------------------------
    async def _record(self, outcome: Outcome) -> Outcome:
        at_ms = ms(self.client.clock.time())
        entry = {
            "at_ms": at_ms,
            "who": self.actor.name,
            "via": self.actor.via,
            "remote": self.actor.remote,
            **{k: v for k, v in outcome.to_json().items() if k != "details"},
        }
        log.info("operator action", **{k: v for k, v in entry.items() if k != "at_ms"})
        try:
            await self.store.audit(entry, AUDIT_KEEP)
        except Exception as exc:  # the action is done; a lost log line must not undo that
            log.warning("could not record the action in Redis", error=f"{type(exc).__name__}")
        return outcome


def _ids(job_ids: Sequence[str]) -> str:
    """A short description of the job ids an action was asked for."""
    if len(job_ids) <= 3:
        return ", ".join(job_ids)
    return f"{', '.join(job_ids[:3])} and {len(job_ids) - 3} more"
