"""A test app for hostile entries, with no periodic job (an idle consumer stays idle):

- ``note(key)``: HINCRBY ``<prefix>hostile:notes`` <key> 1.
- ``loud(chars)``: raises an error whose message is ``chars`` characters long, retried once,
  then set aside (dead-lettered) with that error.
"""

from __future__ import annotations

from worker import App, JobContext

app = App("hostile")


@app.task
async def note(ctx: JobContext, key: str) -> None:
    await ctx.redis.hincrby(f"{ctx.context.settings.key_prefix}hostile:notes", key, 1)


@app.task(retry_on=RuntimeError, max_tries=2, retry_delay=0.0)
async def loud(ctx: JobContext, chars: int) -> None:
    raise RuntimeError("x" * chars)
