"""The console's HTTP side: routes, handlers and the ``python -m worker web`` server.

:func:`create_app` builds an aiohttp application from a connected :class:`~worker.Client` and
the workers' :class:`~worker.App`; it can be served alone (:func:`serve`) or mounted into an
existing aiohttp application (``parent.add_subapp("/ops/", create_app(...))``: the page uses
relative URLs). Reads go through :mod:`worker.web.api`; actions through
:class:`worker.ops.actions.Operations`, the same code the command line runs.

Routes: ``GET /`` the page, ``GET /static/*`` its script and style, ``GET /api/overview``,
``GET /api/dead?page=&size=``, ``GET /api/dead/{job_id}``, and the actions ``POST
/api/dead/requeue`` and ``/api/dead/purge`` (``{"ids": [...]}`` or ``{"all": true}``),
``/api/<kind>/trigger`` for each kind that runs one now (``{"name"}``), ``/api/pause`` and
``/api/resume`` (``{"kind": "<kind>", "name"}``, a kind that pauses, the kinds:
:mod:`worker.duties.kinds`; or ``{"kind": "queue", "name"}`` / ``{"kind": "queue", "all":
true}``), ``/api/leader/handoff`` (``{"force": false}``). The Jobs view
(:mod:`worker.web.jobsapi`): ``GET /api/jobs?state=&queue=&task=&search=&limit=&cursor=``,
``GET /api/jobs/{job_id}``, ``GET /api/tasks``, ``POST /api/jobs/retry|cancel`` (``{"id"}``).
Run-time schedules: :mod:`.schedulesapi`; the Workflows view: :mod:`.flowsapi`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import signal
import sys
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

import structlog
from aiohttp import web

import worker.web.api as api
import worker.web.flowsapi as flows
import worker.web.jobsapi as jobs
import worker.web.schedulesapi as schedules
from worker.app import App
from worker.client import Client
from worker.core.errors import ConfigError
from worker.duties import kinds
from worker.ops.actions import Actor, Operations, Outcome
from worker.runtime.httpguard import (
    BROWSER_HEADER_TIMEOUT_S,
    GuardedSite,
    allowed_hosts,
    host_guard,
    one_request,
    parse_hosts,
)
from worker.settings import Settings, mask_url
from worker.web.auth import Guard, Handler, operator, secure_headers

log = structlog.get_logger("worker.web")

STATE = web.AppKey("state", api.ConsoleState)
GUARD = web.AppKey("guard", Guard)
#: Largest action body accepted (a list of selected job ids).
MAX_BODY = 1 << 20
#: Most job ids one action may name.
MAX_IDS = 10_000

_STATIC = resources.files("worker.web") / "static"
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}


def create_app(
    client: Client,
    app: App,
    *,
    token: str | None,
    view_needs_token: bool = True,
    serializer: str = "msgpack",
    redis_url: str = "",
    limits: Any = None,
    allowed_hosts: str | frozenset[str] = "",
) -> web.Application:
    """The console as an aiohttp application (see module docstring). ``token``: the token
    every action needs (``None``: read-only console); ``view_needs_token``: whether viewing
    needs it too; ``redis_url`` is only shown, masked. ``allowed_hosts``: the names (``Host``
    header) it is reached by besides IP addresses and ``localhost`` (``"*"``: any); any other
    Host is refused (421), so a page on another origin cannot read it by DNS rebinding."""
    check_auth(token, view_needs_token)
    hosts = parse_hosts(allowed_hosts) if isinstance(allowed_hosts, str) else allowed_hosts
    state = api.ConsoleState(client, app, serializer=serializer, redis_url=mask_url(redis_url))
    if limits is not None:
        state.limits = limits
    console = web.Application(
        middlewares=[secure_headers, host_guard(hosts), _guard], client_max_size=MAX_BODY
    )
    console[STATE] = state
    console[GUARD] = Guard(token, view_needs_token)
    r = console.router
    r.add_get("/", _page)
    r.add_get("/static/{name}", _static)
    r.add_get("/api/overview", _overview)
    r.add_get("/api/dead", _dead_page)
    # a job id may hold any character: aiohttp's default pattern refuses "{" and "}" (every
    # id of a hash-tagged prefix, "{shop}:...") and "/", and ".+" a line break; the page
    # sends the id percent-encoded
    r.add_get(r"/api/dead/{job_id:[\s\S]+}", _dead_detail)
    r.add_post("/api/dead/requeue", _action(_requeue))
    r.add_post("/api/dead/purge", _action(_purge))
    for kind in kinds.triggerable():
        r.add_post(f"/api/{kind.name}/trigger", _action(_trigger))
    r.add_post("/api/pause", _action(_pause))
    r.add_post("/api/resume", _action(_resume))
    r.add_post("/api/leader/handoff", _action(_handoff))
    r.add_get("/api/jobs", _jobs)
    r.add_get(r"/api/jobs/{job_id:[\s\S]+}", _job)
    r.add_get("/api/tasks", _tasks)
    r.add_post("/api/jobs/retry", _action(jobs.retry))
    r.add_post("/api/jobs/cancel", _action(jobs.cancel))
    schedules.add_routes(r, _action)
    flows.add_routes(r, lambda q: q.app[STATE], _guarded, _action)
    return console


def check_auth(token: object | None, view_needs_token: bool) -> None:
    """Refuse to run a console nobody can act on and everybody can read: a missing token
    is fine only when viewing was explicitly opened (``WORKER_WEB_AUTH=false``)."""
    if token is None and view_needs_token:
        raise ConfigError(
            "WORKER_WEB_TOKEN: not set; set a token (at least 16 characters), or "
            "WORKER_WEB_AUTH=false (--no-auth) to let anyone who reaches the console view it "
            "(actions stay disabled without a token)"
        )


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    if "/api/" in request.path:
        request.app[GUARD].check(request)
    return await handler(request)


def check_exposure(host: str, view_needs_token: bool, allow_remote: bool) -> None:
    """Refuse a console anyone may view (``--no-auth``) on an address other machines reach,
    unless that was asked for by name (``--allow-remote-no-auth``)."""
    if view_needs_token or allow_remote or _loopback(host):
        return
    raise ConfigError(
        f"--no-auth (WORKER_WEB_AUTH=false) on {host!r}: anyone who reaches this address could "
        "read every dead letter; listen on 127.0.0.1, set WORKER_WEB_TOKEN, or add "
        "--allow-remote-no-auth (WORKER_WEB_ALLOW_REMOTE_NO_AUTH=true) if you mean it"
    )


def _loopback(host: str) -> bool:
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# -- the page -----------------------------------------------------------------------------------
async def _page(request: web.Request) -> web.Response:
    return _file("index.html")


async def _static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in ("app.js", "schedules.js", "workflows.js", "style.css"):
        raise web.HTTPNotFound()
    return _file(name)


def _file(name: str) -> web.Response:
    body = (_STATIC / name).read_bytes()
    kind = _TYPES[name[name.rindex(".") :]]
    return web.Response(body=body, content_type=kind, charset="utf-8")


# -- reads --------------------------------------------------------------------------------------
async def _overview(request: web.Request) -> web.Response:
    return await _json(api.overview(request.app[STATE]))


async def _dead_page(request: web.Request) -> web.Response:
    page = _int(request.query.get("page"), 1)
    size = _int(request.query.get("size"), api.PAGE)
    return await _json(api.dead_page(request.app[STATE], page, size))


async def _dead_detail(request: web.Request) -> web.Response:
    detail = await _guarded(api.dead_detail(request.app[STATE], request.match_info["job_id"]))
    if detail is None:
        raise web.HTTPNotFound(
            text='{"error": "no such dead letter"}', content_type="application/json"
        )
    return web.json_response(detail, dumps=api.standard_json)


async def _jobs(request: web.Request) -> web.Response:
    return await _json(jobs.jobs_page(request.app[STATE], request.query))


async def _job(request: web.Request) -> web.Response:
    detail = await _guarded(jobs.job_info(request.app[STATE], request.match_info["job_id"]))
    if detail is None:
        raise web.HTTPNotFound(text='{"error": "no such job"}', content_type="application/json")
    return web.json_response(detail, dumps=api.standard_json)


async def _tasks(request: web.Request) -> web.Response:
    return await _json(jobs.tasks(request.app[STATE]))


async def _json(read: Awaitable[Any]) -> web.Response:
    return web.json_response(await _guarded(read), dumps=api.standard_json)


async def _guarded(read: Awaitable[Any]) -> Any:
    """Redis errors become a 503 naming the error class (never its text: it may hold data)."""
    try:
        return await read
    except (web.HTTPException, asyncio.CancelledError):
        raise
    except Exception as exc:
        log.warning("console read failed", error=f"{type(exc).__name__}: {exc}")
        raise web.HTTPServiceUnavailable(
            text=json.dumps({"error": f"cannot read Redis: {type(exc).__name__}"}),
            content_type="application/json",
        ) from None


def _int(raw: str | None, default: int) -> int:
    try:
        return int(raw) if raw is not None else default
    except ValueError:
        raise _bad("page and size are numbers") from None


# -- actions ------------------------------------------------------------------------------------
Action = Callable[[Operations, dict[str, Any]], Awaitable[Outcome]]


def _action(run: Action) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise _bad("the body must be a JSON object")
        state = request.app[STATE]
        actor = Actor(operator(request), "web", request.remote)
        ops = Operations(
            state.client, state.app, actor, serializer=jobs.serializer(state.serializer)
        )
        outcome = await _guarded(run(ops, body))
        return web.json_response(outcome.to_json(), dumps=api.standard_json)

    return handler


_bad = jobs.bad_request


def _selection(body: dict[str, Any]) -> list[str] | None:
    """``{"all": true}`` -> ``None`` (every one); ``{"ids": [...]}`` -> the ids."""
    if body.get("all") is True:
        return None
    ids = body.get("ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) and i for i in ids):
        raise _bad('name the dead letters: {"ids": ["<job id>", ...]} or {"all": true}')
    if len(ids) > MAX_IDS:
        raise _bad(f"at most {MAX_IDS} ids per action")
    return list(dict.fromkeys(ids))


def _name(body: dict[str, Any]) -> str:
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise _bad('name the job: {"name": "<name>"}')
    return name


def _kind(body: dict[str, Any]) -> str:
    kind = body.get("kind")
    for known in kinds.pausable():
        if kind == known.name:
            return known.name
    raise _bad('"kind" is ' + " or ".join(f'"{k.name}"' for k in kinds.pausable()))


async def _requeue(ops: Operations, body: dict[str, Any]) -> Outcome:
    return await ops.requeue_dead(_selection(body))


async def _purge(ops: Operations, body: dict[str, Any]) -> Outcome:
    return await ops.purge_dead(_selection(body))


async def _trigger(ops: Operations, body: dict[str, Any]) -> Outcome:
    return await ops.trigger(_name(body))


async def _pause(ops: Operations, body: dict[str, Any]) -> Outcome:
    if body.get("kind") == "queue":
        return await ops.pause_queue(_queue(body))
    return await ops.pause(_kind(body), _name(body))


async def _resume(ops: Operations, body: dict[str, Any]) -> Outcome:
    if body.get("kind") == "queue":
        return await ops.pause_queue(_queue(body), paused=False)
    return await ops.resume(_kind(body), _name(body))


def _queue(body: dict[str, Any]) -> str | None:
    """``{"kind": "queue", "name"}``: that queue; ``{"kind": "queue", "all": true}``: every one."""
    return None if body.get("all") is True else _name(body)


async def _handoff(ops: Operations, body: dict[str, Any]) -> Outcome:
    return await ops.handoff(force=body.get("force") is True)


# -- the server ---------------------------------------------------------------------------------
async def serve(
    settings: Settings,
    app: App,
    *,
    host: str | None = None,
    port: int | None = None,
    auth: bool | None = None,
    allow_remote: bool | None = None,
    ready: Callable[[str], None] | None = None,
) -> int:
    """Run the console until SIGTERM/SIGINT (``python -m worker web``). ``host``, ``port``,
    ``auth`` and ``allow_remote`` override the settings; ``ready`` is called with the URL
    once listening. Its listener bounds connections and header time
    (:mod:`worker.runtime.httpguard`)."""
    from worker.ops import doctor
    from worker.runtime.preflight import bind_listeners

    view_needs_token = settings.web_auth if auth is None else auth
    token = settings.web_token.get_secret_value() if settings.web_token is not None else None
    check_auth(token, view_needs_token)  # before connecting: a config error is one line
    host = host or settings.web_host
    remote = settings.web_allow_remote_no_auth if allow_remote is None else allow_remote
    check_exposure(host, view_needs_token, remote)
    port = settings.web_port if port is None else port
    client = await Client.from_settings(settings, app=app)
    try:
        console = create_app(
            client,
            app,
            token=token,
            view_needs_token=view_needs_token,
            serializer=settings.serializer,
            redis_url=settings.redis_url or "",
            limits=doctor.Limits.from_settings(settings),
            allowed_hosts=allowed_hosts(settings.web_allowed_hosts, host),
        )
        console.middlewares.insert(0, one_request)  # each connection under the header deadline
        sockets = bind_listeners(host, port)
        runner = web.AppRunner(console, access_log=None)
        await runner.setup()
        try:
            for sock in sockets:
                site = GuardedSite(
                    runner, sock, what="console", header_timeout_s=BROWSER_HEADER_TIMEOUT_S
                )
                await site.start()
            bound = sockets[0].getsockname()
            shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
            url = f"http://{shown}:{bound[1]}/"
            log.info(
                "console listening",
                url=url,
                redis=mask_url(settings.redis_url),
                view_needs_token=view_needs_token,
                actions=token is not None,
            )
            print(f"worker console: {url}", file=sys.stderr, flush=True)
            if ready is not None:
                ready(url)
            await _until_signalled()
        finally:
            await runner.cleanup()
            for sock in sockets:
                sock.close()
    finally:
        await client.close()
    return 0


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
