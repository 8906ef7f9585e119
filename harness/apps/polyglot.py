"""A test app for jobs other languages enqueue (tests/house/test_node_producer.py): ``note(label)``
counts its runs per label in ``<prefix>ledger:notes`` and records the Redis server's time (ms)
of each label's first start in ``<prefix>ledger:started``."""

from __future__ import annotations

from worker import App, JobContext

app = App("polyglot")


@app.task
async def note(ctx: JobContext, label: str, *, source: str = "") -> str:
    prefix = ctx.context.settings.key_prefix
    seconds, micros = await ctx.redis.time()
    await ctx.redis.hsetnx(f"{prefix}ledger:started", label, seconds * 1000 + micros // 1000)
    await ctx.redis.hincrby(f"{prefix}ledger:notes", label, 1)
    return f"{label} from {source}"
