"""Records read in part (:mod:`worker.core.jobhead`): the fields of a cut msgpack, JSON or pickle
record found without decoding it whole, hostile heads bounded and never raised past the
listing."""

from __future__ import annotations

import pickle

import msgpack
import pytest

from harness.arqfmt import serialize_result
from worker.core.jobhead import HEAD_BYTES, TAIL_BYTES
from worker.core.serializer import (
    Deserialize,
    Serialize,
    job_payload,
    json_dumps,
    json_loads,
    msgpack_dumps,
    msgpack_loads,
    pickle_dumps,
    pickle_loads,
)
from worker.ops.jobrecords import args_text, decode_job, decode_result

BIG = 1 << 20
SERIALIZERS: dict[str, tuple[Serialize, Deserialize]] = {
    "msgpack": (msgpack_dumps, msgpack_loads),
    "json": (json_dumps, json_loads),
    "pickle": (pickle_dumps, pickle_loads),
}


@pytest.mark.parametrize("name", ["msgpack", "json", "pickle"])
def test_a_cut_record_shows_its_task_first_args_and_size(name: str) -> None:
    dumps, loads = SERIALIZERS[name]
    raw = job_payload("resize", [7, "x" * BIG, 9], {"who": "ada"}, 1_764_600_000_000, dumps, 3)
    d = decode_job(raw[:HEAD_BYTES], loads, size=len(raw), tail=raw[-TAIL_BYTES:])
    assert (d.task, d.tries, d.error, d.cut_bytes) == ("resize", 3, None, len(raw))
    text = args_text(d, 120)
    assert text.endswith(f"… ({len(raw)} bytes)") and len(text) <= 120, text
    if name != "pickle":  # a cut pickle is never unpickled: its opcodes give task and try
        assert d.args[0] == 7 and text.startswith("7, 'xxx"), text
        assert d.enqueued_ms == 1_764_600_000_000  # from the tail


@pytest.mark.parametrize("name", ["msgpack", "json"])
def test_a_cut_result_keeps_its_times_queue_and_outcome(name: str) -> None:
    dumps, loads = SERIALIZERS[name]
    raw = serialize_result(
        "resize", (b"\0" * BIG if name == "msgpack" else "x" * BIG,), {}, 1, 100, True, "ok",
        200, 300, "ref", "p:queue", "id-1", serializer=dumps,
    )  # fmt: skip
    assert raw is not None
    r = decode_result(raw[:HEAD_BYTES], loads, "p:", size=len(raw), tail=raw[-TAIL_BYTES:])
    assert (r["task"], r["started_ms"], r["finished_ms"], r["queue"]) == (
        "resize",
        200,
        300,
        "default",
    )
    assert r["success"] is True and r["enqueued_ms"] == 100


@pytest.mark.parametrize(
    "head",
    [
        msgpack.packb({"f": "x", "a": [[[[1]]]]})[:8] + b"\x91" * 4000,  # nested past the head
        b"\x81\xa1a\xdd\xff\xff\xff\xff" + b"\xc0" * 4000,  # 4 billion args declared
        b"\xdf\xff\xff\xff\xff" + b"\xa1f" * 2000,  # 4 billion fields declared
        b"{" + b'"a":[' + b"[" * 4000,  # JSON nested past the recursion limit
        b"\xff\xfe garbage",
        pickle.dumps({"f": "x"})[:5] + b"\x00" * 4000,
    ],
)
def test_a_hostile_head_is_bounded_and_never_raised(head: bytes) -> None:
    for _, loads in SERIALIZERS.values():
        d = decode_job(head[:HEAD_BYTES], loads, size=10 * BIG, tail=head[-TAIL_BYTES:])
        assert d.error is not None or d.cut_bytes == 10 * BIG
        assert len(args_text(d, 120)) <= 120
