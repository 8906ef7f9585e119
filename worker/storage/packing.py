"""Commands packed in C: redis-py's asyncio connections pack every command in Python, one
bytes join per argument; :class:`Packing` packs with hiredis instead, as redis-py's synchronous
client does when hiredis is installed (the same bytes; redis-py's own packer without it)."""

from __future__ import annotations

from typing import Any, TypeVar

from redis.asyncio.connection import AbstractConnection
from redis.connection import HiredisRespSerializer
from redis.utils import HIREDIS_AVAILABLE

#: Packs a command in C (hiredis), as redis-py's synchronous client does when hiredis is
#: installed; its asyncio client packs in Python, one bytes join per argument (a ``FINISH`` of
#: 100 runs, 1,000 arguments: ~1 ms of CPU, ~6x hiredis). The bytes sent are the same.
_PACKER = HiredisRespSerializer() if HIREDIS_AVAILABLE else None
if HIREDIS_AVAILABLE:
    from hiredis import pack_command as _pack


class Packing(AbstractConnection):
    """A connection whose commands hiredis packs (:data:`_PACKER`; redis-py's own packer
    without hiredis). Every pool :func:`worker.storage.connection.connect_redis` makes uses it; the
    encoding is redis-py's default (UTF-8, strict), which hiredis applies to text too."""

    def pack_command(self, *args: Any) -> list[bytes]:
        if _PACKER is None:
            return super().pack_command(*args)
        head = args[0]
        if type(head) is str and " " not in head:  # EVALSHA, GET: the usual one-word name
            try:  # what the serializer does, without its per-argument pass in Python
                return [_pack(args)]
            except TypeError:  # a bytearray, a memoryview: the serializer converts it
                pass
        return _PACKER.pack(*args)  # type: ignore[no-any-return]


C = TypeVar("C", bound=AbstractConnection)
_PACKING: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def packing(cls: type[C]) -> type[C]:
    """``cls`` with its commands packed by :class:`Packing` (one subclass per class)."""
    if issubclass(cls, Packing):
        return cls
    if cls not in _PACKING:
        _PACKING[cls] = type(f"Packing{cls.__name__}", (Packing, cls), {})
    return _PACKING[cls]  # type: ignore[return-value]
