"""Typed views of redis-py's replies: the one place that knows how redis-py annotates them.

redis-py 5 annotates every command's reply as ``Any``. redis-py 8 annotates the asyncio
client's replies with whatever any client could get: a value is ``bytes | str`` (whether the
client decodes is not known statically), a scored range is a union of bare members, RESP2
``(member, score)`` tuples and RESP3 ``[member, score]`` lists, an ``XREAD`` a union of its
RESP2 and RESP3 shapes, and ``ConnectionPool.get_connection`` has no annotations at all. The
framework's clients read bytes (no ``decode_responses``) on either protocol; the helpers here
turn a reply into the one shape the caller reads, checked at run time, so call sites type the
same under both majors.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from redis.asyncio.connection import Connection, ConnectionPool

#: A stream entry as the client parses it: ``(entry id, fields)``.
StreamEntry = tuple[Any, Mapping[Any, Any]]


def as_bytes(value: bytes | str) -> bytes:
    """A string value's bytes (a client that decodes replies gives text: encoded back)."""
    return value.encode() if isinstance(value, str) else value


def members(rows: Iterable[object]) -> list[bytes | str]:
    """The members of a range read without scores."""
    out: list[bytes | str] = []
    for row in rows:
        if not isinstance(row, bytes | str):
            raise TypeError(f"not a sorted-set member: {row!r}")
        out.append(row)
    return out


def scored(rows: Iterable[object]) -> list[tuple[bytes | str, float]]:
    """The ``(member, score)`` pairs of a range read ``WITHSCORES`` (RESP2 gives tuples,
    RESP3 two-item lists)."""
    out: list[tuple[bytes | str, float]] = []
    for row in rows:
        if not isinstance(row, tuple | list) or len(row) != 2:
            raise TypeError(f"not a (member, score) pair: {row!r}")
        member, score = row
        out.append((member, float(score)))
    return out


def fields(payload: object) -> Mapping[bytes | str, bytes | str]:
    """The field/value pairs of an ``HSCAN`` step (a mapping on either protocol)."""
    if not isinstance(payload, Mapping):
        raise TypeError(f"not an HSCAN mapping: {payload!r}")
    return payload


def stream_reads(raw: object) -> list[tuple[Any, list[StreamEntry]]]:
    """``XREAD``'s reply as ``[(stream key, entries)]``: RESP2 gives ``[[key, entries], ...]``,
    RESP3 ``{key: [entries]}`` (and a client without legacy replies ``{key: entries}``)."""
    if not raw:
        return []
    if isinstance(raw, Mapping):
        return [(key, _unwrapped(rows)) for key, rows in raw.items()]
    if isinstance(raw, list):
        return [(key, rows) for key, rows in raw]
    raise TypeError(f"not an XREAD reply: {raw!r}")


def _unwrapped(rows: list[Any]) -> list[StreamEntry]:
    """A RESP3 stream's entries, whether wrapped in a one-item list or not."""
    if len(rows) == 1 and isinstance(rows[0], list):
        return list(rows[0])
    return rows


async def side_connection(pool: ConnectionPool, command: str) -> Connection:
    """A connection of ``pool``'s own, to send ``command`` on by hand (released with
    ``pool.release``). redis-py 5.3+ takes no command name (and warns when given one)."""
    get: Callable[..., Awaitable[Connection]] = pool.get_connection
    param = inspect.signature(get).parameters.get("command_name")
    if param is None or param.default is not inspect.Parameter.empty:
        return await get()
    return await get(command)
