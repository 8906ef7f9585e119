"""RedisClock: the Redis server's clock read on a host whose own wall clock is wrong."""

from __future__ import annotations

import json
from typing import Any

import pytest

from worker.client import Client
from worker.core.clock import FakeClock, RedisClock, SystemClock, host_clock, ms
from worker.core.serializer import get_serializer
from worker.duties.registry import Heartbeat
from worker.storage import keys as K
from worker.storage.store import Store

KEYS = K.Keys("t:")
SERVER_S = 1_800_000_000.0  # the server's clock; the fake host's wall clock is 100 M s off


def test_it_follows_the_server_by_the_host_monotonic_clock_never_early() -> None:
    host = FakeClock()
    clock = RedisClock(host)
    assert clock.time() == host.time()  # not synced yet: the host's clock
    sent = host.monotonic()
    host.advance(0.010)  # the server reads TIME 10 ms after the request left
    server_ms = SERVER_S * 1000
    host.advance(0.010)
    clock.observe(server_ms, sent, host.monotonic())
    true_now = SERVER_S + 0.010  # the server's clock when the reply came back
    assert true_now - 0.021 <= clock.time() <= true_now  # late by at most the round trip
    assert ms(clock.time()) <= ms(true_now)
    host.advance(5.0)
    host._wall += 20.0  # the host's wall clock jumps: nothing moves
    assert true_now + 5 - 0.021 <= clock.time() <= true_now + 5
    assert clock.rtt_s == pytest.approx(0.02) and clock.synced


def test_a_slow_reply_is_ignored_while_a_fast_sample_is_fresh() -> None:
    host = FakeClock()
    clock = RedisClock(host)
    clock.observe(SERVER_S * 1000, host.monotonic(), host.monotonic() + 0.001)
    kept = clock.time()
    sent = host.monotonic()
    host.advance(1.0)  # a 1 s round trip whose TIME was read right after the request
    clock.observe((SERVER_S + 0.001) * 1000, sent, host.monotonic())
    assert clock.time() - kept == pytest.approx(1.0)  # the 1 ms sample still rules
    host.advance(RedisClock.KEEP_S)
    sent = host.monotonic()
    host.advance(1.0)
    clock.observe((SERVER_S + 100) * 1000, sent, host.monotonic())  # old enough: taken
    assert clock.time() == pytest.approx(SERVER_S + 100 - 0.0005)


async def test_ensure_reads_the_server_only_when_the_sample_is_old() -> None:
    host = FakeClock()
    clock = RedisClock(host)
    reads = []

    async def read() -> float:
        reads.append(host.monotonic())
        return SERVER_S * 1000

    await clock.ensure(read, max_age_s=60)
    await clock.ensure(read, max_age_s=60)
    assert len(reads) == 1
    host.advance(60)
    await clock.ensure(read, max_age_s=60)
    assert len(reads) == 2
    assert host_clock(clock) is host and host_clock(host) is host


async def test_the_heartbeat_keeps_the_server_clock_and_records_host_times(r: Any) -> None:
    class View:
        ready = True
        shutting_down = False

        def describe(self) -> dict[str, Any]:
            return {}

    host = FakeClock()  # 2023 on this host; the server says otherwise
    clock = RedisClock(host)
    hb = Heartbeat(
        Store(r, KEYS), View(), clock, instance_id="i-1", instance_name="n",  # type: ignore[arg-type]
        role="consumer", interval_s=2,
    )  # fmt: skip
    await hb.tick()
    record = json.loads(await r.get(KEYS.instance("i-1")))
    assert record["heartbeat_ms"] == ms(host.time())  # the registry stays on the host's clock
    server_s = await Store(r, KEYS).server_time_ms() / 1000
    assert clock.synced and abs(clock.time() - server_s) < 5


async def test_a_client_dates_a_deferred_job_by_the_server_clock(r: Any) -> None:
    host = FakeClock()  # a host clock years behind: the job is due by the server's clock
    client = Client(r, keys=KEYS, serialize=get_serializer("msgpack")[0], clock=RedisClock(host))
    assert await client.enqueue("task", job_id="j", defer_by=30)
    score = await r.zscore(KEYS.queue, "j")
    server_ms = await Store(r, KEYS).server_time_ms()
    assert 25_000 < score - server_ms <= 30_000
    assert isinstance(Client(r, keys=KEYS, serialize=lambda x: b"").clock, RedisClock)
    assert isinstance(host_clock(SystemClock()), SystemClock)


def test_a_slower_sample_does_not_put_the_clock_back_but_another_server_does() -> None:
    """A due job seen due stays due (the consumer claims with the clock it woke on); a sample
    a few ms behind the last reading is round-trip noise, held until the clock catches up."""
    host = FakeClock()
    clock = RedisClock(host)
    clock.observe(SERVER_S * 1000, host.monotonic(), host.monotonic() + 0.001)
    host.advance(RedisClock.KEEP_S + 1)
    sent = host.monotonic()
    host.advance(0.005)  # a 5 ms round trip: this sample says 4 ms earlier than the last one
    before = clock.time()
    clock.observe((SERVER_S + RedisClock.KEEP_S + 1) * 1000, sent, host.monotonic())
    assert host.monotonic() + clock._offset < before  # type: ignore[operator]  # it would
    assert clock.time() == before  # held, not stepped back
    host.advance(0.010)
    assert clock.time() == pytest.approx(SERVER_S + RedisClock.KEEP_S + 1 + 0.010 - 0.0005)
    # a server whose clock is 5 s behind (a failover): taken
    host.advance(RedisClock.KEEP_S + 1)
    sent = host.monotonic()
    clock.observe((SERVER_S + 2 * RedisClock.KEEP_S - 5) * 1000, sent, host.monotonic())
    assert clock.time() == pytest.approx(SERVER_S + 2 * RedisClock.KEEP_S - 5 - 0.0005)
