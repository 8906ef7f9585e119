"""Broadcast topics, the sender's side: what a topic and a handler are, the message a process
receives, and :func:`publish`, which refuses a broadcast that would loop (sent from a handler
to a topic already in its chain) or that is too large. Every process's listener is
:mod:`worker.duties.broadcast`, where the design is told whole."""

from __future__ import annotations

import contextvars
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import structlog

from worker.core.serializer import Serialize

log = structlog.get_logger("worker.broadcast")

#: Messages kept per topic: a process away for more messages than this misses the oldest.
HISTORY = 100
#: Largest broadcast payload by default (``WORKER_MAX_BROADCAST_BYTES``).
MAX_BYTES = 1024 * 1024


class Sender(Protocol):
    """Where a broadcast is appended (the store)."""

    async def broadcast(
        self, topic: str, payload: bytes, *, origin: str, chain: Sequence[str], history: int
    ) -> tuple[str, int]: ...


OnStart = Literal["latest", "none"]
BroadcastFn = Callable[..., Awaitable[None]]

#: Like every other name; no ',' (chains are comma-joined) and no glob characters (keys).
_TOPIC = re.compile(r"^[A-Za-z_][\w.-]*$")


def check_topic(topic: str) -> str:
    """``topic`` if it is a valid topic name, else :class:`ValueError`."""
    if not isinstance(topic, str) or not _TOPIC.match(topic):
        raise ValueError(f"broadcast topic {topic!r}: use letters, digits, '_', '.', '-'")
    return topic


@dataclass(frozen=True)
class BroadcastDef:
    """``async def fn(ctx, data)``, run in every process for each message on ``topic``.

    ``on_start``: ``"latest"`` hands a starting process the topic's newest message;
    ``"none"`` only what is sent after. ``tries``: runs per message before giving up.
    """

    topic: str
    fn: BroadcastFn
    on_start: OnStart = "latest"
    tries: int = 5

    @property
    def name(self) -> str:
        return str(getattr(self.fn, "__name__", self.fn))


@dataclass(frozen=True)
class Message:
    """A broadcast as a process received it; ``start``: the newest one handed over on start."""

    topic: str
    seq: int
    origin: str
    chain: tuple[str, ...]
    payload: bytes
    start: bool = False


#: The message whose handler runs in this task (and in the tasks that handler starts).
handling: contextvars.ContextVar[Message | None] = contextvars.ContextVar(
    "worker_broadcasthandling", default=None
)


class BroadcastTooLarge(ValueError):
    """A broadcast whose payload is over ``WORKER_MAX_BROADCAST_BYTES``: refused at publish."""


async def publish(
    store: Sender,
    serialize: Serialize,
    topic: str,
    data: Any,
    *,
    origin: str,
    history: int = HISTORY,
    max_bytes: int = MAX_BYTES,
) -> int | None:
    """Send ``data`` to ``topic``'s handlers in every process: the message's sequence number,
    or ``None`` when refused because it would loop (see the module docstring);
    :class:`BroadcastTooLarge` when it serializes to more than ``max_bytes``."""
    check_topic(topic)
    parent = handling.get()
    chain = () if parent is None else (*parent.chain, parent.topic)
    if topic in chain:
        log.warning(
            "broadcast refused: sent from a handler it would trigger again",
            topic=topic,
            chain=list(chain),
        )
        return None
    payload = serialize({"data": data})
    if len(payload) > max_bytes:
        raise BroadcastTooLarge(
            f"broadcast to {topic!r}: {len(payload)} bytes serialized, more than "
            f"WORKER_MAX_BROADCAST_BYTES ({max_bytes}); send a reference (a key, a URL), "
            "not the data"
        )
    _, seq = await store.broadcast(topic, payload, origin=origin, chain=chain, history=history)
    return seq
