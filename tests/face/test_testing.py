"""worker.testing: an app's tasks and ticks run inline with a real JobContext."""

from __future__ import annotations

import datetime as dt
from typing import Any

from worker import App, Context, JobContext
from worker.testing import Harness


def make_app() -> App:
    app = App("t")

    @app.on_startup
    async def setup(ctx: Context) -> None:
        ctx.state["sent"] = []

    @app.task
    async def send_receipt(ctx: JobContext, order_id: int) -> str:
        if await ctx.once(f"receipt:{order_id}", ttl=60):
            ctx.state["sent"].append(order_id)
        return f"receipt {order_id}"

    @app.periodic(cron="0 0 * * *")
    async def daily_reset(ctx: JobContext) -> None:
        assert ctx.tick is not None
        for n in range(3):
            await ctx.enqueue("send_receipt", n, unique_key=f"reset:{ctx.tick:%Y-%m-%d}:{n}")

    return app


async def test_run_a_task_inline_with_its_helpers() -> None:
    async with Harness(make_app()) as h:
        assert await h.run("send_receipt", 42) == "receipt 42"
        await h.run("send_receipt", 42)  # ctx.once dedups the side effect
        assert h.state["sent"] == [42]


async def test_tick_a_periodic_job_and_run_what_it_enqueued() -> None:
    async with Harness(make_app()) as h:
        at = dt.datetime(2026, 11, 29, tzinfo=dt.UTC)
        await h.tick("daily_reset", at=at)
        await h.tick("daily_reset", at=at)  # the same tick: unique keys, nothing new
        assert await h.run_enqueued() == 3
        assert h.state["sent"] == [0, 1, 2]
        assert await h.run_enqueued() == 0


async def test_the_fake_clock_drives_the_schedule(r: Any) -> None:
    async with Harness(make_app(), redis=r) as h:  # also on a real server
        h.clock.advance(86_400)
        await h.tick("daily_reset")  # the schedule's latest instant
        assert await h.run_enqueued() == 3


async def test_a_job_past_its_deadline_does_not_run_inline() -> None:
    async with Harness(make_app()) as h:
        await h.client.enqueue("send_receipt", 1, expires_in=10)
        await h.client.enqueue("send_receipt", 2, expires_in=60)
        h.clock.advance(30)  # the fake clock: the first deadline passes
        assert await h.run_enqueued() == 1
        assert h.state["sent"] == [2]
