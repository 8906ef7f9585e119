"""The core every part of the store shares: the client, key names, WAIT policy, script calls.

:class:`StoreBase` holds the Redis client, the :class:`~worker.storage.keys.Keys`, the
replication policy and the job ids; :meth:`StoreBase._script` registers a script text once per
store (each script is a constant beside its one caller), :meth:`StoreBase._eval` runs one with
its acknowledgement and :meth:`StoreBase._durable` sends queued commands with ``WAIT``.

Durable writes (``WORKER_REDIS_WAIT_REPLICAS`` > 0, see docs/architecture.md §5.8): the lease's
acquire and renew, fenced singleton writes, claims and finishes, enqueues, poll schedules,
``once``/mutex/per-key leases are each sent with ``WAIT n timeout`` in the same round trip (one
connection, so the ``WAIT`` covers the write). ``WAIT`` cannot run inside a script, and it
confirms only what its own connection wrote: a call that may have written nothing (a refused
re-send, a deduplicated enqueue) adds an ``INCR`` of :attr:`Keys.probe` first, since
replication is one ordered stream and a replica that has the probe has everything before it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Self

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker.core import budget as B
from worker.core import malformed as M
from worker.core.errors import NotReplicated
from worker.core.ids import JobIds
from worker.core.redisurl import Replication
from worker.storage import keys as K
from worker.storage import resharding


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _score(key: str, member: Any, value: Any) -> int | None:
    """A sorted-set score as whole ms; one that is not finite (written by someone else) is
    logged once: ``-inf`` reads as 0 (due since ever), ``+inf`` as ``None`` (never)."""
    number = float(value)
    if math.isfinite(number):
        return int(number)
    M.skip("score", key, _s(member), f"score {number}")
    return 0 if number < 0 else None


def _object(key: str, raw: Any) -> dict[str, Any] | None:
    """A JSON object record, ``None`` when absent; one that is not a JSON object within the
    decode budget (:func:`worker.core.budget.json_record`: written by someone else, nested too deep,
    ``NaN``, a huge number), or whose ``*_ms`` field is not a time in range, is logged once and
    reads as absent."""
    if not raw:
        return None
    try:
        value = B.json_record(raw)
    except ValueError as exc:
        M.skip("JSON object", key, key, f"{type(exc).__name__}: {exc}")
        return None
    if not isinstance(value, dict):
        M.skip("JSON object", key, key, f"a JSON {type(value).__name__}, not an object")
        return None
    bad = next((k for k, v in value.items() if k.endswith("_ms") and not _ms_field(v)), None)
    if bad is not None:
        M.skip("JSON object", key, key, f"field {bad!r} is not a time in ms within range")
        return None
    return value


def _ms_field(value: Any) -> bool:
    """Whether a record's ``*_ms`` field can be read as a time or a span in ms: a number no
    further from 0 than year 9999 (or ``null``, or a structure read elsewhere), never text or
    ``1e300``."""
    if isinstance(value, bool | str):
        return False
    if isinstance(value, int | float):
        return -M.MAX_TIME_MS <= value <= M.MAX_TIME_MS
    return True


def database_of(redis: Redis) -> int:
    """The database number ``redis`` selects (0 for a Redis Cluster, which has no other)."""
    pool = getattr(redis, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    db = kwargs.get("db", 0) if isinstance(kwargs, dict) else 0
    try:
        return int(db or 0)
    except (TypeError, ValueError):
        return 0


class StoreBase:
    """The shared core of :class:`~worker.storage.Store` (see module docstring)."""

    def __init__(self, redis: Redis, keys: K.Keys, replication: Replication | None = None) -> None:
        self.redis = redis
        #: channel names scoped by the connection's database (:func:`keys.channel_scope`)
        self.keys = keys.scoped(K.channel_scope(database_of(redis)))
        #: the WAIT policy of durable writes (no WAIT when it asks for 0 replicas)
        self.replication = replication or Replication()
        self.ids = JobIds(keys.prefix)
        self._scripts: dict[str, AsyncScript] = {}

    def _script(self, text: str) -> AsyncScript:
        """The registered script of ``text`` (registered once per store; the SHA is computed
        then, the script is loaded on the server at its first ``NOSCRIPT``)."""
        script = self._scripts.get(text)
        if script is None:
            script = self._scripts[text] = self.redis.register_script(text)
            resharding.remember_script(script.sha, text)
        return script

    # -- durable writes (WAIT) ----------------------------------------------------------------
    def with_redis(self, redis: Redis) -> Self:
        """The same store (keys, WAIT policy) over another connection pool."""
        return type(self)(redis, self.keys, self.replication)

    def _short(self, what: str, acked: int) -> NotReplicated:
        rep = self.replication
        return NotReplicated(what, acked, rep.replicas, rep.timeout_ms)

    async def _durable(
        self,
        build: Callable[[Pipeline], object],
        *,
        scripts: Sequence[AsyncScript] = (),
        probe: bool = False,
    ) -> tuple[list[Any], int]:
        """Run the commands ``build`` queues in one round trip, followed (when the WAIT policy
        asks for replicas) by ``[INCR probe,] [INFO replication,] WAIT n timeout`` on the same
        connection: ``(their results, replicas that confirmed)``. A failed command raises; a
        script the server does not know (``NOSCRIPT``: a new primary, a restart) is loaded and
        the round trip repeated. Without a policy the acknowledgement is vacuous: ``replicas``
        (0). An adaptive policy (``auto``) needs only the replicas ``INFO`` shows attached, up
        to ``replicas`` (see :mod:`worker.core.durability`): none attached counts as confirmed."""
        rep = self.replication
        asked = rep.view.expect(rep.replicas) if rep.adaptive else rep.replicas
        for attempt in range(2):
            try:
                async with self.redis.pipeline(transaction=False) as pipe:
                    build(pipe)
                    if rep.enabled:
                        if probe:
                            pipe.incr(self.keys.probe)
                        if rep.adaptive:
                            pipe.info("replication")
                        pipe.wait(asked, rep.timeout_ms)
                    out = await pipe.execute(raise_on_error=False)
            except (RedisConnectionError, RedisTimeoutError, OSError):
                rep.view.forget()  # a failover? the next primary's replicas are unknown
                raise
            if attempt == 0 and scripts and any(isinstance(r, NoScriptError) for r in out):
                for script in scripts:
                    await self.redis.script_load(script.script)
                if rep.adaptive:  # a new primary (scripts unknown): ask for what it has
                    asked = min(asked, rep.view.peek(out[-2], rep.replicas))
                continue
            break
        acked = rep.replicas
        if rep.enabled:
            raw = out.pop()
            info = out.pop() if rep.adaptive else None
            probed = out.pop() if probe else None
            if isinstance(probed, Exception):  # READONLY: a demoted primary
                raise RedisConnectionError(f"probe write refused: {probed}")
            if isinstance(raw, Exception):  # "WAIT cannot be used with replica instances"
                raise RedisConnectionError(f"WAIT refused: {raw}")
            acked = int(raw)
            if rep.adaptive:
                acked = await self._adapt(acked, asked, rep.view.observe(info, rep.replicas))
        for result in out:
            if isinstance(result, Exception):
                raise result
        return out, acked

    async def _adapt(self, acked: int, asked: int, needed: int) -> int:
        """The acknowledgement under an adaptive policy: ``needed`` replicas were attached
        when the write was made (``asked`` were waited for). Enough: counts as the policy's
        full number; a replica attached since the last look: wait for it now (a probe covers
        every earlier write)."""
        if acked < needed and asked < needed:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.incr(self.keys.probe)
                pipe.wait(needed, self.replication.timeout_ms)
                _, raw = await pipe.execute()
            acked = int(raw)
        return self.replication.replicas if acked >= needed else acked

    async def _eval(
        self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any], *, probe: bool = False
    ) -> tuple[Any, int]:
        """One script call and its acknowledgement (see :meth:`_durable`); without a WAIT
        policy exactly the plain ``EVALSHA`` it always was."""
        if not self.replication.enabled:
            return await script(keys=list(keys), args=list(args)), 0
        out, acked = await self._durable(
            lambda pipe: pipe.evalsha(script.sha, len(keys), *keys, *args),
            scripts=(script,),
            probe=probe,
        )
        return out[0], acked

    def replicated(self, acked: int) -> bool:
        """Whether ``acked`` replicas satisfy the WAIT policy."""
        return acked >= self.replication.replicas

    async def confirm(self, what: str = "write") -> None:
        """Wait until the replicas have every write the primary made so far (``INCR probe``,
        ``WAIT``); :class:`NotReplicated` when too few confirm. No-op without a policy."""
        if not self.replication.enabled:
            return
        _, acked = await self._durable(lambda pipe: None, probe=True)
        if not self.replicated(acked):
            raise self._short(what, acked)

    # -- the leader lock ----------------------------------------------------------------------
