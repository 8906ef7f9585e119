"""``run``, ``plan``, ``health`` and ``web``: a process on this host (a worker, the console)."""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

import structlog

from worker import arqcompat
from worker.cli.common import admin_target, run_async, setup_logging
from worker.core.errors import ConfigError
from worker.core.terminal import say
from worker.settings import Settings, likely_typos

log = structlog.get_logger("worker.cli")


def cmd_plan(settings: Settings, _: argparse.Namespace) -> int:
    """Print which components the role enables and disables; no Redis needed."""
    from worker.runtime.roles import plan

    app = arqcompat.load(settings.app)
    p = plan(settings.role, app, settings)
    say(f"instance: {settings.instance_name}")
    say(f"app: {settings.app}")
    say("\n".join(p.lines()))
    return 0


def cmd_run(settings: Settings, args: argparse.Namespace) -> int:
    """Run a worker process in its role until SIGTERM/SIGINT (or, ``--burst``, until no job
    is due)."""
    from worker.runtime.process import Runtime

    if args.burst:
        settings = _burst_settings(settings)
    setup_logging(settings)
    for warning in likely_typos():
        log.warning(warning)
    app = arqcompat.load(settings.app)
    embedded, announced = None, None
    url = settings.redis_url
    if url is None:
        if settings.role != "all":
            raise ConfigError(
                f"WORKER_REDIS_URL is required for role {settings.role!r}: a private embedded "
                "server cannot be shared between processes (only --role all runs one)"
            )
        from worker.runtime.embedded import EmbeddedServer

        embedded = EmbeddedServer()
        url = embedded.start()
    try:
        if embedded is not None:
            announced = _announce_embedded(settings, url)
        if (
            settings.processes > 1
        ):  # a parent: N children, each a Runtime (worker.runtime.processes)
            from worker.runtime.processes import run_processes

            return run_processes(settings, redis_url=url, environ=os.environ)
        return run_async(Runtime(settings, app, redis_url=url, burst=args.burst).run())
    finally:
        if embedded is not None:
            from worker.runtime import local

            local.withdraw(announced)
            embedded.stop()


def _burst_settings(settings: Settings) -> Settings:
    """``--burst`` runs a consumer: no leader duties, one process."""
    if "role" in settings.model_fields_set and settings.role != "consumer":
        raise ConfigError(
            f"--burst runs a consumer only (it drains the queue and exits); drop --role "
            f"{settings.role} (WORKER_ROLE)"
        )
    if settings.processes > 1:
        raise ConfigError("--burst runs one process; drop --processes (WORKER_PROCESSES)")
    return settings.model_copy(update={"role": "consumer"})


def _announce_embedded(settings: Settings, url: str) -> Path | None:
    """Say where the private server is, ready to paste, and tell local admin commands."""
    from worker.runtime import local

    path = local.announce("embedded", {"url": url, "instance": settings.instance_name})
    n = settings.processes
    who = "this process" if n == 1 else f"the {n} worker processes of this run"
    log.warning(
        f"NO WORKER_REDIS_URL: STARTED A PRIVATE EMBEDDED REDIS SERVER for {who} only; its "
        "data is deleted on exit. Set WORKER_REDIS_URL for anything real.",
        redis=url,
    )
    found = "" if path else "  (set it: this machine has no runtime directory for the CLI)"
    say(
        "\nworker: a private Redis for this run (deleted on exit). In a second terminal:\n"
        f"    python -m worker status          # finds it by itself{found}\n"
        f"    export WORKER_REDIS_URL={url}   # for anything else\n",
        file=sys.stderr,
        flush=True,
    )
    return path


def cmd_health(settings: Settings, args: argparse.Namespace) -> int:
    """Exit 0 if the worker(s) asked about answer ``/healthz`` with 200, else 1."""
    from worker.runtime import local

    if args.instance is None and settings.health_port_explicit:
        if not settings.health_port:
            say("health server disabled (WORKER_HEALTH_PORT=0)", file=sys.stderr)
            return 1
        # --processes N with a configured port: process i listens on WORKER_HEALTH_PORT + i
        host = _probe_host(settings.health_host)
        ports = [settings.health_port + i for i in range(settings.processes)]
        return max(_healthz(f"http://{host}:{port}/healthz") for port in ports)
    workers = [w for w in local.discover("worker") if w.data.get("health_port")]
    if args.instance is not None:
        workers = [w for w in workers if w.data.get("instance") == args.instance]
        if not workers:
            say(f"no local worker named {args.instance!r} serves probes", file=sys.stderr)
            return 1
    if not workers:  # none announced: the default port, as before
        if not settings.health_port:
            say("health server disabled (WORKER_HEALTH_PORT=0)", file=sys.stderr)
            return 1
        host = _probe_host(settings.health_host)
        return _healthz(f"http://{host}:{settings.health_port}/healthz")
    codes = []
    for w in workers:
        host = _probe_host(str(w.data.get("health_host") or "127.0.0.1"))
        url = f"http://{host}:{w.data['health_port']}/healthz"
        if len(workers) > 1:
            say(f"{w.data.get('instance')} (pid {w.pid}):", file=sys.stderr)
        codes.append(_healthz(url))
    return max(codes)


def _probe_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def cmd_web(settings: Settings, args: argparse.Namespace) -> int:
    """The operator console (``worker.web``) until SIGTERM/SIGINT."""
    from worker.web import serve
    from worker.web.app import check_auth, check_exposure

    setup_logging(settings)
    auth = False if args.no_auth else None
    remote = True if args.allow_remote_no_auth else None
    view_needs_token = settings.web_auth if auth is None else auth
    check_auth(settings.web_token, view_needs_token)  # before Redis
    check_exposure(
        args.host or settings.web_host,
        view_needs_token,
        settings.web_allow_remote_no_auth if remote is None else remote,
    )
    settings, app = run_async(admin_target(settings, "web"))
    return run_async(
        serve(settings, app, host=args.host, port=args.port, auth=auth, allow_remote=remote)
    )


def _healthz(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            say(resp.read().decode(errors="replace"))
            return 0 if resp.status == 200 else 1
    except urllib.error.HTTPError as exc:
        say(exc.read().decode(errors="replace") or str(exc), file=sys.stderr)
        return 1
    except OSError as exc:
        say(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1
