"""The one subscription loop's health: a quiet subscription is pinged (and a ping answered keeps
it), one whose ping goes unanswered is taken for dead and subscribed again, and the listener
hears each subscribe and each break (it polls often only meanwhile). Real server: the pong and
a paused server are the point."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

from worker.core.clock import SystemClock
from worker.storage import keys as K
from worker.storage import subscriptions
from worker.storage.store import Store

KEYS = K.Keys("t:")


async def until(pred: Any, within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {pred}"
        await asyncio.sleep(0.01)


def calls(info: dict[str, Any], command: str) -> int:
    return int(info.get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_a_quiet_subscription_is_pinged_and_kept_while_it_answers(redis_url: str) -> None:
    r = aioredis.Redis.from_url(redis_url)
    store, stop, states = Store(r, KEYS), asyncio.Event(), []
    heard: list[bytes] = []
    task = asyncio.create_task(
        store.listen(
            [KEYS.wake], lambda _c, d: heard.append(d), stop, clock=SystemClock(),
            poll_s=0.05, retry_s=0.05, ping_s=0.2, healthy=states.append,
        )
    )  # fmt: skip
    try:
        await until(lambda: states == [True])
        before = await r.info("commandstats")
        await asyncio.sleep(1.1)
        after = await r.info("commandstats")
        pings = calls(after, "ping") - calls(before, "ping")
        assert 3 <= pings <= 6, pings  # one per 0.2 s of quiet (plus the pong's wait)
        assert calls(after, "subscribe") == calls(before, "subscribe")  # never reconnected
        assert states == [True]
        await r.publish(KEYS.wake, b"7")
        await until(lambda: heard)
        assert heard == [b"7"]
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        await r.aclose()


async def test_an_unanswered_ping_breaks_the_subscription_and_it_comes_back(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(subscriptions, "PONG_WAIT_S", 0.3)
    r, admin = aioredis.Redis.from_url(redis_url), aioredis.Redis.from_url(redis_url)
    store, stop, states = Store(r, KEYS), asyncio.Event(), []
    task = asyncio.create_task(
        store.listen(
            [KEYS.wake], lambda _c, _d: None, stop, clock=SystemClock(),
            poll_s=0.05, retry_s=0.05, ping_s=0.2, healthy=states.append,
        )
    )  # fmt: skip
    try:
        await until(lambda: states == [True])
        await admin.execute_command("CLIENT", "PAUSE", 1500, "ALL")  # a server that hangs
        await asyncio.sleep(1.0)
        assert states[:2] == [True, False]  # the ping went unanswered: taken for dead
        await asyncio.sleep(1.5)  # the pause ends
        await until(lambda: states[-1] is True)
    finally:
        await admin.execute_command("CLIENT", "UNPAUSE")
        stop.set()
        await asyncio.wait_for(task, 5)
        await r.aclose()
        await admin.aclose()
