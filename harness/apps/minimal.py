"""The smallest app: one no-op task (an "old version" that lacks the ledger app's tasks)."""

from __future__ import annotations

from worker import App, JobContext

app = App("minimal")


@app.task
async def noop(ctx: JobContext) -> None:
    return None
