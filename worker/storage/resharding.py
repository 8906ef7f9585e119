"""What a Redis Cluster connection does while the app's hash slot is being migrated.

A resharding (``valkey-cli --cluster reshard``: ``CLUSTER SETSLOT … IMPORTING/MIGRATING``,
``MIGRATE`` of the slot's keys in batches, ``SETSLOT … NODE``) moves every key of the app at
once, since they share one hash tag. While it runs, the node that serves the slot answers
a command for a key it no longer holds with ``ASK <slot> <target>`` (the command is to be sent
to the importing node, preceded by ``ASKING``), and a command over several keys of which it
holds only some, or that names a key that does not exist (most of the framework's scripts do),
with ``TRYAGAIN``: such a command can run only once the migration has ended. When it ends, the
old node answers ``MOVED``.

None of these means the connection failed, and none ran the command: :class:`Detour` sends
that one command again, in place, so a pipeline's replies stay in order and the caller sees
the reply as if nothing had happened:

- ``ASK``: to the importing node, on a side connection, after ``ASKING``;
- ``MOVED`` (the migration ended, or a failover): to the new owner, on a side connection (the
  connection that got it reconnects to the new owner at its next use);
- ``TRYAGAIN``, and a script stopped at a key it did not declare that the node does not hold
  (while the node says it migrates the slot): again to the slot's node after a short pause
  (20 ms, doubling to 200 ms), for up to :func:`patience_s` (:data:`PATIENCE_S` unless the
  caller set less with :func:`patience`), then :class:`SlotMigrating` (a
  ``ConnectionError``: the caller's own retry applies). The leader's renew sets a short
  patience and falls back to a renew of the lock alone, which ``ASK`` carries through (see
  ``storage.election``).

A command inside ``MULTI``/``EXEC`` is not sent again alone (the transaction fails, and the
caller retries it whole). A command sent on a side connection is not covered by a ``WAIT``
on the connection that got the redirection (docs/deployment.md, failure table).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Iterator, Sequence
from typing import Any

from redis.asyncio import ConnectionPool
from redis.asyncio.connection import Connection, SSLConnection
from redis.exceptions import (
    AskError,
    ClusterCrossSlotError,
    ClusterDownError,
    MasterDownError,
    MovedError,
    NoScriptError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from worker.storage.replies import side_connection

#: How long a command that gets ``TRYAGAIN`` is sent again before :class:`SlotMigrating`.
PATIENCE_S = 10.0
#: The pause before the first repeat, doubled each time up to :data:`MAX_PAUSE_S`.
FIRST_PAUSE_S, MAX_PAUSE_S = 0.02, 0.2
#: Redirections that mean "not run, send it again" (the rest of the errors are the caller's).
REDIRECTIONS = ("ASK", "MOVED", "TRYAGAIN")

#: What a script gets for a key it did not declare that the node does not hold while the slot
#: migrates: it stopped there (the framework's scripts read a key before they write it).
NON_LOCAL = "Script attempted to access a non local key"
REHASHING = "undeclared keys were accessed during rehashing of the slot"

_patience: contextvars.ContextVar[float] = contextvars.ContextVar(
    "worker_reshard_patience", default=PATIENCE_S
)


#: Script texts by SHA1 (:func:`remember_script`): an ``EVALSHA`` sent to the importing node,
#: which does not have the script, loads it there.
_SCRIPTS: dict[str, str] = {}


def remember_script(sha: str, text: str) -> None:
    _SCRIPTS[sha] = text


class SlotMigrating(RedisConnectionError):
    """The app's hash slot is being migrated and the command could not run within the
    caller's patience (``TRYAGAIN`` throughout): nothing was written."""


def patience_s() -> float:
    return _patience.get()


@contextlib.contextmanager
def patience(seconds: float) -> Iterator[None]:
    """Within this block, a command that gets ``TRYAGAIN`` is repeated for ``seconds`` at most."""
    token = _patience.set(seconds)
    try:
        yield
    finally:
        _patience.reset(token)


#: Error classes whose first word redis-py 7+ cuts from the message (redis-py 5 leaves these
#: replies a plain ``ResponseError`` with the whole line), most specific first.
_CUT_WORDS: tuple[tuple[type[ResponseError], str], ...] = (
    (MovedError, "MOVED"),
    (AskError, "ASK"),
    (TryAgainError, "TRYAGAIN"),
    (MasterDownError, "MASTERDOWN"),
    (ClusterDownError, "CLUSTERDOWN"),
    (ClusterCrossSlotError, "CROSSSLOT"),
)


def error_text(exc: ResponseError) -> str:
    """The server's error line (``MOVED 3999 10.0.0.2:6379``) whatever the redis-py major:
    newer ones raise ``MovedError("3999 10.0.0.2:6379")``, the word cut."""
    text = str(exc)
    for cls, word in _CUT_WORDS:
        if isinstance(exc, cls):
            return text if text.split(" ", 1)[0] == word else f"{word} {text}".rstrip()
    return text


def redirection(text: str, slot: int) -> str | None:
    """``ASK``, ``MOVED`` or ``TRYAGAIN`` when ``text`` is one about ``slot`` (``TRYAGAIN``
    names no slot: the connection serves only the app's), else ``None``."""
    if REHASHING in text:  # a script's undeclared key, on either node
        return "TRYAGAIN"
    if text.startswith(NON_LOCAL):
        return "NONLOCAL"
    parts = text.split()
    if not parts or parts[0] not in REDIRECTIONS:
        return None
    if parts[0] == "TRYAGAIN":
        return "TRYAGAIN"
    if len(parts) >= 3 and parts[1].isdigit() and int(parts[1]) == slot:
        return parts[0]
    return None


def _address(text: str, asked: str) -> tuple[str, int]:
    host, _, port = text.split()[2].rpartition(":")
    return (host or asked, int(port))


class Detour:
    """Side connections of one slot pool (one small pool per node address), and the resend
    of one redirected command (module docstring)."""

    def __init__(self, slot: int, connection_kwargs: dict[str, Any], ssl: bool) -> None:
        self.slot = slot
        self.kwargs = {
            k: v for k, v in connection_kwargs.items() if k not in ("slot_pool", "host", "port")
        }
        self.connection_class = SSLConnection if ssl else Connection
        self._pools: dict[tuple[str, int], ConnectionPool] = {}
        #: commands sent again, by the redirection that asked for it (``/status``, tests)
        self.counts: dict[str, int] = {}

    def _pool(self, address: tuple[str, int]) -> ConnectionPool:
        pool = self._pools.get(address)
        if pool is None:
            pool = self._pools[address] = ConnectionPool(
                connection_class=self.connection_class,
                host=address[0],
                port=address[1],
                max_connections=2**31,  # uncapped (redis-py 6+ caps an async pool at 100)
                **self.kwargs,
            )
        return pool

    async def _send(
        self, address: tuple[str, int], args: Sequence[Any], asking: bool, raw: bool
    ) -> Any:
        """``args`` on a side connection to ``address`` (after ``ASKING``); a script that node
        does not know yet (``NOSCRIPT``: scripts do not migrate) is loaded there first."""
        pool = self._pool(address)
        conn = await side_connection(pool, str(args[0]))
        try:
            for attempt in range(2):
                commands = [("ASKING",), tuple(args)] if asking else [tuple(args)]
                await conn.send_packed_command(conn.pack_commands(commands))
                if asking:
                    await conn.read_response()
                try:
                    return await conn.read_response(disable_decoding=raw)
                except NoScriptError:
                    text = _SCRIPTS.get(str(args[1]) if len(args) > 1 else "")
                    if attempt or text is None or str(args[0]).upper() != "EVALSHA":
                        raise
                    await conn.send_command("SCRIPT", "LOAD", text)
                    await conn.read_response()
            raise AssertionError("unreachable")  # pragma: no cover
        finally:
            await pool.release(conn)

    async def _migrating(self, address: tuple[str, int]) -> bool:
        """Whether the node at ``address`` is migrating the slot away or importing it
        (``CLUSTER NODES``: ``[<slot>->-<id>]`` or ``[<slot>-<-<id>]`` on its own line)."""
        pool = self._pool(address)
        conn = await side_connection(pool, "CLUSTER")
        try:
            await conn.send_command("CLUSTER", "NODES")
            nodes = await conn.read_response(disable_decoding=True)
        finally:
            await pool.release(conn)
        mine = next((line for line in bytes(nodes).splitlines() if b"myself" in line), b"")
        marks = (f"[{self.slot}->-".encode(), f"[{self.slot}-<-".encode())
        return any(mark in mine for mark in marks)

    async def resend(
        self, text: str, args: Sequence[Any], owner: Any, *, asked: str, raw: bool
    ) -> Any:
        """Send ``args`` again as the redirection ``text`` asks (``owner()``: the address of
        the slot's node now); its reply, or the error it ends with."""
        deadline = time.monotonic() + patience_s()
        pause = FIRST_PAUSE_S
        while True:
            kind = redirection(text, self.slot)
            if kind is None:
                raise ResponseError(text)
            self.counts[kind] = self.counts.get(kind, 0) + 1
            if time.monotonic() > deadline:
                raise SlotMigrating(f"the app's hash slot {self.slot} is being migrated: {text}")
            if kind == "NONLOCAL" and not await self._migrating(await owner()):
                raise ResponseError(text)  # a key outside the slot: the caller's mistake
            if kind in ("TRYAGAIN", "NONLOCAL"):
                await asyncio.sleep(pause)
                pause = min(pause * 2, MAX_PAUSE_S)
                address = await owner()
            else:
                address = _address(text, asked)
            try:
                return await self._send(address, args, kind == "ASK", raw)
            except ResponseError as exc:
                text = error_text(exc)
                if redirection(text, self.slot) is None:
                    raise

    async def close(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            with contextlib.suppress(Exception):
                await pool.disconnect()
