"""The operator's actions on run-time schedules (``client.schedules``), part of
:class:`~worker.ops.actions.Operations`: change (create or replace), remove, pause, resume and
run one now, each recorded like every other action (one ``operator action`` log line and an
entry of the audit log). A refused action (no such schedule, a definition ``upsert`` refuses)
is recorded too, with ``ok`` false and why."""

from __future__ import annotations

from typing import Any

from worker.client import Client
from worker.core.errors import ConfigError, UnknownTask
from worker.core.ids import duty
from worker.duties.schedules import KIND, trigger
from worker.ops.outcome import Outcome
from worker.storage.store import Store

#: What ``schedule_upsert`` takes besides the name, the task and its arguments.
OPTIONS = ("cron", "every", "tz", "catch_up", "catch_up_limit", "overlap")


class ScheduleActions:
    """Mixed into :class:`~worker.ops.actions.Operations` (which records each outcome)."""

    client: Client
    store: Store

    async def _record(self, outcome: Outcome) -> Outcome:
        raise NotImplementedError

    async def schedule_upsert(
        self,
        name: str,
        task: str,
        args: list[Any] | tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> Outcome:
        """Create schedule ``name`` or replace its definition (``options``: :data:`OPTIONS`,
        as ``client.schedules.upsert`` takes them)."""
        target = duty(KIND, name)
        unknown = sorted(set(options) - set(OPTIONS))
        try:
            if unknown:
                raise ConfigError(f"unknown schedule option(s): {', '.join(unknown)}")
            if not isinstance(args, list | tuple) or not isinstance(kwargs or {}, dict):
                raise ConfigError("args must be a list and kwargs an object")
            spec = await self.client.schedules.upsert(name, task, *args, **options, **kwargs or {})
        except (ConfigError, UnknownTask, TypeError) as exc:
            return await self._record(Outcome("schedule", target, ok=False, message=str(exc)))
        message = f"{target}: {task} {spec.describe()} (version {spec.version})"
        details = {"version": spec.version, "definition": spec.as_dict()}
        return await self._record(Outcome("schedule", target, True, message, details))

    async def schedule_remove(self, name: str) -> Outcome:
        """Remove schedule ``name``: it never ticks again."""
        gone = await self.client.schedules.remove(name)
        message = f"{duty(KIND, name)}: {'removed' if gone else 'no such schedule'}"
        return await self._record(Outcome("unschedule", duty(KIND, name), gone, message))

    async def schedule_pause(self, name: str, *, paused: bool = True) -> Outcome:
        """Pause (``paused=False``: resume) schedule ``name`` cluster-wide: its ticks are
        skipped, not caught up on resume."""
        action, target = ("pause" if paused else "resume"), duty(KIND, name)
        if await self.client.schedules.get(name) is None:
            return await self._record(Outcome(action, target, False, f"no schedule {name!r}"))
        changed = await (self.store.pause(target) if paused else self.store.resume(target))
        state = "paused" if paused else "running"
        message = f"{target}: {state}" + ("" if changed else f" (it already was {state})")
        return await self._record(Outcome(action, target, True, message, {"changed": changed}))

    async def schedule_trigger(self, name: str) -> Outcome:
        """Run schedule ``name`` once now (``ctx.tick`` is now); its ticks go on as planned."""
        target = duty(KIND, name)
        try:
            job_id = await trigger(self.client, name)
        except ConfigError as exc:
            return await self._record(Outcome("trigger", target, ok=False, message=str(exc)))
        enqueued = "a run for this instant is already enqueued" if job_id is None else ""
        message = f"{target}: {enqueued or f'enqueued {job_id}'}"
        details = {"job": job_id}
        return await self._record(Outcome("trigger", target, job_id is not None, message, details))
