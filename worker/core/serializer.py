"""Job payload serializers: msgpack (default), JSON, and pickle as an explicit opt-in.

Payloads keep arq's job record format (:mod:`worker.core.codec`), so a plain arq client
configured with the same serializer pair can enqueue work and arq's tools can read it. Pickle is
not the default because unpickling runs code: anyone who can write to Redis could run code in
every worker.
"""

from __future__ import annotations

import datetime as dt
import json
import pickle
import uuid
import warnings
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Literal

import msgpack

from worker.core import budget as B
from worker.core import codec

SerializerName = Literal["msgpack", "json", "pickle"]
Serialize = Callable[[dict[str, Any]], bytes]
Deserialize = Callable[[bytes], dict[str, Any]]

_EXT_DATETIME = 1
_EXT_DATE = 2


class PickleWarning(UserWarning):
    """Emitted once when pickle is chosen as the job serializer."""


def _plain(obj: Any) -> Any:
    """Convert the few non-JSON values job results commonly carry."""
    if isinstance(obj, BaseException):
        return {"error": type(obj).__name__, "message": str(obj)}
    if isinstance(obj, uuid.UUID | Decimal):
        return str(obj)
    if isinstance(obj, set | frozenset | tuple):
        return list(obj)
    if isinstance(obj, dt.timedelta):
        return obj.total_seconds()
    raise TypeError(f"cannot serialize object of type {type(obj).__name__}")


def _msgpack_default(obj: Any) -> Any:
    if isinstance(obj, dt.datetime):
        return msgpack.ExtType(_EXT_DATETIME, obj.isoformat().encode())
    if isinstance(obj, dt.date):
        return msgpack.ExtType(_EXT_DATE, obj.isoformat().encode())
    return _plain(obj)


def _msgpack_ext(code: int, data: bytes) -> Any:
    if code == _EXT_DATETIME:
        return dt.datetime.fromisoformat(data.decode())
    if code == _EXT_DATE:
        return dt.date.fromisoformat(data.decode())
    return msgpack.ExtType(code, data)


def msgpack_dumps(data: dict[str, Any]) -> bytes:
    return msgpack.packb(data, default=_msgpack_default, use_bin_type=True)  # type: ignore[no-any-return]


def msgpack_loads(raw: bytes) -> dict[str, Any]:
    """A msgpack record within the decode budget (:mod:`worker.core.budget`; over it:
    :class:`~worker.core.budget.OverBudget`, the decode stopped there)."""
    if len(raw) <= B.MAX_DEPTH or B.within_by_length(raw):  # the ordinary payload
        value = msgpack.unpackb(raw, raw=False, ext_hook=_msgpack_ext, strict_map_key=False)
    else:
        value = _msgpack_counted(raw)
    if not isinstance(value, dict):
        raise ValueError("job payload is not a map")
    return value


def _msgpack_counted(raw: bytes) -> Any:
    """A payload with many lists and maps (its depth walked), or one too long to be within the
    container and element budgets by its length (decoded with counting hooks, which stop the
    decode at the budget; the depth walked when it holds more than :data:`MAX_DEPTH`)."""
    if len(raw) <= B.COUNT_FROM:
        value = msgpack.unpackb(raw, raw=False, ext_hook=_msgpack_ext, strict_map_key=False)
    else:
        count = B.Counter()
        try:
            value = msgpack.unpackb(
                raw,
                raw=False,
                ext_hook=_msgpack_ext,
                strict_map_key=False,
                list_hook=count,
                object_hook=count,
                max_array_len=B.MAX_ELEMENTS,
                max_map_len=B.MAX_ELEMENTS,
            )
        except ValueError as exc:
            if "exceeds max_" in str(exc):  # one list or map longer than the element budget
                raise B.OverBudget(f"more than {B.MAX_ELEMENTS} elements in one list") from None
            raise
        if count.containers <= B.MAX_DEPTH:
            return value
    B.check_depth(value)
    return value


def _json_default(obj: Any) -> Any:
    if isinstance(obj, dt.datetime | dt.date):
        return obj.isoformat()
    return _plain(obj)


def json_dumps(data: dict[str, Any]) -> bytes:
    return json.dumps(data, default=_json_default, separators=(",", ":")).encode()


def json_loads(raw: bytes) -> dict[str, Any]:
    """A JSON record within the decode budget (:func:`worker.core.budget.json_loads`)."""
    value = B.json_loads(raw)
    if not isinstance(value, dict):
        raise ValueError("job payload is not an object")
    return value


def pickle_dumps(data: dict[str, Any]) -> bytes:
    return pickle.dumps(data)


def pickle_loads(raw: bytes) -> dict[str, Any]:
    # Explicit opt-in only (WORKER_SERIALIZER=pickle): see the module docstring.
    value = pickle.loads(raw)
    if not isinstance(value, dict):
        raise ValueError("job payload is not a dict")
    return value


def loads_for(dumps: Serialize) -> Deserialize | None:
    """The deserializer paired with one of the serializers above (``None`` for another)."""
    pairs: dict[Serialize, Deserialize] = {
        msgpack_dumps: msgpack_loads,
        json_dumps: json_loads,
        pickle_dumps: pickle_loads,
    }
    return pairs.get(dumps)


def get_serializer(name: SerializerName) -> tuple[Serialize, Deserialize]:
    """Return the ``(serialize, deserialize)`` pair for ``name``.

    Choosing ``pickle`` warns: it is only safe when nobody untrusted can write to Redis.
    """
    if name == "msgpack":
        return msgpack_dumps, msgpack_loads
    if name == "json":
        return json_dumps, json_loads
    if name == "pickle":
        warnings.warn(
            "WORKER_SERIALIZER=pickle: unpickling job payloads runs code; anyone who can "
            "write to this Redis can run code in every worker",
            PickleWarning,
            stacklevel=2,
        )
        return pickle_dumps, pickle_loads
    raise ValueError(f"unknown serializer {name!r}")


#: :func:`worker.core.codec.encode_job` (the job record's bytes), under its older name.
job_payload = codec.encode_job
