"""``per_key`` services: a long-running loop per key, each key in exactly one process at a time.

Mailboxes are the model: one IMAP IDLE loop per mailbox, spread across replicas,
never two loops on the same mailbox. Every process that runs the service

1. announces itself in the service's member set (refreshed each round, stale members drop out),
2. computes which keys it should own by rendezvous hashing over the live members (so adding or
   removing a process moves only that process's share of keys),
3. runs a key only while it holds that key's lease in Redis (``SET NX PX``, renewed by
   compare-and-``PEXPIRE``, released by compare-and-``DEL`` only after its loop stopped).

The lease is what guarantees exclusivity; hashing only spreads the work. A process that cannot
renew its leases for the renew deadline stops its loops before the leases can expire.

Each key loop has its own health (its own ``sla_s`` and ``ctx.alive()``), listed in the
service's ``Health.parts``: one stalled or crash-looping key makes the service overdue.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from worker.core.clock import Clock, ms
from worker.core.component import Backoff, Component, supervise
from worker.core.dutykinds import Kind, RowContext, table
from worker.core.kindcolumns import Cell, Column
from worker.core.views import ContextView
from worker.duties.services import ServiceDef, run_service
from worker.storage.store import Store

log = structlog.get_logger("worker.keyed")
T = TypeVar("T")


def owner(key: str, members: Iterable[str]) -> str | None:
    """The member that owns ``key`` under rendezvous (highest-random-weight) hashing."""

    def weight(member: str) -> int:
        digest = hashlib.blake2b(f"{member}\x00{key}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big")

    return max(members, key=weight, default=None)


class _KeyLoop(Component):
    """One key's loop: ``fn(ctx, stop, key)`` under the usual supervision."""

    def __init__(self, service: ServiceDef, key: str, context: ContextView, clock: Clock) -> None:
        super().__init__(f"service:{service.name}[{key}]", clock, sla_s=service.sla_s)
        self.service = service
        self.key = key
        self.context = context.bound(self.alive)

    def alive(self) -> None:
        self.health.ok(self.clock.monotonic())

    async def run(self, stop: asyncio.Event) -> None:
        self.alive()
        await run_service(self.service.fn, self.context, stop, self.key)


@dataclass
class _Running:
    stop: asyncio.Event
    task: asyncio.Task[None]


class KeyedService(Component):
    """Runs a ``per_key`` service for the keys this process owns (see module docstring)."""

    def __init__(
        self,
        service: ServiceDef,
        context: ContextView,
        store: Store,
        clock: Clock,
        *,
        instance_id: str,
        lease_ttl_s: float,
        renew_interval_s: float,
        renew_deadline_s: float,
        stop_grace_s: float,
        backoff: type[Backoff] | None = None,
    ) -> None:
        super().__init__(f"service:{service.name}", clock, sla_s=max(30.0, renew_interval_s * 10))
        self.service = service
        self.context = context
        self.store = store
        self.keys = store.keys
        self.instance_id = instance_id
        self.lease_ttl_s = lease_ttl_s
        self.renew_interval_s = renew_interval_s
        self.renew_deadline_s = renew_deadline_s
        self.stop_grace_s = stop_grace_s
        self._backoff = backoff or Backoff
        self.running: dict[str, _Running] = {}
        self._members: list[str] = []
        self._owners: dict[str, str] = {}
        self._last_renewed: float | None = None

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                started = self.clock.monotonic()
                try:
                    await self.rebalance()
                    self._last_renewed = started
                except Exception as exc:
                    log.warning("per-key rebalance failed", error=f"{type(exc).__name__}: {exc}")
                    if (
                        self._last_renewed is None
                        or self.clock.monotonic() - self._last_renewed >= self.renew_deadline_s
                    ):
                        await self._stop_all(release=False)
                else:
                    self.health.ok(self.clock.monotonic())
                self.health.extra["keys"] = sorted(self.running)
                await self.clock.wait(stop, self.renew_interval_s)
        finally:
            await self._stop_all(release=True)
            with contextlib.suppress(Exception):
                await self.store.service_leave(self.service.name, self.instance_id)

    async def _wanted_keys(self) -> set[str]:
        source = self.service.keys
        if callable(source):
            result = source(self.context)
            if inspect.isawaitable(result):
                result = await result
            return {str(k) for k in result}
        return {str(k) for k in source or ()}

    async def rebalance(self) -> None:
        """One round: announce, compute ownership, renew/release/acquire leases."""
        name = self.service.name
        now = ms(self.clock.time())
        members = await self._io(
            self.store.service_round(name, self.instance_id, now, now - ms(self.lease_ttl_s))
        )
        if members != self._members:  # ownership moves only when the members change
            self._members, self._owners = members, {}
        mine = {k for k in await self._wanted_keys() if self._owner(k) == self.instance_id}

        ttl = ms(self.lease_ttl_s)
        for key in [k for k in self.running if k not in mine]:
            await self._stop_key(key, release=True)
        kept = sorted(self.running)
        if kept:  # one script for every lease this process holds
            renewed = await self._io(
                self.store.renew_leases(
                    [self.keys.service_lease(name, k) for k in kept], self.instance_id, ttl
                )
            )
            for key, ok in zip(kept, renewed, strict=True):
                if not ok:
                    log.warning("per-key lease lost; stopping its loop", key=key)
                    await self._stop_key(key, release=False)
        wanted = sorted(mine - set(self.running))
        if wanted:
            taken = await self._io(
                self.store.take_leases(
                    [self.keys.service_lease(name, k) for k in wanted], self.instance_id, ttl
                )
            )
            for key, ok in zip(wanted, taken, strict=True):
                if ok:
                    self._start_key(key)

    def _owner(self, key: str) -> str | None:
        found = self._owners.get(key)
        if found is None:
            found = self._owners[key] = owner(key, self._members) or ""
        return found or None

    async def _io(self, call: Awaitable[T]) -> T:
        """A Redis call bounded by the renew deadline (a hung call must not outlast a lease)."""
        return await self.clock.wait_for(call, self.renew_deadline_s)

    def _start_key(self, key: str) -> None:
        loop = _KeyLoop(self.service, key, self.context, self.clock)
        stop = asyncio.Event()
        task = asyncio.create_task(supervise(loop, stop, backoff=self._backoff()), name=loop.name)
        self.running[key] = _Running(stop, task)
        self.health.parts[key] = loop.health
        log.info("per-key loop started", key=key)

    async def _stop_key(self, key: str, *, release: bool) -> None:
        run = self.running.pop(key)
        self.health.parts.pop(key, None)
        run.stop.set()
        _, pending = await asyncio.wait({run.task}, timeout=self.stop_grace_s)
        if pending:
            run.task.cancel()
            await asyncio.wait({run.task}, timeout=self.stop_grace_s)
        if release and run.task.done():
            # only once the loop is really gone may another process start the key
            await self.store.release_lease(
                self.keys.service_lease(self.service.name, key), self.instance_id
            )
        log.info("per-key loop stopped", key=key, released=release and run.task.done())

    async def _stop_all(self, *, release: bool) -> None:
        for key in list(self.running):
            try:
                await self._stop_key(key, release=release)
            except Exception as exc:
                log.warning("stopping per-key loop failed", key=key, error=str(exc))


# -- the operator side's view of per_key services (see worker.core.dutykinds) ------------------
async def _read(store: Store, app: Any, now_ms: int) -> dict[str, tuple[int, dict[str, str]]]:
    """Each per_key service: its member processes and which instance runs each key."""
    return {
        sv.name: await store.service_keys(sv.name)
        for sv in app.services.values()
        if sv.cardinality == "per_key"
    }


def _rows(
    state: dict[str, tuple[int, dict[str, str]]], app: Any, at: RowContext
) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "processes": processes,
            "keys": {k: at.instance_name(o) for k, o in leased.items()},
        }
        for name, (processes, leased) in state.items()
    ]


def _render(rows: list[dict[str, Any]], at: str) -> list[str]:
    out: list[str] = []
    for sv in rows:
        out += [
            "",
            f"per_key service {sv['name']}: {len(sv['keys'])} keys running "
            f"on {sv['processes']} processes",
            *table(["KEY", "INSTANCE"], [[k, o] for k, o in sv["keys"].items()]),
        ]
    return out


#: Keys named in the hover title of the console's "keys running" cell, at most.
TITLE_KEYS = 50


def _keys_cell(row: dict[str, Any], now_ms: int) -> Cell:
    keys = sorted(row["keys"].items())
    more = len(keys) - TITLE_KEYS
    title = ", ".join(f"{k} on {o}" for k, o in keys[:TITLE_KEYS]) + (
        f" and {more} more" if more > 0 else ""
    )
    return Cell(len(keys), "", title)


COLUMNS = (
    Column("service", lambda r, now: r["name"]),
    Column("processes", lambda r, now: r["processes"], "num"),
    Column("keys running", _keys_cell, "num"),
)


KIND = Kind(
    name="per_key",
    noun="per_key service",
    plural="per_key services",
    status_key="per_key_services",
    declared=lambda app: {n: s for n, s in app.services.items() if s.cardinality == "per_key"},
    read=_read,
    rows=_rows,
    render=_render,
    columns=COLUMNS,
)
