"""worker/core/outage.py: what counts as a Redis outage, and riding one out (the real-process tests
are tests/system/test_refused_writes.py and tests/system/test_poll_failover.py)."""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, ResponseError

from worker.core.clock import SystemClock
from worker.core.errors import NotReplicated
from worker.core.outage import redis_outage, ride_out


def test_outage_kinds_are_named() -> None:
    assert redis_outage(OutOfMemoryError("x")) == "OutOfMemoryError"
    assert redis_outage(NotReplicated("w", 0, 1, 500)) == "NotReplicated"
    assert redis_outage(ResponseError("MISCONF Errors writing to the AOF file")) == "MISCONF"
    assert redis_outage(ResponseError("WRONGTYPE Operation against a key")) is None
    assert redis_outage(ValueError("MISCONF")) is None
    assert redis_outage(TimeoutError()) is None  # not Redis's: the caller's own wait


async def test_a_call_is_sent_again_until_redis_takes_it() -> None:
    errors: list[Exception] = [
        OutOfMemoryError("x"),
        ResponseError("MISCONF y"),
        RedisConnectionError(),
    ]
    calls = 0

    async def call() -> str:
        nonlocal calls
        calls += 1
        if errors:
            raise errors.pop(0)
        return "ok"

    assert await ride_out(call, SystemClock(), "test", bound_s=5.0) == "ok"
    assert calls == 4


async def test_another_error_is_raised_at_once_and_an_outage_after_the_bound() -> None:
    calls = 0

    async def bug() -> None:
        nonlocal calls
        calls += 1
        raise ResponseError("ERR value is not an integer or out of range")

    with pytest.raises(ResponseError, match="not an integer"):
        await ride_out(bug, SystemClock(), "test", bound_s=5.0)
    assert calls == 1

    async def down() -> None:
        raise RedisConnectionError("gone")

    clock = SystemClock()
    started = clock.monotonic()
    with pytest.raises(RedisConnectionError):
        await ride_out(down, clock, "test", bound_s=0.3)
    assert 0.1 < clock.monotonic() - started < 2.0
