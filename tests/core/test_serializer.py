"""Serializers keep arq's job record format; msgpack is the default, pickle warns."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from harness.arqfmt import deserialize_job, deserialize_result, serialize_job, serialize_result
from worker.core.budget import MAX_DEPTH, OverBudget, json_record
from worker.core.serializer import (
    PickleWarning,
    get_serializer,
    job_payload,
    json_loads,
    msgpack_dumps,
    msgpack_loads,
)

ET = 1_700_000_000_123
AWARE = dt.datetime(2024, 5, 1, 12, 30, 45, 123456, tzinfo=dt.UTC)
SHANGHAI = dt.datetime(2024, 5, 1, 20, 30, tzinfo=dt.timezone(dt.timedelta(hours=8)))
NAIVE = dt.datetime(2024, 5, 1, 12, 30)


@pytest.mark.parametrize("name", ["msgpack", "json"])
def test_job_record_round_trip(name: Any) -> None:
    ser, de = get_serializer(name)
    args = (1, "two", [3, 4], {"five": 6.5}, None, True)
    kwargs = {"x": "y", "nested": {"a": [1, 2]}}
    raw = serialize_job("send_receipt", args, kwargs, 2, ET, serializer=ser)
    job = deserialize_job(raw, deserializer=de)
    assert job.function == "send_receipt"
    assert tuple(job.args) == args
    assert job.kwargs == kwargs
    assert job.job_try == 2
    assert int(job.enqueue_time.timestamp() * 1000) == ET


def test_msgpack_keeps_datetimes_and_dates_exactly() -> None:
    ser, de = get_serializer("msgpack")
    values = [AWARE, SHANGHAI, NAIVE, dt.date(2024, 2, 29)]
    raw = serialize_job("f", tuple(values), {"at": AWARE}, None, ET, serializer=ser)
    job = deserialize_job(raw, deserializer=de)
    assert list(job.args) == values
    assert job.args[1].utcoffset() == dt.timedelta(hours=8)
    assert job.args[2].tzinfo is None
    assert type(job.args[3]) is dt.date
    assert job.kwargs == {"at": AWARE}


def test_json_turns_datetimes_into_iso_strings() -> None:
    ser, de = get_serializer("json")
    raw = serialize_job("f", (AWARE, dt.date(2024, 2, 29)), {}, None, ET, serializer=ser)
    job = deserialize_job(raw, deserializer=de)
    assert list(job.args) == [AWARE.isoformat(), "2024-02-29"]
    assert dt.datetime.fromisoformat(job.args[0]) == AWARE


@pytest.mark.parametrize("name", ["msgpack", "json"])
def test_common_result_values(name: Any) -> None:
    ser, de = get_serializer(name)
    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    data = {"u": u, "d": Decimal("1.10"), "s": {3}, "t": (1, 2), "td": dt.timedelta(minutes=1)}
    assert de(ser(data)) == {"u": str(u), "d": "1.10", "s": [3], "t": [1, 2], "td": 60.0}


@pytest.mark.parametrize("name", ["msgpack", "json"])
def test_exception_result_round_trips_through_arq(name: Any) -> None:
    ser, de = get_serializer(name)
    raw = serialize_result(
        "f",
        (1,),
        {},
        3,
        ET,
        False,
        ValueError("boom"),
        ET + 10,
        ET + 20,
        "ref",
        "q",
        "jid",
        serializer=ser,
    )
    assert raw is not None
    res = deserialize_result(raw, deserializer=de)
    assert res.success is False
    assert res.result == {"error": "ValueError", "message": "boom"}
    assert (res.function, res.job_try, res.job_id, res.queue_name) == ("f", 3, "jid", "q")


@pytest.mark.parametrize("name", ["msgpack", "json"])
def test_unserializable_value_raises_type_error(name: Any) -> None:
    ser, _ = get_serializer(name)
    with pytest.raises(TypeError, match="object"):
        ser({"x": object()})


def test_deserializers_reject_non_maps() -> None:
    with pytest.raises(ValueError):
        msgpack_loads(b"\x93\x01\x02\x03")  # msgpack [1, 2, 3]
    with pytest.raises(ValueError):
        json_loads(b"[1, 2, 3]")


def test_unknown_msgpack_ext_type_is_kept_opaque() -> None:
    import msgpack

    raw = msgpack.packb({"x": msgpack.ExtType(42, b"zz")})
    assert msgpack_loads(raw) == {"x": msgpack.ExtType(42, b"zz")}


def test_pickle_is_opt_in_and_warns() -> None:
    with pytest.warns(PickleWarning, match="runs code"):
        ser, de = get_serializer("pickle")
    raw = serialize_job("f", (AWARE, ValueError("x")), {}, 1, ET, serializer=ser)
    job = deserialize_job(raw, deserializer=de)
    assert job.args[0] == AWARE
    assert isinstance(job.args[1], ValueError)


def test_msgpack_and_json_do_not_warn() -> None:
    # filterwarnings=error turns any warning into a failure here
    get_serializer("msgpack")
    get_serializer("json")


def test_unknown_serializer() -> None:
    with pytest.raises(ValueError, match="yaml"):
        get_serializer("yaml")  # type: ignore[arg-type]


#: arq 0.28's bytes (``arq.jobs.serialize_job`` / ``serialize_result``) for the records below:
#: the codec writes them without arq installed (tests/face/test_contract_arq.py compares with arq
#: itself where it is).
ARQ_JOB = {
    "msgpack": bytes.fromhex(
        "85a17404a166a9706f6c6c5f63617264a16192a6636172642d3102a16b81a16b01a26574cf0000018bcfe5687b"
    ),
    "json": b'{"t":4,"f":"poll_card","a":["card-1",2],"k":{"k":1},"et":1700000000123}',
}
ARQ_RESULT = {
    "msgpack": b"\x8b\xa1t\x02\xa1f\xa9poll_card\xa1a\x91\xa6card-1\xa1k\x80\xa2et\xcd\x03\xe8"
    b"\xa1s\xc3\xa1r*\xa2st\xcd\x07\xd0\xa2ft\xcd\x0b\xb8\xa1q\xa1q\xa2id\xa2j1",
    "json": b'{"t":2,"f":"poll_card","a":["card-1"],"k":{},"et":1000,"s":true,"r":42,"st":2000,'
    b'"ft":3000,"q":"q","id":"j1"}',
}


@pytest.mark.parametrize("name", ["msgpack", "json"])
def test_records_are_arqs_bytes(name: Any) -> None:
    ser, de = get_serializer(name)
    assert job_payload("poll_card", ("card-1", 2), {"k": 1}, ET, ser, job_try=4) == ARQ_JOB[name]
    result = serialize_result(
        "poll_card", ("card-1",), {}, 2, 1000, True, 42, 2000, 3000, "r", "q", "j1", serializer=ser
    )
    assert result == ARQ_RESULT[name]
    info = deserialize_result(ARQ_RESULT[name], deserializer=de)
    assert (info.function, list(info.args), info.success, info.result, info.job_id) == (
        "poll_card", ["card-1"], True, 42, "j1"
    )  # fmt: skip
    assert int(info.finish_time.timestamp() * 1000) == 3000


@pytest.mark.parametrize("name", ["msgpack", "json"])
@pytest.mark.parametrize("job_try", [None, 4])
def test_job_payload_matches_arq_layout(name: Any, job_try: int | None) -> None:
    ser, de = get_serializer(name)
    args = ("card-1", 2, AWARE) if name == "msgpack" else ("card-1", 2)
    ours = job_payload("poll_card", args, {"k": 1}, ET, ser, job_try=job_try)
    assert de(ours) == {"t": job_try, "f": "poll_card", "a": list(args), "k": {"k": 1}, "et": ET}
    assert list(de(ours)) == ["t", "f", "a", "k", "et"]  # arq's order
    job = deserialize_job(ours, deserializer=de)
    assert (job.function, tuple(job.args), job.kwargs, job.job_try) == (
        "poll_card",
        args,
        {"k": 1},
        job_try,
    )
    assert int(job.enqueue_time.timestamp() * 1000) == ET


def test_job_payload_accepts_list_args() -> None:
    assert msgpack_loads(job_payload("f", [1, 2], {}, ET, msgpack_dumps))["a"] == [1, 2]


# -- decode budgets -------------------------------------------------------


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


# built when the test runs, not at import: millions of objects would cost every collection
@pytest.mark.parametrize(
    "build",
    [
        lambda: [[[] for _ in range(4_000_000)]],  # 4 MB: one list of 4 million empty lists
        lambda: [[[[] for _ in range(2_000)] for _ in range(2_000)]],  # no list over the cap
        lambda: [[-20] * 1_500_000],  # 1.5 million elements that are objects of their own
    ],
    ids=["4M-empty-lists", "2000x2000", "1.5M-ints"],
)
def test_a_payload_over_the_decode_budget_is_refused_part_way(
    build: Callable[[], list[Any]],
) -> None:
    raw = job_payload("f", build(), {}, ET, msgpack_dumps)
    with pytest.raises(OverBudget, match="more than"):
        msgpack_loads(raw)


@pytest.mark.parametrize("name", ["msgpack", "json"])
def test_nesting_deeper_than_the_budget_is_refused_and_within_it_decodes(name: Any) -> None:
    ser, de = get_serializer(name)
    assert de(job_payload("f", [_nested(MAX_DEPTH - 2)], {}, ET, ser))["f"] == "f"
    deep = job_payload("f", [_nested(MAX_DEPTH)], {}, ET, ser)
    with pytest.raises(OverBudget, match="nested deeper"):
        de(deep)
    if name == "json":  # deeper than Python recurses: still OverBudget, never RecursionError
        with pytest.raises(OverBudget):
            de(b'{"f": "f", "a": ' + b"[" * 200_000 + b"]" * 200_000 + b"}")


def test_bytes_that_look_like_containers_do_not_count_as_containers() -> None:
    blob = bytes(range(256)) * 8_000  # 2 MB, 14% of its bytes are msgpack container headers
    words = ["привет мир"] * 1_000  # UTF-8 continuation bytes are fixmap/fixarray bytes too
    for args in ([blob], [words], [blob[:60_000]]):
        assert msgpack_loads(job_payload("f", args, {}, ET, msgpack_dumps))["a"] == args


@pytest.mark.parametrize(
    "raw",
    [
        '{"a": NaN}',
        '{"a": -Infinity}',
        '{"a": 1e400}',
        '{"a": ' + "9" * 400 + "}",
        "[" * 100_000 + "]" * 100_000,
        '{"a": "' + "x" * (3 * 1024 * 1024) + '"}',
    ],
    ids=["nan", "infinity", "overflow", "400-digits", "deep", "3MB"],
)
def test_a_json_record_that_a_reader_cannot_use_is_a_value_error(raw: str) -> None:
    with pytest.raises(ValueError):
        json_record(raw)


def test_a_json_record_within_its_budget_reads_as_json() -> None:
    assert json_record('{"at_ms": 1700000000000, "x": [1.5, -2, "t"], "n": null}') == {
        "at_ms": 1700000000000,
        "x": [1.5, -2, "t"],
        "n": None,
    }
