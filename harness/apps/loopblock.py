"""The test app of tests/runtime/test_watchdog.py: a tick followed by a task that blocks the
event loop.

Its ledger lives on the server named by ``EDGE_LEDGER_URL``, which the tests never fault; every
key is ``<WORKER_KEY_PREFIX>lb:<name>``.

- ``block_tick`` (every 1 s): HINCRBY ``ticks`` <tick ms> 1. In a process started with
  ``LB_BLOCK_S``, the first tick that finds ``arm`` (GETDEL) also records its tick in
  ``blocked`` and, as it returns, starts a task that calls ``time.sleep(LB_BLOCK_S)``: the
  classic mistake in async code, blocking the loop right after the tick finished and before
  the consumer's next round could record its end.
"""

from __future__ import annotations

import asyncio
import os
import time

from harness.clients import ledger_client
from worker import App, JobContext

app = App("loopblock")

_blockers: set[asyncio.Task[None]] = set()


ledger = ledger_client("EDGE_LEDGER_URL")


async def _block(seconds: float) -> None:
    time.sleep(seconds)  # noqa: ASYNC251 - the fault under test: a call that blocks the loop


@app.periodic(every=1)
async def block_tick(ctx: JobContext) -> None:
    assert ctx.tick is not None
    prefix = f"{ctx.context.settings.key_prefix}lb:"
    tick = str(int(ctx.tick.timestamp() * 1000))
    await ledger().hincrby(prefix + "ticks", tick, 1)
    block_s = os.environ.get("LB_BLOCK_S")
    if block_s and await ledger().getdel(prefix + "arm"):
        await ledger().set(prefix + "blocked", tick)
        task = asyncio.create_task(_block(float(block_s)))  # runs once this tick has returned
        _blockers.add(task)
        task.add_done_callback(_blockers.discard)
