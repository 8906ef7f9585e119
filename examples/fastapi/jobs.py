"""The worker side of the example: the background duties of a small shop.

Workers run it with ``WORKER_APP=jobs:app python -m worker run --role leader|consumer`` (this
folder on ``PYTHONPATH``); the web app (``api.py``) imports the same :class:`~worker.App` so its
client enqueues exactly the tasks and poll items these workers run.

What each duty records goes into Redis under the key prefix (``<prefix>shop:*``), so the API
can show it: receipts sent, activations per package, polls per card, ticks of the periodic job.
"""

from __future__ import annotations

import datetime as dt

from worker import App, Context, JobContext

app = App("shop")  # the app's identity: recorded in every instance's heartbeat record

cards = app.poller("cards", task="poll_card", shards=4)  # due cards -> one poll_card job each

#: A polled card is polled again this many seconds later.
POLL_AGAIN_S = 30.0


def shop_key(prefix: str, name: str) -> str:
    """Where the example keeps its own records (under the workers' key prefix)."""
    return f"{prefix}shop:{name}"


def _key(ctx: JobContext | Context, name: str) -> str:
    context = ctx.context if isinstance(ctx, JobContext) else ctx
    return shop_key(context.settings.key_prefix, name)


@app.task(timeout_s=30)
async def send_receipt(ctx: JobContext, order_id: int) -> dict[str, object]:
    """Mail a receipt; ``ctx.once`` keeps the mail single even if the job runs twice."""
    first = await ctx.once(f"receipt:{order_id}", ttl=7 * 86400)
    if first:
        await ctx.redis.hincrby(_key(ctx, "receipts"), str(order_id), 1)  # "send the mail"
    return {"order_id": order_id, "sent": first}


@app.task
async def activate(ctx: JobContext, package_id: str) -> dict[str, object]:
    """Activate a package; the API enqueues it with ``unique_key=f"activate:{package_id}"``."""
    count = await ctx.redis.hincrby(_key(ctx, "activations"), package_id, 1)
    return {"package_id": package_id, "activation": count}


@app.task
async def poll_card(ctx: JobContext, card_id: str) -> None:
    """Ask the gateway about one card (here: count the poll), then poll it again later."""
    now = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
    async with ctx.redis.pipeline(transaction=True) as pipe:
        pipe.hincrby(_key(ctx, "polls"), card_id, 1)
        pipe.hset(_key(ctx, "last-poll"), card_id, now)
        await pipe.execute()
    await ctx.poller("cards").schedule(card_id, delay=POLL_AGAIN_S)


@app.periodic(every=5, catch_up="latest")  # once per tick cluster-wide, however many replicas
async def expire_orders(ctx: JobContext) -> None:
    """What a lifespan cron did in every ``uvicorn`` worker: now once per tick."""
    assert ctx.tick is not None
    tick_ms = str(int(ctx.tick.timestamp() * 1000))
    await ctx.redis.hincrby(_key(ctx, "expire-ticks"), tick_ms, 1)  # a tick run twice shows 2
