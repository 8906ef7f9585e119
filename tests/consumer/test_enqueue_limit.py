"""A job larger than ``WORKER_MAX_PAYLOAD_BYTES`` is refused at enqueue with one clear error
(``PayloadTooLarge``), by ``Client.enqueue``, ``enqueue_many``, ``ctx.enqueue`` and
``SyncClient``, instead of being acknowledged and then dead-lettered ``oversized`` at its first
claim; nothing of it is written. A job at the limit goes through and runs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis as redis_sync

from harness import Spawn, client_call, wait_until
from harness.arqfmt import deserialize_result
from worker import PayloadTooLarge, SyncClient
from worker.client import DEFAULT_MAX_PAYLOAD_BYTES, Client
from worker.core.serializer import msgpack_dumps, msgpack_loads
from worker.settings import Settings
from worker.storage import keys as K

KEYS = K.Keys("t:")


async def test_enqueue_and_enqueue_many_refuse_a_payload_over_the_limit(r: Any) -> None:
    client = Client(r, keys=KEYS, serialize=msgpack_dumps, max_payload_bytes=10_000)
    assert await client.enqueue("send", b"x" * 9_000) is not None  # under: acknowledged
    with pytest.raises(PayloadTooLarge, match=r"WORKER_MAX_PAYLOAD_BYTES \(10000\)") as err:
        await client.enqueue("send", b"x" * 10_001)
    assert err.value.size > 10_000 and err.value.function == "send"
    assert "\n" not in str(err.value)
    with pytest.raises(PayloadTooLarge):
        await client.enqueue_many([("send", (1,)), ("send", (b"x" * 20_000,))])
    assert await r.zcard(KEYS.queue) == 1  # only the first enqueue: nothing of the refused


def test_the_default_limit_is_the_workers_and_from_settings_reads_it() -> None:
    assert DEFAULT_MAX_PAYLOAD_BYTES == Settings().max_payload_bytes == 4 * 1024 * 1024


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_real_worker_and_clients_refuse_what_the_consumers_would_not_run(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    limit = 64 * 1024
    spawn("consumer", name="c1", app="harness.apps.aborts:app",
          env={"WORKER_MAX_PAYLOAD_BYTES": str(limit)})  # fmt: skip
    settings = Settings(redis_url=redis_url, key_prefix=prefix, max_payload_bytes=limit)

    async def from_settings(size: int) -> Any:
        client = await Client.from_settings(settings)
        try:
            return await client.enqueue("take", blob=b"x" * size)
        finally:
            await client.close()

    with pytest.raises(PayloadTooLarge):
        asyncio.run(from_settings(limit + 1))
    with SyncClient.connect(redis_url, key_prefix=prefix, max_payload_bytes=limit) as sync:
        with pytest.raises(PayloadTooLarge):
            sync.enqueue("take", blob=b"x" * (limit + 1))
        with pytest.raises(PayloadTooLarge):
            sync.enqueue_many([("take", (), {"blob": b"x" * (limit + 1)})])
    # inside a task: the worker's own client has the worker's limit
    jid = client_call(redis_url, prefix, "enqueue", "enqueues_big", limit + 1)
    raw = wait_until(lambda: rsync.get(K.ARQ_RESULT + jid), 30, what="enqueues_big to end")
    said = deserialize_result(raw, deserializer=msgpack_loads).result
    assert said.startswith("PayloadTooLarge: job 'take' not enqueued"), said
    # under the limit: enqueued and run, not dead-lettered
    ok = asyncio.run(from_settings(limit - 200))
    wait_until(lambda: rsync.get(K.ARQ_RESULT + ok), 30, what="the job under the limit to run")
    assert deserialize_result(rsync.get(K.ARQ_RESULT + ok), deserializer=msgpack_loads).success
    assert rsync.zcard(K.Keys(prefix).queue) == 0
    assert not rsync.keys(f"{prefix}dead*")
