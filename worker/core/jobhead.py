"""A job or result record read in part: the fields of arq's record (:mod:`worker.core.codec`;
a result record adds its outcome, times and queue) found in its first and last bytes,
without ever decoding the whole record.

The jobs listing and a job's detail read a bounded head and tail of each record
(``GETRANGE``, :meth:`Store.job_records <worker.storage.Store.job_records>`): a 4 MiB
payload costs the view a few KiB. The head is decoded in order, field by field, and stops at
the first value cut by the read: the leading arguments are shown, then ``… (N bytes)``. The
fields arq writes after the arguments (the enqueue time; a result's times and queue) are
looked up in the tail. msgpack and JSON records are read this way; a cut pickle record is
never unpickled (its try and task are read from its opcodes, which runs nothing). Whatever is
found is checked (type, range, length) before it is used: a record is input, not a fact.
"""

from __future__ import annotations

import json
import pickletools
import re
from typing import Any

import msgpack

from worker.core import codec
from worker.core.serializer import Deserialize, json_loads, msgpack_loads

#: Bytes of a record's head read for a listing, and for a job's detail.
HEAD_BYTES = 4 * 1024
DETAIL_HEAD_BYTES = 64 * 1024
#: Bytes of a cut record's tail read for the fields after the arguments.
TAIL_BYTES = 256
#: What the listing, and a job's detail, read of each record (``Store.job_records``' options).
LISTING_READ: dict[str, Any] = {"head_bytes": HEAD_BYTES, "tail_bytes": TAIL_BYTES}
DETAIL_READ: dict[str, Any] = {"head_bytes": DETAIL_HEAD_BYTES, "tail_bytes": TAIL_BYTES}
#: Arguments decoded from a head at most (the rest is shown as cut).
MAX_ARGS = 64
#: Largest time or counter taken from a record (2^53: exact as a float, as JSON readers need).
MAX_INT = 2**53
#: Longest string field (task, queue, id) taken from a tail.
MAX_NAME = 512


def read_head(head: bytes, deserialize: Deserialize) -> tuple[dict[str, Any], bool]:
    """The fields of a record's ``head`` (its first bytes, cut), in order, up to the first one
    the cut reaches; ``"a"`` keeps the arguments that are whole. Also whether the arguments
    themselves were cut. Raises ``ValueError`` when the head is not such a record."""
    if deserialize is msgpack_loads:
        return _msgpack_head(head)
    if deserialize is json_loads:
        return _json_head(head)
    return _pickle_head(head), True


def read_tail(tail: bytes, deserialize: Deserialize, keys: tuple[str, ...]) -> dict[str, Any]:
    """``keys`` found in a record's last bytes, each checked (a whole int in ``[0, 2^53)``, a
    short string or a bool); the ones not found, or not plausible, are left out."""
    if deserialize is msgpack_loads:
        found = {k: _msgpack_after(tail, k) for k in keys}
    elif deserialize is json_loads:
        found = {k: _json_after(tail, k) for k in keys}
    else:
        return {}
    return {k: v for k, v in found.items() if _plausible(v)}


def _plausible(v: Any) -> bool:
    if isinstance(v, bool):
        return True
    if isinstance(v, int):
        return 0 <= v < MAX_INT
    return isinstance(v, str) and len(v) <= MAX_NAME


# -- msgpack ---------------------------------------------------------------------------------


def _unpacker(data: bytes) -> msgpack.Unpacker:
    n = max(len(data), 16)  # no container or string in ``data`` is longer than ``data``
    return msgpack.Unpacker(
        raw=False,
        strict_map_key=False,
        max_buffer_size=n,
        max_str_len=n,
        max_bin_len=n,
        max_array_len=n,
        max_map_len=n,
        max_ext_len=n,
    )


def _msgpack_head(head: bytes) -> tuple[dict[str, Any], bool]:
    u = _unpacker(head)
    u.feed(head)
    try:
        fields = u.read_map_header()
    except Exception as exc:
        raise ValueError(f"not a map ({type(exc).__name__})") from None
    out: dict[str, Any] = {}
    try:
        for _ in range(fields):
            key = u.unpack()
            if key == codec.ARGS:
                out[codec.ARGS], cut = _msgpack_args(u, head)
                if cut:
                    return out, True
            else:
                out[key] = u.unpack()
    except Exception:  # cut inside a key or value (or a value over the head's limits)
        return out, True
    return out, False


def _msgpack_args(u: msgpack.Unpacker, head: bytes) -> tuple[list[Any], bool]:
    try:
        n = u.read_array_header()
    except Exception:
        return [], True
    args: list[Any] = []
    at = u.tell()
    try:
        for _ in range(min(n, MAX_ARGS)):
            args.append(u.unpack())
            at = u.tell()
    except Exception:
        start = _start_of(head, at)
        if start is not None:
            args.append(start)
        return args, True
    return args, n > MAX_ARGS


class Start:
    """The start of a string or bytes argument the head cuts: shown as its ``repr`` and ``…``."""

    def __init__(self, value: str | bytes) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"{self.value!r}…"


#: msgpack's str and bin headers: type byte -> bytes of the length that follows.
_STR = {0xD9: 1, 0xDA: 2, 0xDB: 4}
_BIN = {0xC4: 1, 0xC5: 2, 0xC6: 4}


def _start_of(head: bytes, at: int, chars: int = 200) -> Start | None:
    """The start of the string or bytes at ``head[at]``, cut by the head (else ``None``)."""
    kind = head[at] if at < len(head) else None
    if kind is None:
        return None
    if 0xA0 <= kind <= 0xBF:
        body = head[at + 1 :]
    elif kind in _STR or kind in _BIN:
        body = head[at + 1 + _STR.get(kind, _BIN.get(kind, 0)) :]
    else:
        return None
    if kind in _BIN:
        return Start(body[:chars])
    return Start(body[: chars * 4].decode(errors="ignore")[:chars])


def _msgpack_after(tail: bytes, key: str) -> Any:
    at = tail.rfind(msgpack.packb(key))
    if at < 0:
        return None
    u = _unpacker(tail)
    u.feed(tail[at:])
    try:
        u.skip()
        return u.unpack()
    except Exception:
        return None


# -- JSON --------------------------------------------------------------------------------------

_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\n\r]*")


def _json_head(head: bytes) -> tuple[dict[str, Any], bool]:
    text = head.decode(errors="ignore")  # a cut may split a character
    i = _WS.match(text, 0).end()  # type: ignore[union-attr]
    if text[i : i + 1] != "{":
        raise ValueError("not an object")
    out: dict[str, Any] = {}
    i += 1
    try:
        while True:
            i = _WS.match(text, i).end()  # type: ignore[union-attr]
            if text[i : i + 1] == "}":
                return out, False
            key, i = _DECODER.raw_decode(text, i)
            i = _WS.match(text, i).end()  # type: ignore[union-attr]
            if text[i : i + 1] != ":":
                return out, True
            i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
            if key == codec.ARGS and text[i : i + 1] == "[":
                out[codec.ARGS], i, cut = _json_args(text, i + 1)
                if cut:
                    return out, True
            else:
                out[str(key)], i = _DECODER.raw_decode(text, i)
            i = _WS.match(text, i).end()  # type: ignore[union-attr]
            if text[i : i + 1] == ",":
                i += 1
    except Exception:  # cut inside a key or value (or nested past the recursion limit)
        return out, True


def _json_args(text: str, i: int) -> tuple[list[Any], int, bool]:
    args: list[Any] = []
    at = i
    try:
        while len(args) < MAX_ARGS:
            i = _WS.match(text, i).end()  # type: ignore[union-attr]
            if text[i : i + 1] == "]":
                return args, i + 1, False
            at = i
            value, i = _DECODER.raw_decode(text, i)
            args.append(value)
            i = _WS.match(text, i).end()  # type: ignore[union-attr]
            if text[i : i + 1] == ",":
                i += 1
    except Exception:
        if text[at : at + 1] == '"':  # a string cut by the head: its start
            args.append(Start(_json_start(text[at + 1 : at + 201])))
    return args, i, True


def _json_start(chunk: str) -> str:
    """The first characters of a JSON string cut short (escapes decoded where whole)."""
    for end in range(len(chunk), max(len(chunk) - 8, -1), -1):
        try:
            return str(json.loads(f'"{chunk[:end]}"'))
        except ValueError:
            continue
    return ""


def _json_after(tail: bytes, key: str) -> Any:
    text = tail.decode(errors="ignore")
    ends = [m.end() for m in re.finditer(rf'"{re.escape(key)}"\s*:\s*', text)]
    if not ends:
        return None
    try:
        return _DECODER.raw_decode(text, ends[-1])[0]
    except Exception:
        return None


# -- pickle (never unpickled) ------------------------------------------------------------------


_PICKLE_HEAD = (codec.TRY, codec.FUNCTION)


def _pickle_head(head: bytes) -> dict[str, Any]:
    """``t`` and ``f`` of a cut pickle record, read from its opcodes (nothing is run)."""
    out: dict[str, Any] = {}
    want: str | None = None
    try:
        for op, arg, _ in pickletools.genops(head):
            if op.name in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT", "FRAME", "PROTO", "MARK"):
                continue
            if want is not None:
                if op.name == "NONE" or isinstance(arg, int | str):
                    out[want] = arg
                want = None
            elif isinstance(arg, str) and arg in _PICKLE_HEAD and arg not in out:
                want = arg
            if all(f in out for f in _PICKLE_HEAD):
                break
    except Exception:
        pass  # the cut, or not a pickle: what was found is kept
    return out
