"""Job timeouts with one timer per 10 ms of deadlines, not one per run.

``asyncio.timeout`` makes a timer per run and cancels it when the run ends (~5 µs of a no-op
job's ~50). The runs of one claimed batch start within microseconds of each other and share a
timeout: their deadlines fall in one :data:`GRID_S` slot, so one timer serves the batch. A run
ends by taking itself out of its slot; the slot's timer stays until its time (cancelling it
when the slot empties would make a timer per run again, each run of a batch of no-op jobs
ending before the next one starts) and then cancels the runs still in it: at most one pending
timer per 10 ms of starts within the longest timeout (30,000 for 300 s). A run is cut at most
:data:`GRID_S` after its timeout; as with ``asyncio.timeout``, the cancellation becomes a
``TimeoutError`` in the run unless another cancellation (an abort, a lost claim, the shutdown)
is pending too.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable
from typing import Any

from worker.consumer.claims import Run

#: Deadlines within one slot of this many seconds share a timer (a run is cut at most this late).
GRID_S = 0.01

_Slot = dict[str, tuple[Run, "asyncio.Task[Any] | None"]]


class Deadlines:
    """The runs inside their function, by the :data:`GRID_S` slot of their deadline."""

    def __init__(self) -> None:
        self._slots: dict[int, _Slot] = {}

    def __len__(self) -> int:
        """Slots whose timer is still pending (empty ones included)."""
        return len(self._slots)

    async def call(self, run: Run, aw: Awaitable[Any], timeout_s: float) -> Any:
        """Await ``aw`` (the job's function) as ``run``: :attr:`Run.calling` meanwhile, cut at
        ``timeout_s`` (then :attr:`Run.expired`, and ``TimeoutError`` raised from the
        cancellation when nothing else cancelled the run)."""
        slot = self._arm(run, timeout_s)
        run.calling = True
        cut = False
        try:
            return await aw
        except asyncio.CancelledError:
            cut = True
            if run.expired and _withdraw() == 0:
                raise TimeoutError from None  # only its timeout cancelled it
            raise
        finally:
            if run.expired and not cut:  # it caught the cancellation and returned: withdrawn
                _withdraw()
            run.calling = False
            runs = self._slots.get(slot)
            if runs is not None:
                runs.pop(run.job_id, None)

    def _arm(self, run: Run, timeout_s: float) -> int:
        task = run.task or asyncio.current_task()  # the fetcher's task
        # the task's loop: ``get_running_loop`` makes a getpid() system call each time
        loop = task.get_loop() if task is not None else asyncio.get_running_loop()
        slot = math.ceil((loop.time() + timeout_s) / GRID_S)
        runs = self._slots.get(slot)
        if runs is None:
            runs = self._slots[slot] = {}
            loop.call_at(slot * GRID_S, self._expire, slot)
        runs[run.job_id] = (run, task)
        return slot

    def _expire(self, slot: int) -> None:
        """The slot's time came: cancel the runs still in their function."""
        for run, task in self._slots.pop(slot, {}).values():
            if run.calling and task is not None and not task.done():
                run.expired = True
                task.cancel()


def _withdraw() -> int:
    """Withdraw the timeout's cancellation of the current task; how many others remain."""
    task = asyncio.current_task()
    return task.uncancel() if task is not None else 0
