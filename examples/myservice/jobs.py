"""The docs' "Writing an app" example, complete: every duty kind on one app."""

import asyncio
from collections.abc import AsyncIterator

from myservice.backend import (
    Mailer,
    activate_package,
    blocking_idle,
    create_db_pool,
    due_packages,
    expire_orders,
    fetch_cards_after,
    gateway_query,
    list_mailboxes,
    reset_daily_usage,
)
from worker import App, Context, JobContext

app = App("myservice")


@app.on_startup
async def connect(ctx: Context) -> None:
    ctx.state["db"] = await create_db_pool()  # shared by every job in this process
    ctx.state["mailer"] = Mailer()


@app.task(timeout_s=30)
async def send_receipt(ctx: JobContext, order_id: int) -> None:
    if await ctx.once(f"receipt:{order_id}", ttl=7 * 86400):  # side effect at most once
        await ctx.state["mailer"].send(order_id)


@app.periodic(cron="* * * * *", tz="Asia/Shanghai", max_staleness=600)  # once per tick
async def order_expire(ctx: JobContext) -> None:  # doctor fails if no success for 10 min
    await expire_orders(ctx.state["db"], before=ctx.tick)


@app.periodic(every=10, catch_up="latest")  # after a failover: only the newest missed tick
async def package_activation_check(ctx: JobContext) -> None:
    for package_id in await due_packages(ctx.state["db"]):
        await ctx.enqueue(
            "activate", package_id, unique_key=f"activate:{package_id}"
        )  # one job per package


@app.task
async def activate(ctx: JobContext, package_id: int) -> None:
    await activate_package(ctx.state["db"], package_id)


@app.periodic(cron="0 0 * * *", tz="Asia/Shanghai")
async def daily_reset(ctx: JobContext) -> None:
    async with ctx.mutex(f"daily-reset:{ctx.tick:%Y-%m-%d}", ttl=600) as mine:
        if mine:
            await reset_daily_usage(ctx.state["db"])


cards = app.poller("cards", task="poll_card", shards=8)  # due items -> one job per item


@app.task
async def poll_card(ctx: JobContext, card_id: str) -> None:
    await gateway_query(card_id)  # raises: the card is due again in failure_delay_s (60 s)
    await ctx.poller("cards").schedule(card_id, delay=30)  # poll again in 30 s


@app.initializer(version="2026-11-01", poller="cards")  # once per cluster per version, resumable
async def load_cards(
    ctx: Context, cursor: str | None
) -> AsyncIterator[tuple[str, dict[str, float]]]:
    async for rows in fetch_cards_after(ctx.state["db"], cursor, batch=1000):
        yield str(rows[-1].id), {row.iccid: 0 for row in rows}  # (checkpoint, {item: due})
        # due: 0 = now; epoch seconds or an aware datetime = then; timedelta(seconds=30) = in 30 s


@app.service(cardinality="singleton", sla_s=300)  # one listener cluster-wide, on the leader
async def mailbox(ctx: Context, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await asyncio.to_thread(blocking_idle, 120)  # blocking calls never freeze the loop
        ctx.alive()  # progress: /healthz fails if this is not called within sla_s


@app.service(cardinality="per_key", keys=list_mailboxes, sla_s=300)  # a loop per mailbox,
async def mailbox_idle(ctx: Context, stop: asyncio.Event, key: str) -> AsyncIterator[None]:
    while not stop.is_set():  # keys spread over all processes, one loop per key
        await asyncio.to_thread(blocking_idle, 120, mailbox=key)
        yield  # an async generator service reports progress by yielding


@app.health_check(timeout_s=5, interval_s=30)  # every process, in the background
async def database(ctx: Context) -> None:
    await ctx.state["db"].execute("SELECT 1")  # raising makes /readyz 503 (not /healthz)


@app.on_broadcast("pricing")  # in every process, whatever its role; each message once
async def drop_prices(ctx: Context, data: dict[str, float]) -> None:
    ctx.state.pop("prices", None)  # sent with `await ctx.broadcast("pricing", {...})`
