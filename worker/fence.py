"""Calling fenced scripts: map the script's refusal to :class:`LeadershipLost`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError

from worker.errors import LeadershipLost
from worker.keys import FENCE_ERROR


async def run_fenced(
    script: AsyncScript, lock_value: str | None, keys: Sequence[Any], args: Sequence[Any]
) -> Any:
    """Run a fenced script whose ``KEYS[1]`` is the leader lock and ``ARGV[1]`` the lock value.

    Raises :class:`LeadershipLost` when this process does not hold the lock (or no longer
    does); every other error propagates unchanged.
    """
    if lock_value is None:
        raise LeadershipLost("not leading")
    try:
        return await script(keys=list(keys), args=[lock_value, *args])
    except ResponseError as exc:
        if str(exc).startswith(FENCE_ERROR):
            raise LeadershipLost(str(exc)) from None
        raise
