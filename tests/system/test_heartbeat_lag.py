"""A live consumer whose replies come back late is not judged dead.

The heartbeat's score was a time the process dated itself (its copy of the Redis server's
clock: the server's ``TIME`` from the last sample plus the seconds since its reply arrived). A
reply read late (a starved process on a loaded machine, a slow link) makes that copy late by
as much, and any wait between dating the score and the write landing (a starved process, a
connection still being made to a new primary) adds to it: every score looked that much older
than the beat it was. The leader's orphan reaper judges silence on the server's own clock, so
with replies ~1 s late and ``WORKER_ORPHAN_STALE_S`` 2 s it reaped a consumer that was beating
every ~1.5 s (silent 2.1-2.3 s by its scores); a job it was running is handed to another: run
twice. That is how ``tests/system/test_failover.py``'s Cluster run put poll items twice on a machine
at load 15 (a live consumer reaped twice within 1.2 s, "silent for" 2.0-2.4 s).

Here one consumer's connection goes through a proxy that holds every reply ~1 s (requests go
through at once: its writes land on time); a slow job runs on it. Its heartbeat score is the
server's ``TIME`` where the write lands (``registry.TOUCH``, ``registry.HEARTBEAT``): never
older than the beat.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator

import pytest
import redis as redis_sync

from harness import Spawn, client_call, wait_until
from harness.ports import free_port_pair
from harness.realredis import RealRedis

pytestmark = pytest.mark.slow

#: How long the proxy holds each reply to the slow consumer (s).
REPLY_DELAY_S = 1.0


class SlowReplies(threading.Thread):
    """A TCP proxy to ``port`` that forwards requests at once and each reply ``delay_s`` late
    (in order)."""

    def __init__(self, port: int, delay_s: float) -> None:
        super().__init__(daemon=True)
        self.target, self.delay_s = port, delay_s
        self.port = free_port_pair()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()

    def run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.serving = self.loop.create_task(self._serve())
        with contextlib.suppress(asyncio.CancelledError):
            self.loop.run_until_complete(self.serving)
        rest = asyncio.all_tasks(self.loop)
        for task in rest:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
        self.loop.close()

    async def _serve(self) -> None:
        server = await asyncio.start_server(self._client, "127.0.0.1", self.port)
        self.ready.set()
        async with server:
            await server.serve_forever()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target)

        async def forward(src: asyncio.StreamReader, dst: asyncio.StreamWriter, hold: bool) -> None:
            with contextlib.suppress(Exception):
                while chunk := await src.read(65536):
                    if hold:  # each chunk leaves delay_s after it came: a late reader
                        loop = asyncio.get_running_loop()
                        loop.call_at(loop.time() + self.delay_s, self._write, dst, chunk)
                    else:
                        dst.write(chunk)
                        await dst.drain()
            with contextlib.suppress(Exception):
                dst.close()

        try:
            await asyncio.gather(forward(reader, up_w, False), forward(up_r, writer, True))
        finally:  # the server must not keep this client's connections (named after it)
            for w in (up_w, writer):
                w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()

    @staticmethod
    def _write(dst: asyncio.StreamWriter, chunk: bytes) -> None:
        with contextlib.suppress(Exception):
            dst.write(chunk)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.serving.cancel)
        self.join(10)


@pytest.fixture
def slow_replies(real_redis: RealRedis) -> Iterator[SlowReplies]:
    proxy = SlowReplies(real_redis.port, REPLY_DELAY_S)
    proxy.start()
    proxy.ready.wait(10)
    yield proxy
    proxy.stop()


def test_a_consumer_reading_its_replies_late_is_not_reaped_and_its_job_runs_once(
    spawn: Spawn,
    redis_url: str,
    key_prefix: str,
    rsync: redis_sync.Redis,
    slow_replies: SlowReplies,
) -> None:
    # FAST_ENV: heartbeat every 0.5 s, orphan bound 2 s; the slow consumer beats every ~1.5 s
    # (each reply takes 1 s), on time: its scores must say so
    env: dict[str, str | None] = {}
    leader = spawn("leader", name="leader", env=env)
    slow = spawn(
        "consumer",
        name="slow",
        env={**env, "WORKER_REDIS_URL": f"redis://127.0.0.1:{slow_replies.port}/0"},
    )
    wait_until(lambda: rsync.zcard(f"{key_prefix}instances") == 2, timeout=60, what="both up")
    job = client_call(redis_url, key_prefix, "enqueue", "slow_job", 6.0)
    started = f"{key_prefix}ledger:slow-started"
    wait_until(lambda: rsync.hexists(started, job), timeout=30, what="the slow job to start")
    # another consumer, on time, that would take the job over if the slow one were reaped
    spawn("consumer", name="prompt", env=env)
    done = f"{key_prefix}ledger:slow-done"
    wait_until(lambda: rsync.hexists(done, job), timeout=40, what="the slow job to end")
    time.sleep(2.0)  # a takeover's second run would have started by now
    reaped = [e for e in leader.events() if e.get("event") == "stale instance reaped"]
    assert not reaped, reaped
    assert rsync.hget(started, job) == b"1", "the job ran twice: its consumer was reaped alive"
    assert slow.alive()
