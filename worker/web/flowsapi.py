"""The console's Workflows view: ``GET /api/workflows?state=&limit=`` (the newest kept),
``GET /api/workflows/{workflow_id}`` (one in full: its steps, their jobs and the graph) and
``POST /api/workflows/cancel`` (``{"id": "<workflow id>"}``).

Reads go through the workflows read model (:mod:`worker.ops.workflowsview`); cancel is
:meth:`Operations.cancel_workflow <worker.ops.actions.Operations.cancel_workflow>`, made by the
console's action handler (token, operator, audit: as every action). Each answer carries the Redis
server's ``now_ms``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from aiohttp import web

from worker.client import Client
from worker.core.clock import ms, on_server_time
from worker.ops import workflowsview
from worker.ops.actions import Operations, Outcome
from worker.web.auth import Handler
from worker.web.jsonout import standard_json


class ConsoleState(Protocol):
    """What the view reads with: the workers' client and their serializer's name (the
    console's :class:`worker.web.api.ConsoleState` is one)."""

    @property
    def client(self) -> Client: ...
    @property
    def serializer(self) -> str: ...


def bad_request(message: str) -> web.HTTPBadRequest:
    """A 400 with ``{"error": message}``."""
    return web.HTTPBadRequest(text=json.dumps({"error": message}), content_type="application/json")


async def _now_ms(state: ConsoleState) -> int:
    client = state.client
    await on_server_time(client.clock, client.store.server_time_ms)
    return ms(client.clock.time())


Guarded = Callable[[Awaitable[Any]], Awaitable[Any]]
Action = Callable[[Callable[[Operations, dict[str, Any]], Awaitable[Outcome]]], Handler]


async def workflows_page(state: ConsoleState, query: Mapping[str, str]) -> dict[str, Any]:
    """The newest workflows kept, in ``state`` (or every state), ``limit`` of them; a bad
    filter is a 400."""
    chosen = (query.get("state") or "").strip() or None
    try:
        limit = int(query.get("limit") or workflowsview.LIMIT)
    except ValueError:
        raise bad_request("limit: a number") from None
    try:
        items = await workflowsview.list_workflows(state.client.store, chosen, limit)
    except ValueError as exc:  # a bad state or limit
        raise bad_request(str(exc)) from None
    return {"now_ms": await _now_ms(state), "state": chosen, "states": list(workflowsview.STATES),
            "items": items}  # fmt: skip


async def workflow_info(state: ConsoleState, workflow_id: str) -> dict[str, Any] | None:
    """One workflow in full, ``None`` when unknown or expired."""
    detail = await workflowsview.workflow_detail(
        state.client.store, workflow_id, workflowsview.deserializer(state.serializer)
    )
    return None if detail is None else {"now_ms": await _now_ms(state), **detail}


async def cancel(ops: Operations, body: dict[str, Any]) -> Outcome:
    """``POST /api/workflows/cancel`` ``{"id"}``: :meth:`Operations.cancel_workflow`."""
    wid = body.get("id")
    if not isinstance(wid, str) or not wid or len(wid) > 1024:
        raise bad_request('name the workflow: {"id": "<workflow id>"}')
    return await ops.cancel_workflow(wid)


def add_routes(
    router: web.UrlDispatcher,
    state_of: Callable[[web.Request], ConsoleState],
    guarded: Guarded,
    action: Action,
) -> None:
    """The view's routes on the console's ``router`` (``state_of``: the request's state;
    ``guarded``: how a read's Redis error becomes a 503; ``action``: the audited handler)."""

    async def listing(request: web.Request) -> web.Response:
        found = await guarded(workflows_page(state_of(request), request.query))
        return web.json_response(found, dumps=standard_json)

    async def one(request: web.Request) -> web.Response:
        wid = request.match_info["workflow_id"]
        detail = await guarded(workflow_info(state_of(request), wid))
        if detail is None:
            raise web.HTTPNotFound(
                text='{"error": "no such workflow (unknown, or expired)"}',
                content_type="application/json",
            )
        return web.json_response(detail, dumps=standard_json)

    router.add_get("/api/workflows", listing)
    router.add_get(r"/api/workflows/{workflow_id:[\s\S]+}", one)
    router.add_post("/api/workflows/cancel", action(cancel))
