"""worker.storage.replies against what redis-py really returns: each helper gives one shape
whatever the protocol (RESP2, RESP3, redis-py 8's RESP3 without legacy replies) and whether
the client decodes, on the real server."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis import asyncio as aioredis

from worker.storage import keys as K
from worker.storage.replies import (
    as_bytes,
    fields,
    members,
    scored,
    side_connection,
    stream_reads,
)
from worker.storage.store import Store

PROTOCOLS: list[dict[str, Any]] = [{}, {"protocol": 3}]
if "legacy_responses" in inspect.signature(aioredis.Redis.__init__).parameters:
    PROTOCOLS.append({"protocol": 3, "legacy_responses": False})  # redis-py 8+


@pytest.fixture(params=PROTOCOLS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
async def client(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[Any]:
    c = aioredis.Redis.from_url(redis_url, **request.param)
    yield c
    await c.aclose()


async def test_ranges_with_and_without_scores(client: Any) -> None:
    await client.zadd("z", {"a": 1, "b": 2.5})
    assert scored(await client.zrangebyscore("z", "-inf", "+inf", withscores=True)) == [
        (b"a", 1.0),
        (b"b", 2.5),
    ]
    assert scored(await client.zrevrange("z", 0, -1, withscores=True)) == [
        (b"b", 2.5),
        (b"a", 1.0),
    ]
    assert members(await client.zrevrange("z", 0, -1)) == [b"b", b"a"]


async def test_hash_scan_step(client: Any) -> None:
    await client.hset("h", mapping={"k": "v", "k2": "v2"})
    cursor, raw = await client.hscan("h", 0, count=100)
    assert cursor == 0
    assert dict(fields(raw)) == {b"k": b"v", b"k2": b"v2"}


async def test_stream_read_gives_every_entry_of_every_stream(client: Any) -> None:
    ids = [await client.xadd("s1", {"n": str(i)}) for i in range(3)]
    other = await client.xadd("s2", {"n": "x"})
    got = stream_reads(await client.xread({"s1": "0-0", "s2": "0-0"}, count=10))
    assert sorted(got) == [
        (b"s1", [(i, {b"n": str(n).encode()}) for n, i in enumerate(ids)]),
        (b"s2", [(other, {b"n": b"x"})]),
    ]
    assert stream_reads(await client.xread({"s1": ids[-1]}, count=10, block=1)) == []


async def test_one_entry_is_not_mistaken_for_a_wrapped_list(client: Any) -> None:
    only = await client.xadd("s", {"n": "1"})
    assert stream_reads(await client.xread({"s": "0-0"}, count=10)) == [
        (b"s", [(only, {b"n": b"1"})])
    ]


async def test_broadcast_read_on_each_protocol(client: Any) -> None:
    store = Store(client, K.Keys("t:"))
    for i in range(3):
        await store.broadcast("p", b"m%d" % i, origin="o", chain=(), history=10)
    got = await store.broadcast_read({store.keys.broadcast("p"): "0-0"}, count=10, block_ms=1)
    assert [(e.seq, e.payload) for e in got] == [(1, b"m0"), (2, b"m1"), (3, b"m2")]


async def test_values_are_bytes_whether_or_not_the_client_decodes(redis_url: str) -> None:
    plain = aioredis.Redis.from_url(redis_url)
    decoding = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        await plain.set("k", "héllo")
        assert as_bytes(await plain.get("k")) == "héllo".encode()
        assert as_bytes(await decoding.get("k")) == "héllo".encode()
    finally:
        await plain.aclose()
        await decoding.aclose()


async def test_side_connection_without_a_deprecation_warning(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    pool = client.connection_pool
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            conn = await side_connection(pool, "PING")
        try:
            await conn.send_command("PING")
            assert await conn.read_response() in (b"PONG", "PONG", True)
        finally:
            await pool.release(conn)
    finally:
        await client.aclose()


def test_unexpected_shapes_are_refused() -> None:
    with pytest.raises(TypeError):
        scored([b"a"])  # a range read without scores
    with pytest.raises(TypeError):
        members([(b"a", 1.0)])
    with pytest.raises(TypeError):
        fields([b"k"])  # HSCAN NOVALUES
    with pytest.raises(TypeError):
        stream_reads(7)
