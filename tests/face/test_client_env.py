"""The web-app path: ``Client.from_env`` / ``Client.from_settings`` read the workers' own
``WORKER_*`` settings (URL or URL file, key prefix, serializer), so an API process and the
workers cannot disagree; ``arq_options`` does the same for a plain arq pool."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from harness.arqfmt import JobStatus, require_arq
from worker.app import App
from worker.client import Client, arq_options
from worker.context import JobContext
from worker.core.errors import ConfigError
from worker.settings import load_settings
from worker.storage import keys as K

app = App("shop")
app.poller("cards", task="poll_card", shards=4)


@app.task
async def send_receipt(ctx: JobContext, order_id: int) -> None: ...


@app.task
async def poll_card(ctx: JobContext, card_id: str) -> None: ...


@app.task
async def activate(ctx: JobContext, package_id: int) -> None: ...


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No WORKER_* variable from the outside world."""
    for name in list(os.environ):
        if name.startswith("WORKER_"):
            monkeypatch.delenv(name)
    return monkeypatch


async def test_from_env_without_a_url_is_one_line(env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError) as err:
        await Client.from_env()
    assert str(err.value) == (
        "WORKER_REDIS_URL: not set (nor WORKER_REDIS_URL_FILE); the client needs the Redis URL "
        "the workers use"
    )
    env.setenv("WORKER_KEY_PREFIX", "bad prefix")
    with pytest.raises(ConfigError, match=r"^WORKER_KEY_PREFIX: invalid value 'bad prefix'"):
        await Client.from_env()


async def test_from_env_unreachable_redis_is_one_line(env: pytest.MonkeyPatch) -> None:
    env.setenv("WORKER_REDIS_URL", "redis://127.0.0.1:1/0")
    env.setenv("WORKER_REDIS_CONNECT_TIMEOUT_S", "0.2")
    with pytest.raises(ConfigError, match=r"^WORKER_REDIS_URL: cannot reach Redis at"):
        await Client.from_env()


async def test_from_env_uses_the_workers_settings(
    env: pytest.MonkeyPatch, redis_url: str, rsync: Any, tmp_path: Path
) -> None:
    url_file = tmp_path / "url"
    url_file.write_text(redis_url + "\n")  # a mounted Secret
    env.setenv("WORKER_REDIS_URL_FILE", str(url_file))
    env.setenv("WORKER_KEY_PREFIX", "shop:")
    env.setenv("WORKER_SERIALIZER", "json")
    client = await Client.from_env(app=app)
    try:
        assert client.keys == K.Keys("shop:") and client.keys.queue == "shop:queue"
        job_id = await client.enqueue("send_receipt", 42)
        assert job_id is not None
        assert rsync.zscore("shop:queue", job_id) is not None
        record = json.loads(rsync.get(K.ARQ_JOB + job_id))  # WORKER_SERIALIZER=json
        assert (record["f"], record["a"]) == ("send_receipt", [42])
        assert await client.job(job_id).status() is JobStatus.queued
        assert await client.job("nope").status() is JobStatus.not_found

        key = "activate:p-1"
        assert await client.enqueue("activate", "p-1", unique_key=key) == "shop:unique:" + key
        assert await client.enqueue("activate", "p-1", unique_key=key) is None
        assert client.unique_job_id(key) == "shop:unique:" + key

        await client.poller("cards").schedule("card-9", delay=0)
        shard = app.pollers["cards"].shard_of("card-9")
        assert rsync.zscore(K.Keys("shop:").poll_shard("cards", shard), "card-9") is not None
    finally:
        await client.close()

    # overrides win over the environment, as flags do for the workers
    other = await Client.from_env(key_prefix="other:")
    try:
        assert other.keys.queue == "other:queue"
    finally:
        await other.close()


async def test_from_settings_and_plain_arq_agree(env: pytest.MonkeyPatch, redis_url: str) -> None:
    require_arq()
    from arq import create_pool
    from arq.connections import RedisSettings

    settings = load_settings(redis_url=redis_url)
    env.setenv("WORKER_KEY_PREFIX", "billing:")
    plain_settings = load_settings(redis_url=redis_url)
    client = await Client.from_settings(settings)
    pool = await create_pool(RedisSettings.from_dsn(redis_url), **arq_options(plain_settings))
    try:
        assert client.keys.queue == "worker:queue"
        job = await pool.enqueue_job("send_receipt", 7, _job_id="plain-1")
        assert job is not None and await job.status() == JobStatus.queued  # arq's enum
        assert await pool.zscore("billing:queue", "plain-1") is not None  # from the prefix
    finally:
        await pool.aclose()
        await client.close()
