"""The key prefix's Redis Cluster hash tag is parsed in one place, the way Redis Cluster does;
job ids and unique keys holding control or bidirectional characters are refused at enqueue."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis

from worker import SyncClient
from worker.bulk import JobSpec
from worker.client import Client
from worker.core.errors import InvalidId
from worker.core.ids import check_id, hash_tag
from worker.storage.keys import Keys


@pytest.mark.parametrize(
    ("prefix", "tag"),
    [("{shop}:", "shop"), ("{a}{b}:", "a"), ("shop:", None), ("{}:", None), ("{shop:", None)],
)
def test_hash_tag(prefix: str, tag: str | None) -> None:
    assert hash_tag(prefix) == tag
    assert Keys(prefix=prefix).slot_tag == ("" if tag is None else f"{{{tag}}}")


#: Ids an operator would be shown wrong: a line break (a spoofed confirmation dialog), an
#: escape sequence, a right-to-left override, an isolate, a zero-width character, a line
#: separator.
SPOOFED = [
    "dup\n\nThis only cancels the duplicate test job",
    "a\x1b]0;t\x07",
    "job-\u202egnp.exe",
    "x\u2066y\u2069",
    "zero\u200bwidth",
    "line\u2028sep",
    "cr\rlf",
]


@pytest.mark.parametrize("text", SPOOFED)
def test_control_and_bidi_characters_are_refused_in_ids(text: str) -> None:
    with pytest.raises(InvalidId, match="control, format or separator character"):
        check_id(text, "job_id")


@pytest.mark.parametrize("text", ["shop:abc", "{shop}:x y", "ünïcödé ✓ 日本", "a\u00a0", "e\u0301"])
def test_printable_ids_pass(text: str) -> None:
    check_id(text, "unique_key")


async def test_every_enqueue_door_refuses_them_and_writes_nothing(redis_url: str) -> None:
    """Client.enqueue (what ctx.enqueue calls) and enqueue_many, on the real server: one
    InvalidId naming the argument; nothing reaches Redis."""
    prefix = f"ids{uuid.uuid4().hex[:6]}:"
    client = await Client.connect(redis_url, key_prefix=prefix)
    r = aioredis.Redis.from_url(redis_url)
    try:
        for text in SPOOFED:
            with pytest.raises(InvalidId, match=r"^job_id holds"):
                await client.enqueue("record", 1, job_id=f"{prefix}{text}")
            with pytest.raises(InvalidId, match=r"^unique_key holds"):
                await client.enqueue("record", 1, unique_key=text)
            with pytest.raises(InvalidId):
                await client.enqueue_many(
                    [JobSpec("record", (1,)), JobSpec("record", (2,), unique_key=text)]
                )
        assert await client.enqueue("record", 1, unique_key="fine key ✓") is not None
        assert await r.zcard(f"{prefix}queue") == 1  # only the fine one
        assert [k async for k in r.scan_iter(match=f"arq:job:{prefix}*")] == [
            f"arq:job:{prefix}unique:fine key ✓".encode()
        ]
    finally:
        await r.aclose()
        await client.close()


def test_the_sync_client_refuses_them_too(redis_url: str) -> None:
    with SyncClient.connect(redis_url, key_prefix="ids-sync:") as sync:
        with pytest.raises(InvalidId, match=r"^unique_key holds"):
            sync.enqueue("record", 1, unique_key=SPOOFED[0])
        with pytest.raises(InvalidId, match=r"^job_id holds"):
            sync.enqueue("record", 1, job_id="ids-sync:\u202e")
