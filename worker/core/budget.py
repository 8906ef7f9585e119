"""Decode budgets: what decoding data read from Redis may cost, decided before the work.

Bytes alone do not bound a decode: 4 MiB of msgpack can hold 4 million empty lists (~300 MB
of Python objects, seconds of a blocked loop), 200 KB of JSON can nest deeper than Python
recurses. Every decode of a job payload, a broadcast or a record is held to:

- :data:`MAX_DEPTH` levels of nesting;
- :data:`MAX_CONTAINERS` lists and maps, and :data:`MAX_ELEMENTS` elements in them, in all;
- for JSON records (:func:`json_record`): :data:`RECORD_BYTES`, and numbers a reader can use
  (no ``NaN``/``Infinity``, no float that overflows, no integer of more than 20 characters).

The checks cost nothing measurable on an ordinary payload: a payload with at most
:data:`MAX_DEPTH` bytes that could open a container cannot break any limit, and that count is
one C-speed pass (``bytes.translate`` / ``bytes.count``); only a payload with more pays for a
depth walk, and only one over :data:`COUNT_FROM` bytes is decoded with counting hooks (which
stop the decode at the budget, so a hostile payload is never decoded in full). A payload over
budget raises :class:`OverBudget` (a ``ValueError``): a job is dead-lettered with its message,
a record or broadcast is skipped as malformed.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

#: Deepest nesting of lists and maps accepted in a payload or record: deeper than any real
#: document, well short of what breaks Python's recursion (1000) or msgpack's packer (511).
MAX_DEPTH = 200
#: Most lists and maps one payload or record may decode to (~8 MB of empty lists).
MAX_CONTAINERS = 100_000
#: Most elements (list items, map entries) one payload may decode to, all lists together.
MAX_ELEMENTS = 1_000_000
#: Payloads longer than this are decoded with counting hooks (shorter ones cannot break the
#: container or element budget: every container or element takes at least one byte).
COUNT_FROM = 64 * 1024
#: Largest JSON record (instance, failure, dead letter, progress, audit, periodic run) read.
RECORD_BYTES = 2 * 1024 * 1024
#: Longest integer literal accepted in a JSON record (a signed 64-bit integer has 20).
RECORD_INT_CHARS = 20

#: msgpack's bytes that may open a container (fixarray, fixmap, array16/32, map16/32); also
#: found inside strings and numbers, so their count is an upper bound on the containers.
_MSGPACK_OPENERS = bytes([*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF])
_NOT_OPENERS = bytes(b for b in range(256) if b not in _MSGPACK_OPENERS)
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


class OverBudget(ValueError):
    """Data whose decode would break its budget (see module docstring)."""


def within_by_length(raw: bytes) -> bool:
    """Whether msgpack ``raw`` is within every budget by its length and a count from above of
    the lists and maps it holds (bytes that may open one; one C pass): at most
    :data:`COUNT_FROM` bytes and at most :data:`MAX_DEPTH` such bytes."""
    n = len(raw)
    if n <= MAX_DEPTH:
        return True
    return n <= COUNT_FROM and len(raw.translate(None, _NOT_OPENERS)) <= MAX_DEPTH


class Counter:
    """msgpack ``list_hook``/``object_hook``: counts containers and their elements as the
    decode builds them and stops it (:class:`OverBudget`) at the budget."""

    __slots__ = ("containers", "elements")

    def __init__(self) -> None:
        self.containers = 0
        self.elements = 0

    def __call__(self, value: Any) -> Any:
        self.containers += 1
        self.elements += len(value)
        if self.containers > MAX_CONTAINERS:
            raise OverBudget(f"more than {MAX_CONTAINERS} lists and maps")
        if self.elements > MAX_ELEMENTS:
            raise OverBudget(f"more than {MAX_ELEMENTS} elements")
        return value


def check_depth(value: Any, limit: int = MAX_DEPTH) -> None:
    """Raise :class:`OverBudget` when ``value`` nests lists and maps deeper than ``limit``
    (a walk of the containers level by level, never recursive)."""
    level = [value] if type(value) is list or type(value) is dict else []
    for _ in range(limit):
        level = [
            x
            for v in level
            for x in (v.values() if type(v) is dict else v)
            if type(x) is list or type(x) is dict
        ]
        if not level:
            return
    raise OverBudget(f"nested deeper than {limit} levels")


def json_structure(raw: bytes | str) -> bool:
    """Check JSON ``raw`` against the container and element budgets before it is decoded
    (counts of brackets and commas; strings stripped first only when those counts are over):
    ``True`` when it may nest deeper than :data:`MAX_DEPTH` (a walk is due after decoding)."""
    data = raw.encode() if isinstance(raw, str) else raw
    opens = data.count(b"[") + data.count(b"{")
    if opens <= MAX_DEPTH:
        return False
    if opens > MAX_CONTAINERS or data.count(b",") > MAX_ELEMENTS:
        bare = _JSON_STRING.sub(b"", data)
        if bare.count(b"[") + bare.count(b"{") > MAX_CONTAINERS:
            raise OverBudget(f"more than {MAX_CONTAINERS} lists and maps")
        if bare.count(b",") > MAX_ELEMENTS:
            raise OverBudget(f"more than {MAX_ELEMENTS} elements")
    return True


def json_loads(raw: bytes | str, **hooks: Any) -> Any:
    """``json.loads`` within the structure budget: :class:`OverBudget` (never
    ``RecursionError``) for a document too deep or too large in containers and elements."""
    deep = json_structure(raw)
    try:
        value = json.loads(raw, **hooks)
    except RecursionError:
        raise OverBudget(f"nested deeper than {MAX_DEPTH} levels") from None
    if deep:
        check_depth(value)
    return value


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a reader can use")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _int(text: str) -> int:
    if len(text) > RECORD_INT_CHARS:
        raise ValueError(f"an integer of {len(text)} digits")
    return int(text)


def json_record(raw: bytes | str) -> Any:
    """A JSON record read from Redis, strictly: at most :data:`RECORD_BYTES`, within the
    structure budget, no ``NaN``/``Infinity``, no overflowing float, no integer longer than
    :data:`RECORD_INT_CHARS`. Raises ``ValueError`` (only) for anything else."""
    if len(raw) > RECORD_BYTES:
        raise OverBudget(f"a record of {len(raw)} bytes (more than {RECORD_BYTES})")
    return json_loads(raw, parse_constant=_constant, parse_float=_float, parse_int=_int)
