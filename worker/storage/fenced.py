"""The leader's writes: each fenced script checks the lease in the same atomic step.

:class:`FencedBase` reads the lock value from a :class:`~worker.core.views.LeaderView` and maps a
refusal to :class:`~worker.core.errors.LeadershipLost` after telling the view (stepping down is
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

from worker.core import malformed as M
from worker.core.errors import LeadershipLost, ShardFenced
from worker.core.ids import LockValue, parse_epoch
from worker.core.views import LeaderView
from worker.storage import keys as K
from worker.storage.base import StoreBase

#: The head of every fenced script: refuse unless KEYS[1] (the lock) holds ARGV[1].
FENCE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('FENCED leader lock is not held by this process')
end
"""


#: The head of every fenced script in a queue shard other than home (``WORKER_QUEUE_SHARDS``),
#: where the lease is out of reach (another hash slot): a fencing token. KEYS[1] is the
#: shard's fence (``<shard prefix>fence``: the highest token a leader wrote there with),
#: ARGV[1] the writer's token (its lease epoch, strictly greater for every new leadership).
#: A token below the fence is refused; a higher one raises it, in the same atomic step. A fence
#: that is not an epoch (not an integer of at most 16 digits: written by someone else) fences
#: nothing and is overwritten (``raw`` keeps what it held).
TOKEN_FENCE = """
local raw = redis.call('GET', KEYS[1])
local fence = 0
if raw and #raw <= 16 and string.match(raw, '^%d+$') then
  fence = tonumber(raw)
end
local token = tonumber(ARGV[1])
if token == nil or token < fence then
  return redis.error_reply('FENCED token ' .. ARGV[1] .. ' is below the shard fence ' .. raw)
end
if token > fence or raw ~= ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1])
end
"""

#: Run by :meth:`FencedBase.raise_fence` (below).
RAISE_FENCE = (
    """
-- Fenced by token. A new leader raises the fence of a queue shard before it acts there: from
-- then on, writes of any older leadership into the shard are refused.
-- KEYS[1] -> the shard's fence
-- ARGV[1] -> the caller's token (its lease epoch)
-- Returns: {the fence now (the caller's token), what the fence held before ("" if nothing)}
"""
    + TOKEN_FENCE
    + """
return {ARGV[1], raw or ''}
"""
)


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
        return await self._eval_fenced(text, [self.keys.leader, *keys], [str(lock), *args])

    async def _run_token(self, text: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run a script that starts with :data:`TOKEN_FENCE` in this store's queue shard, with
        the lease epoch as the token. A refusal raises :class:`ShardFenced` *without* telling
        the :class:`LeaderView`: a fence above the epoch proves a newer leader only if the
        lease at home is gone too (the caller checks, ``OrphanReaper``), else someone wrote
        it."""
        epoch = self.leader.epoch
        if epoch is None:
            raise LeadershipLost("not leading")
        return await self._eval_fenced(text, [self.keys.fence, *keys], [epoch, *args], shard=True)

    async def _eval_fenced(
        self, text: str, keys: Sequence[str], args: Sequence[Any], *, shard: bool = False
    ) -> Any:
        """Run a fenced script (its fence key and the caller's lock or token first): a refusal
        tells the :class:`LeaderView` and raises :class:`LeadershipLost` (a shard's token
        fence: :class:`ShardFenced`, see :meth:`_run_token`); with a WAIT policy the write
        counts only once the replicas confirm it."""
        try:
            result, acked = await self.store._eval(self.store._script(text), keys, args, probe=True)
        except ResponseError as exc:
            if shard and str(exc).startswith(K.FENCE_ERROR):
                raise ShardFenced(str(exc), str(exc).rpartition(" ")[2][:40]) from None
            if str(exc).startswith(K.FENCE_ERROR):
                self.leader.lost(f"fenced write refused: {exc}")
                raise LeadershipLost(str(exc)) from None
            raise
        if not self.store.replicated(acked):
            raise self.store._short("fenced write", acked)
        return result

    async def raise_fence(self) -> int:
        """Raise this queue shard's fence to the lease epoch (see :data:`RAISE_FENCE`): a new
        leader's first act in a shard. :class:`ShardFenced` if the fence is above the epoch
        (a newer leader raised it, or someone else wrote it). A fence that was not an epoch is
        overwritten, logged once and counted (:mod:`worker.core.malformed`)."""
        now, before = await self._run_token(RAISE_FENCE, [], [])
        text = before.decode(errors="replace") if isinstance(before, bytes) else str(before)
        if text and parse_epoch(text) is None:
            M.skip("shard fence", self.keys.fence, text[:64], "not an epoch; overwritten")
        return int(now)

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
