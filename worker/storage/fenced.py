"""The leader's writes: each fenced script checks the lease in the same atomic step.

:class:`FencedBase` reads the lock value from a :class:`~worker.views.LeaderView` and maps a
refusal to :class:`~worker.errors.LeadershipLost` after telling the view (stepping down is
that one call); :class:`FencedPipeline` is a ``MULTI``/``EXEC`` that commits only while the
lease is this process's. The fenced scripts themselves live beside their callers
(``worker.storage.periodic``, ``.poller``, ``.initializer``, ``.registry``) and start with
:data:`FENCE`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError, WatchError

from worker.errors import LeadershipLost
from worker.ids import LockValue
from worker.storage import keys as K
from worker.storage.base import StoreBase
from worker.views import LeaderView

#: The head of every fenced script: refuse unless KEYS[1] (the lock) holds ARGV[1].
FENCE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('FENCED leader lock is not held by this process')
end
"""


class FencedBase:
    """The writes only the leader may make, each checked against the lock in the same script.

    A refusal (the lock is not, or no longer, this process's) tells the :class:`LeaderView`
    (which steps down) and raises :class:`LeadershipLost`.
    """

    def __init__(self, store: StoreBase, leader: LeaderView) -> None:
        self.store = store
        self.leader = leader
        self.keys = store.keys
        self.ids = store.ids

    async def _run(self, text: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run a fenced script; with a WAIT policy it counts as done only once the replicas
        confirm it (:class:`NotReplicated` otherwise: the component restarts and reads the
        state again, and a retry of the same ticks or items cannot duplicate them)."""
        lock = self.leader.lock
        if lock is None:
            raise LeadershipLost("not leading")
        try:
            result, acked = await self.store._eval(
                self.store._script(text), [self.keys.leader, *keys], [str(lock), *args], probe=True
            )
        except ResponseError as exc:
            if str(exc).startswith(K.FENCE_ERROR):
                self.leader.lost(f"fenced write refused: {exc}")
                raise LeadershipLost(str(exc)) from None
            raise
        if not self.store.replicated(acked):
            raise self.store._short("fenced write", acked)
        return result

    def pipeline(self) -> FencedPipeline:
        """A redis-py transaction pipeline whose ``execute()`` commits only while the lease is
        still this process's (see :class:`FencedPipeline`)."""
        return FencedPipeline(self)


class FencedPipeline(Pipeline):
    """Queue commands as on any redis-py pipeline; :meth:`execute` runs them in one
    ``MULTI``/``EXEC`` guarded by ``WATCH`` on the leader lock, after checking that the lock
    still holds this process's value: a leader that lost its lease (paused, partitioned,
    replaced) cannot commit. A refusal tells the lease and raises :class:`LeadershipLost`.
    """

    #: A renew touches the lock and aborts a watched transaction: retry that many times.
    ATTEMPTS = 5

    def __init__(self, fenced: FencedBase) -> None:
        redis = fenced.store.redis
        super().__init__(redis.connection_pool, redis.response_callbacks, True, None)
        self._fenced = fenced

    def _refuse(self, reason: str) -> LeadershipLost:
        self._fenced.leader.lost(f"fenced write refused: {reason}")
        return LeadershipLost(reason)

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        queued, self.command_stack = self.command_stack, []
        lock = self._fenced.leader.lock
        if lock is None or not self._fenced.leader.is_leading():
            await self.reset()  # type: ignore[no-untyped-call]
            raise LeadershipLost("not leading")
        key = self._fenced.keys.leader
        for _ in range(self.ATTEMPTS):
            await self.watch(key)
            current = LockValue.parse(await self.get(key))  # immediate while watching
            if current != lock:
                await self.reset()  # type: ignore[no-untyped-call]
                raise self._refuse("the leader lock is no longer this process's")
            self.multi()  # type: ignore[no-untyped-call]
            self.command_stack = list(queued)
            try:
                out = await super().execute(raise_on_error)
            except WatchError:
                continue  # the lock was touched meanwhile (a renew): check again
            await self._fenced.store.confirm("fenced pipeline")  # WAIT policy (no-op without)
            return out
        raise self._refuse("the leader lock kept changing under a fenced write")
