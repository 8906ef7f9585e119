"""The console's actions on run-time schedules: ``POST /api/schedules/upsert`` (``{"name",
"task", "args": [...], "kwargs": {...}, "cron" | "every", "tz", "catch_up", "catch_up_limit",
"overlap"}``: create or edit), ``/api/schedules/remove``, ``/api/schedules/pause``,
``/api/schedules/resume`` and ``/api/schedules/trigger`` (``{"name"}``). Each is a
:class:`~worker.ops.actions.Operations` call made by the console's action handler (token,
same-origin check and audit log like every action). The rows are ``status``'s ``schedules``
(:mod:`worker.ops.schedules_view`), in ``GET /api/overview``."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from worker.ops.actions import Operations, Outcome
from worker.ops.schedule_actions import OPTIONS
from worker.web.auth import Handler

Action = Callable[[Operations, dict[str, Any]], Awaitable[Outcome]]


def _bad(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=json.dumps({"error": message}), content_type="application/json")


def _name(body: dict[str, Any]) -> str:
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise _bad('name the schedule: {"name": "<name>"}')
    return name


async def upsert(ops: Operations, body: dict[str, Any]) -> Outcome:
    task = body.get("task")
    if not isinstance(task, str) or not task:
        raise _bad('name the task: {"task": "<task>"}')
    options = {k: body[k] for k in OPTIONS if body.get(k) not in (None, "")}
    args, kwargs = body.get("args") or [], body.get("kwargs") or {}
    return await ops.schedule_upsert(_name(body), task, args, kwargs, **options)


async def remove(ops: Operations, body: dict[str, Any]) -> Outcome:
    return await ops.schedule_remove(_name(body))


async def pause(ops: Operations, body: dict[str, Any]) -> Outcome:
    return await ops.schedule_pause(_name(body))


async def resume(ops: Operations, body: dict[str, Any]) -> Outcome:
    return await ops.schedule_pause(_name(body), paused=False)


async def trigger(ops: Operations, body: dict[str, Any]) -> Outcome:
    return await ops.schedule_trigger(_name(body))


def add_routes(router: web.UrlDispatcher, action: Callable[[Action], Handler]) -> None:
    """The routes above, each wrapped by the console's ``action`` handler maker."""
    for name, run in [
        ("upsert", upsert), ("remove", remove), ("pause", pause), ("resume", resume),
        ("trigger", trigger),
    ]:  # fmt: skip
        router.add_post(f"/api/schedules/{name}", action(run))
