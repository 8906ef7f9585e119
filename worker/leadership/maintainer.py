"""The leader-only work: starts the singleton group on election, stops it on losing the lease.

It listens to a :class:`~worker.leadership.base.Leadership` (river's ``QueueMaintainerLeader``
shape) and owns the unfenced-exit decision: if the singletons do not stop within the grace
after the lease was lost, the process exits (code 70) rather than run unfenced. Leading again
needs a fresh acquisition and therefore a new epoch.
"""

from __future__ import annotations

import os

import structlog

from worker.core.component import Group
from worker.core.ids import LockValue

log = structlog.get_logger("worker.leader")

#: Exit code when singletons refuse to stop after leadership was lost (never run unfenced).
EXIT_UNFENCED = 70


class LeaderWork:
    """Runs ``singletons`` while the leadership it listens to holds the lease; each stop must
    finish within ``stop_grace_s``. Implements
    :class:`~worker.leadership.base.LeadershipListener`."""

    def __init__(self, singletons: Group, *, stop_grace_s: float = 5.0) -> None:
        self.singletons = singletons
        self.stop_grace_s = stop_grace_s

    def elected(self, lock: LockValue) -> None:
        """Start the singletons under ``lock``."""
        log.info(
            "starting singleton components",
            epoch=lock.epoch,
            components=[c.name for c in self.singletons.components],
        )
        self.singletons.start()

    async def stepped_down(self, lock: LockValue, reason: str) -> None:
        """Stop the singletons; exit the process if they do not stop within the grace."""
        if not await self.singletons.stop(self.stop_grace_s):
            log.critical(
                "singletons did not stop after leadership was lost; exiting rather than "
                "run unfenced",
                reason=reason,
                epoch=lock.epoch,
            )
            os._exit(EXIT_UNFENCED)

    async def retire(self) -> None:
        """Shutdown: stop the singletons (they are not started again)."""
        if not await self.singletons.stop(self.stop_grace_s):
            log.error("singleton components ignored cancellation")
