"""A test app for broadcasts: what each process handled, recorded in Redis ledgers.

- ``pricing`` handler: HINCRBY ``<prefix>ledger:bcast:<instance name>`` <data["id"]> 1, so a
  message a process handled twice shows as 2 and one it missed is absent.
- ``echo`` handler: records like ``pricing`` (field ``echo:<id>``), then tries to broadcast
  ``echo`` again (refused: it would loop) and records the answer in ``ledger:echo-sent``.
- ``announce(id)`` task: broadcasts ``pricing`` from a job (``JobContext.broadcast``).
"""

from __future__ import annotations

from typing import Any

from worker import App, Context, JobContext

app = App("bcast")


def _ledger(ctx: Context) -> str:
    return f"{ctx.settings.key_prefix}ledger:bcast:{ctx.settings.instance_name}"


@app.on_broadcast("pricing")
async def pricing(ctx: Context, data: Any) -> None:
    await ctx.redis.hincrby(_ledger(ctx), str(data["id"]), 1)


@app.on_broadcast("echo")
async def echo(ctx: Context, data: Any) -> None:
    await ctx.redis.hincrby(_ledger(ctx), f"echo:{data['id']}", 1)
    seq = await ctx.broadcast("echo", data)
    await ctx.redis.hincrby(f"{ctx.settings.key_prefix}ledger:echo-sent", str(seq), 1)


@app.task
async def announce(ctx: JobContext, message_id: str) -> None:
    await ctx.broadcast("pricing", {"id": message_id})
