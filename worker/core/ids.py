"""Identifiers the framework builds and parses: lock values, job ids and the key prefix's Redis
Cluster hash tag, encoder beside decoder.

Nothing else in the package slices these strings: whoever builds an id here is the only one who
may take it apart again (a round-trip test pins each pair).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from uuid import uuid4

from worker.core.errors import InvalidId


def duty(kind: str, name: str) -> str:
    """A duty's name ``<kind>:<name>`` (``periodic:report``): what the paused set holds and
    what ``pause``/``resume`` accept (the kinds: :mod:`worker.duties.kinds`)."""
    return f"{kind}:{name}"


#: What ``pause queue:NAME`` adds to the paused set is ``queue:NAME``; ``pause --all`` adds
#: ``queue:*`` (:data:`ALL_QUEUES`), which pauses every queue whatever its own entry says.
ALL_QUEUES = "*"


def paused_queue(name: str) -> str:
    """The paused set's entry of queue ``name`` (``queue:emails``; ``queue:*``: every queue)."""
    return f"queue:{name}"


def paused_queues(paused: Collection[str], queues: Iterable[str]) -> set[str]:
    """Those of ``queues`` the paused set's entries ``paused`` pause."""
    every = paused_queue(ALL_QUEUES) in paused
    return {q for q in queues if every or paused_queue(q) in paused}


def parse_duty(text: str, kinds: Iterable[str]) -> tuple[str, str] | None:
    """``(kind, name)`` of a duty name, ``None`` when ``text`` names none of ``kinds``."""
    kind, sep, name = text.partition(":")
    if sep and name and kind in set(kinds):
        return kind, name
    return None


#: Unicode categories an id may not hold: controls (Cc: line breaks, escape sequences), format
#: characters (Cf: bidirectional overrides and isolates U+202A–U+202E, U+2066–U+2069,
#: zero-width characters), line and paragraph separators (Zl, Zp) and lone surrogates (Cs).
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def check_id(value: str, what: str) -> None:
    """Raise :class:`~worker.core.errors.InvalidId` when ``value`` (a job id or unique key, ``what``
    names it) holds a character of :data:`REFUSED_CATEGORIES`: an id is shown to operators (the
    console, its confirmation dialogs, the command line), where such a character breaks a line,
    reorders the text around it or drives the terminal. Costs one C-speed scan for a plain id."""
    if not isinstance(value, str):
        raise InvalidId(f"{what} must be a string, not {type(value).__name__}")
    if value.isprintable():  # no Cc, Cf, Zl, Zp, Cs (nor Zs but the space, nor Cn, Co)
        return
    for i, ch in enumerate(value):
        if unicodedata.category(ch) in REFUSED_CATEGORIES:
            code = ord(ch)
            shown = f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
            raise InvalidId(
                f"{what} holds a control, format or separator character ({shown} at {i}): "
                "line breaks, escape sequences and bidirectional controls are refused in job "
                "ids and unique keys"
            )


#: The longest flow key (it names Redis keys of the fair and per-key limit bookkeeping).
MAX_FLOW_KEY = 200


def check_flow_key(value: str | None) -> str | None:
    """``value`` when it is a usable flow key (or ``None``); :class:`InvalidId` when it is not
    a non-empty string of at most :data:`MAX_FLOW_KEY` printable characters."""
    if value is None:
        return None
    check_id(value, "flow_key")
    if not value or len(value) > MAX_FLOW_KEY:
        raise InvalidId(f"flow_key must be 1 to {MAX_FLOW_KEY} characters, not {len(value)}")
    return value


def hash_tag(prefix: str) -> str | None:
    """The Redis Cluster hash tag a key prefix starts with (``{shop}:`` -> ``shop``), or
    ``None``: an empty ``{}`` is no tag (Redis hashes the whole key then)."""
    if prefix.startswith("{"):
        end = prefix.find("}")
        if end > 1:
            return prefix[1:end]
    return None


#: Every epoch is below this (Lua numbers are doubles: integers are exact only below 2^53); an
#: epoch read from Redis or a channel at or above it is malformed.
EPOCH_LIMIT = 2**53
#: How far ahead of the Redis server's clock (ms) an epoch may be: epochs start at the clock and
#: grow by one per leadership, so one a day ahead was never issued (``election.ACQUIRE``).
EPOCH_AHEAD_MS = 86_400_000


def _ascii(raw: str | bytes | None) -> str | None:
    """``raw`` as text: bytes decoded as ASCII (``None`` when they are not), text as it is."""
    if isinstance(raw, bytes):
        try:
            return raw.decode("ascii")
        except UnicodeDecodeError:
            return None
    return raw


def parse_epoch(raw: str | bytes | None) -> int | None:
    """An epoch as the framework writes it: ASCII digits only, no sign, no exponent, below
    :data:`EPOCH_LIMIT`; ``None`` for anything else (``1e+14``, ``-1``, ``١٢``, 20 digits)."""
    raw = _ascii(raw)
    if not raw or len(raw) > 16 or not (raw.isascii() and raw.isdigit()):
        return None
    epoch = int(raw)
    return epoch if epoch < EPOCH_LIMIT else None


@dataclass(frozen=True, order=True)
class LockValue:
    """The leader lock's value ``<epoch>:<token>``: the epoch orders leaderships, the random
    token tells two processes apart. Compared whole, never by epoch alone."""

    epoch: int
    token: str

    def __str__(self) -> str:
        return f"{self.epoch}:{self.token}"

    @classmethod
    def parse(cls, raw: str | bytes | None) -> LockValue | None:
        """The lock value in ``raw``, or ``None`` for an absent or unreadable one: the epoch is
        parsed strictly (:func:`parse_epoch`), the token is printable ASCII of at most 128."""
        raw = _ascii(raw)
        if raw is None:
            return None
        head, sep, token = raw.partition(":")
        epoch = parse_epoch(head)
        if not sep or epoch is None or not 0 < len(token) <= 128 or not token.isprintable():
            return None
        if not token.isascii():
            return None
        return cls(epoch, token)


@dataclass(frozen=True)
class JobIds:
    """Job ids under a key prefix: every id the framework makes starts with it, so arq's
    per-job keys (``arq:job:<id>``, ``arq:in-progress:<id>``, ``arq:result:<id>``,
    ``arq:retry:<id>``) fall under per-app ACL patterns (``~arq:job:<prefix>*``) and, with a
    hash-tagged prefix, in the app's Redis Cluster slot. The deterministic ones double as
    unique keys (arq refuses an id whose job or result record exists)."""

    prefix: str

    # -- random ids: <prefix><32 hex digits> -----------------------------------------------------
    def random(self) -> str:
        return f"{self.prefix}{uuid4().hex}"

    # -- periodic ticks: <prefix>periodic:<name>:<tick ms> -----------------------------------
    def periodic(self, name: str, tick_ms: int) -> str:
        return f"{self.prefix}periodic:{name}:{tick_ms}"

    def parse_periodic(self, job_id: str) -> tuple[str, int] | None:
        """``(name, tick_ms)`` of a periodic job id, ``None`` for any other id."""
        head = f"{self.prefix}periodic:"
        if not job_id.startswith(head):
            return None
        name, sep, tick = job_id[len(head) :].rpartition(":")
        if not sep or not name or not tick.isdigit():
            return None
        return name, int(tick)

    # -- run-time schedule ticks: <prefix>schedule:<name>:<tick ms> ---------------------------
    def schedule(self, name: str, tick_ms: int) -> str:
        return f"{self.prefix}schedule:{name}:{tick_ms}"

    # -- poll dispatches: <prefix>poll:<poller>:<item>:<due ms> ------------------------------
    def poll(self, poller: str, item: str, due_ms: int) -> str:
        return f"{self.prefix}poll:{poller}:{item}:{due_ms}"

    def parse_poll(self, job_id: str) -> tuple[str, str, int] | None:
        """``(poller, item, due_ms)`` of a poll job id (poller names contain no ``:``; items
        may), ``None`` for any other id."""
        head = f"{self.prefix}poll:"
        if not job_id.startswith(head):
            return None
        poller, sep, rest = job_id[len(head) :].partition(":")
        item, sep2, due = rest.rpartition(":")
        if not sep or not sep2 or not poller or not due.lstrip("-").isdigit():
            return None
        return poller, item, int(due)

    # -- unique jobs: <prefix>unique:<key> ------------------------------------------------------
    def unique(self, unique_key: str) -> str:
        return f"{self.prefix}unique:{unique_key}"


def shard_index(job_id: str, prefixes: tuple[str, ...]) -> int:
    """The queue shard a job id belongs to: the index of the shard prefix it starts with
    (``WORKER_QUEUE_SHARDS``; see :mod:`worker.storage.shards`), 0 (home) for any other id.
    No shard prefix is a prefix of another (``{shop}:`` against ``{shop#3}:``)."""
    for i in range(1, len(prefixes)):
        if job_id.startswith(prefixes[i]):
            return i
    return 0
