"""Workflows in Redis: a workflow's definition and state in one hash, and the scripts that start,
advance, check and cancel it (each beside its one caller).

Keys: ``<prefix>wf:<id>`` (a hash: ``state``, ``policy``, ``n``, ``left`` steps not ended,
``failed``, ``created_ms``, ``ended_ms``, and per step ``i``: ``f:i`` function, ``q:i`` queue,
``m:i`` takes a list, ``p:i``/``c:i`` parents/children as comma lists, ``a:i`` its own
``(args, kwargs)`` serialized, ``s:i`` state, ``w:i`` parents not yet done, ``r:i`` result
serialized, ``e:i`` error) and ``<prefix>workflows`` (a sorted set: id -> created ms). Both are
under the app's prefix, so on a Cluster (whose prefix carries the app's hash tag) in its slot.

The fan-in is exactly once although jobs run at least once: :meth:`WorkflowOps.advance_workflow`
records a step's end once (a repeat changes nothing) and answers with the dependents whose
parents are all done and that have not started; they are enqueued under deterministic ids (an
id that exists is refused, so a repeat is a no-op) and only then is the step's job finished.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from worker.core.serializer import Deserialize, Serialize
from worker.core.workflow import (
    Ready,
    StepInfo,
    Workflow,
    WorkflowInfo,
    children_of,
    step_job_id,
)
from worker.storage import keys as K
from worker.storage.base import StoreBase, _s

#: How long a running workflow's state is kept after its last step ended (refreshed by each).
RUNNING_TTL_MS = 7 * 86_400_000
#: How long a cancelled workflow's state is kept (as ``WORKER_KEEP_RESULT_S``'s default).
CANCELLED_KEEP_MS = 3_600_000


def workflow_key(prefix: str, workflow_id: str) -> str:
    return f"{prefix}wf:{workflow_id}"


def workflows_index(prefix: str) -> str:
    return f"{prefix}workflows"


#: Run by :meth:`WorkflowOps.start_workflow` (below).
WF_START = """
-- Write a workflow unless it exists; answer with its root steps still to enqueue.
-- KEYS[1] -> the workflow's hash
-- KEYS[2] -> the workflows index (sorted set: id -> created ms)
-- ARGV[1] -> workflow id
-- ARGV[2] -> now ms
-- ARGV[3] -> on_failure policy
-- ARGV[4] -> TTL ms while running
-- ARGV[5] -> steps n, then 6 values per step: function, queue, many (0/1), parents, children
--            (comma lists), its (args, kwargs) serialized
-- Returns: the indexes of the root steps still queued (none once the workflow ended).
local w, n = KEYS[1], tonumber(ARGV[5])
if redis.call('EXISTS', w) == 0 then
  redis.call('HSET', w, 'state', 'running', 'policy', ARGV[3], 'created_ms', ARGV[2], 'n', n,
    'left', n, 'failed', 0)
  for i = 0, n - 1 do
    local b = 6 + i * 6
    local waits = 0
    for _ in string.gmatch(ARGV[b + 3], '%d+') do waits = waits + 1 end
    redis.call('HSET', w, 'f:' .. i, ARGV[b], 'q:' .. i, ARGV[b + 1], 'm:' .. i, ARGV[b + 2],
      'p:' .. i, ARGV[b + 3], 'c:' .. i, ARGV[b + 4], 'a:' .. i, ARGV[b + 5],
      'w:' .. i, waits, 's:' .. i, waits == 0 and 'queued' or 'pending')
  end
  redis.call('PEXPIRE', w, ARGV[4])
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', tonumber(ARGV[2]) - tonumber(ARGV[4]))
end
local roots = {}
if redis.call('HGET', w, 'state') == 'running' then
  for i = 0, tonumber(redis.call('HGET', w, 'n')) - 1 do
    if redis.call('HGET', w, 'p:' .. i) == '' and redis.call('HGET', w, 's:' .. i) == 'queued' then
      roots[#roots + 1] = i
    end
  end
end
return roots
"""

#: Run by :meth:`WorkflowOps.advance_workflow` (below).
WF_ADVANCE = """
-- Record a step's end (once: a repeat changes nothing) and answer with its dependents that
-- may start (every parent done, not started yet), with what they need to be enqueued.
-- KEYS[1] -> the workflow's hash
-- ARGV[1] -> step
-- ARGV[2] -> 'done' or 'failed'
-- ARGV[3] -> its result serialized (done) or its error (failed)
-- ARGV[4] -> now ms
-- ARGV[5] -> ms to keep the workflow once it ended
-- ARGV[6] -> TTL ms while running
-- Returns: {state, 1 if this call ended the workflow else 0, ready...}; each ready step is
-- {index, function, queue, many, (args, kwargs), {each parent's result, false if it failed}}
-- (many 2, a batch's callback: {parents done, parents failed} instead);
-- {false, 0} for an unknown workflow.
local w, i = KEYS[1], ARGV[1]
local st = redis.call('HGET', w, 's:' .. i)
if not st then return {false, 0} end
local ended = 0
if st ~= 'done' and st ~= 'failed' and st ~= 'cancelled' then
  redis.call('HSET', w, 's:' .. i, ARGV[2], (ARGV[2] == 'done' and 'r:' or 'e:') .. i, ARGV[3])
  local left = redis.call('HINCRBY', w, 'left', -1)
  if ARGV[2] == 'failed' then redis.call('HINCRBY', w, 'failed', 1) end
  if redis.call('HGET', w, 'state') == 'running' then
    if ARGV[2] == 'failed' and redis.call('HGET', w, 'policy') == 'fail' then
      redis.call('HSET', w, 'state', 'failed')
      for j = 0, tonumber(redis.call('HGET', w, 'n')) - 1 do
        local sj = redis.call('HGET', w, 's:' .. j)
        if sj == 'pending' or sj == 'queued' then redis.call('HSET', w, 's:' .. j, 'cancelled') end
      end
      ended = 1
    else
      for c in string.gmatch(redis.call('HGET', w, 'c:' .. i), '%d+') do
        local waits = redis.call('HINCRBY', w, 'w:' .. c, -1)
        if waits <= 0 and redis.call('HGET', w, 's:' .. c) == 'pending' then
          redis.call('HSET', w, 's:' .. c, 'queued')
        end
      end
      if left <= 0 then
        local failed = tonumber(redis.call('HGET', w, 'failed'))
        redis.call('HSET', w, 'state', failed > 0 and 'failed' or 'done')
        ended = 1
      end
    end
  end
end
local state = redis.call('HGET', w, 'state')
if state ~= 'running' then
  if ended == 1 then
    redis.call('HSET', w, 'ended_ms', ARGV[4])
    redis.call('PEXPIRE', w, ARGV[5])
  end
  return {state, ended}
end
redis.call('PEXPIRE', w, ARGV[6])
local out = {state, ended}
for c in string.gmatch(redis.call('HGET', w, 'c:' .. i), '%d+') do
  if redis.call('HGET', w, 's:' .. c) == 'queued' then
    local results, done, failed = {}, 0, 0
    local f = redis.call('HMGET', w, 'f:' .. c, 'q:' .. c, 'm:' .. c, 'a:' .. c)
    for p in string.gmatch(redis.call('HGET', w, 'p:' .. c), '%d+') do
      if f[3] ~= '2' then
        results[#results + 1] = redis.call('HGET', w, 'r:' .. p) or false
      elseif redis.call('HGET', w, 's:' .. p) == 'done' then
        done = done + 1
      else
        failed = failed + 1
      end
    end
    if f[3] == '2' then results = {done, failed} end
    out[#out + 1] = {tonumber(c), f[1], f[2], f[3], f[4], results}
  end
end
return out
"""

#: Run by :meth:`WorkflowOps.begin_step` (below).
WF_BEGIN = """
-- A step's job is about to run: may it?
-- KEYS[1] -> the workflow's hash
-- ARGV[1] -> step
-- Returns: 1 (marked running), 0 when it must not start (the workflow no longer runs, the step
-- was cancelled, or the workflow is unknown: expired).
local st = redis.call('HGET', KEYS[1], 's:' .. ARGV[1])
if not st or st == 'cancelled' or redis.call('HGET', KEYS[1], 'state') ~= 'running' then
  return 0
end
if st == 'queued' or st == 'pending' then
  redis.call('HSET', KEYS[1], 's:' .. ARGV[1], 'running')
end
return 1
"""

#: Run by :meth:`WorkflowOps.cancel_workflow` (below).
WF_CANCEL = """
-- Cancel a running workflow: no step starts after this (WF_BEGIN refuses it).
-- KEYS[1] -> the workflow's hash
-- KEYS[2] -> the app's abort requests (sorted set: job id -> asked at ms)
-- ARGV[1] -> now ms
-- ARGV[2] -> ms to keep it
-- ARGV[3] -> its steps' job id prefix (the step's index follows)
-- ARGV[4] -> arq's job key prefix
-- Returns: {1 if cancelled now else 0, the steps that were queued or running (their jobs'
-- abort is requested, as Client.abort does)}
local w = KEYS[1]
if redis.call('HGET', w, 'state') ~= 'running' then return {0, {}} end
redis.call('HSET', w, 'state', 'cancelled', 'ended_ms', ARGV[1])
local live = {}
for j = 0, tonumber(redis.call('HGET', w, 'n')) - 1 do
  local sj = redis.call('HGET', w, 's:' .. j)
  if sj == 'pending' or sj == 'queued' or sj == 'running' then
    redis.call('HSET', w, 's:' .. j, 'cancelled')
    if sj ~= 'pending' then live[#live + 1] = j end
  end
end
redis.call('PEXPIRE', w, ARGV[2])
for _, j in ipairs(live) do
  -- a queued step whose job is not written yet never starts (WF_BEGIN): no request to linger
  if redis.call('EXISTS', ARGV[4] .. ARGV[3] .. j) == 1 then
    redis.call('ZADD', KEYS[2], ARGV[1], ARGV[3] .. j)
  end
end
return {1, live}
"""


@dataclass(frozen=True)
class Advanced:
    """What :meth:`WorkflowOps.advance_workflow` answered."""

    state: str | None  # None: no such workflow (expired)
    ended_now: bool
    ready: list[Ready]


def _csv(items: Sequence[int]) -> str:
    return ",".join(str(i) for i in items)


def _own(blob: Any, deserialize: Deserialize) -> tuple[tuple[Any, ...], dict[str, Any]]:
    value = deserialize(blob)
    return tuple(value.get("args", ())), dict(value.get("kwargs", {}))


def result_blob(result: Any, serialize: Serialize) -> bytes:
    """A step's result as the workflow keeps it."""
    return serialize({"value": result})


def _result(blob: Any, deserialize: Deserialize) -> Any:
    return None if blob is None else deserialize(blob).get("value")


class WorkflowOps(StoreBase):
    """Start, advance, check, cancel and read workflows."""

    async def start_workflow(
        self, workflow_id: str, wf: Workflow, queues: Sequence[str], now_ms: int,
        serialize: Serialize,
    ) -> list[Ready]:  # fmt: skip
        """Write ``wf`` under ``workflow_id`` unless it exists: its roots still to enqueue."""
        args: list[Any] = [workflow_id, now_ms, wf.on_failure, RUNNING_TTL_MS, len(wf.steps)]
        children = children_of(wf.steps)
        for i, step in enumerate(wf.steps):
            own = serialize({"args": list(step.job.args), "kwargs": step.job.kwargs})
            args += [step.job.function, queues[i], 2 if step.counts else int(step.many)]
            args += [_csv(step.parents), _csv(children[i]), own]
        keys = [workflow_key(self.keys.prefix, workflow_id), workflows_index(self.keys.prefix)]
        roots, acked = await self._eval(self._script(WF_START), keys, args, probe=True)
        if not self.replicated(acked):
            raise self._short("workflow start", acked)
        steps = [(int(r), wf.steps[int(r)].job) for r in roots]
        return [
            Ready(i, j.function, queues[i], False, j.args, dict(j.kwargs), []) for i, j in steps
        ]

    async def advance_workflow(
        self, workflow_id: str, step: int, done: bool, value: bytes | str, now_ms: int,
        keep_ms: int, deserialize: Deserialize,
    ) -> Advanced:  # fmt: skip
        """Record ``step``'s end (``done`` with its serialized result, else failed with its
        error), once; the dependents that may start now (again, on a repeat)."""
        out, acked = await self._eval(
            self._script(WF_ADVANCE),
            [workflow_key(self.keys.prefix, workflow_id)],
            [step, "done" if done else "failed", value, now_ms, max(keep_ms, 1), RUNNING_TTL_MS],
            probe=True,
        )
        if not self.replicated(acked):
            raise self._short("workflow step", acked)
        ready = []
        for index, fn, queue, many, own, results in out[2:]:
            args, kwargs = _own(own, deserialize)
            if _s(many) == "2":  # a batch's callback: the counts
                parents: list[Any] = [{"done": int(results[0]), "failed": int(results[1])}]
            else:
                parents = [_result(r, deserialize) for r in results]
            ready.append(
                Ready(int(index), _s(fn), _s(queue), _s(many) == "1", args, kwargs, parents)
            )
        return Advanced(_s(out[0]) if out[0] is not None else None, bool(out[1]), ready)

    async def begin_step(self, workflow_id: str, step: int) -> bool:
        """Whether ``step`` may start (marked running if so)."""
        key = workflow_key(self.keys.prefix, workflow_id)
        return bool(await self._script(WF_BEGIN)(keys=[key], args=[step]))

    async def cancel_workflow(self, workflow_id: str, now_ms: int) -> bool:
        """Cancel the workflow and abort its steps' jobs that were queued or running;
        ``False`` when it was not running."""
        key = workflow_key(self.keys.prefix, workflow_id)
        head = step_job_id(self.keys.prefix, workflow_id, 0)[:-1]
        args = [now_ms, CANCELLED_KEEP_MS, head, K.ARQ_JOB]
        keys = [key, self.keys.abort]
        out, acked = await self._eval(self._script(WF_CANCEL), keys, args, probe=True)
        if not self.replicated(acked):
            raise self._short("workflow cancel", acked)
        return bool(out[0])

    async def read_workflow(
        self, workflow_id: str, deserialize: Deserialize
    ) -> WorkflowInfo | None:
        """The workflow's state and its steps', ``None`` when unknown or expired."""
        raw = await self.redis.hgetall(workflow_key(self.keys.prefix, workflow_id))
        if not raw:
            return None
        h = {_s(k): v for k, v in raw.items()}
        steps = []
        for i in range(int(h.get("n", 0))):
            state = _s(h.get(f"s:{i}", "pending"))
            r = h.get(f"r:{i}")
            parents = tuple(int(p) for p in _s(h.get(f"p:{i}", "")).split(",") if p)
            steps.append(
                StepInfo(
                    i, _s(h.get(f"f:{i}", "")), state,  # type: ignore[arg-type]
                    step_job_id(self.keys.prefix, workflow_id, i), parents,
                    _result(r, deserialize),
                    _s(h[f"e:{i}"]) if f"e:{i}" in h else None,
                )
            )  # fmt: skip
        return WorkflowInfo(
            workflow_id,
            _s(h.get("state", "running")),  # type: ignore[arg-type]
            _s(h.get("policy", "fail")),  # type: ignore[arg-type]
            int(_s(h.get("created_ms", 0))),
            tuple(steps),
        )

    async def list_workflows(self, limit: int = 100) -> list[tuple[str, str, int]]:
        """The newest ``limit`` workflows kept: ``(id, state, created ms)``, newest first."""
        ids = [
            _s(i)
            for i in await self.redis.zrevrange(workflows_index(self.keys.prefix), 0, limit - 1)
        ]
        async with self.redis.pipeline(transaction=False) as pipe:
            for wid in ids:
                pipe.hmget(workflow_key(self.keys.prefix, wid), ["state", "created_ms"])
            rows = await pipe.execute()
        return [(wid, _s(st), int(_s(c))) for wid, (st, c) in zip(ids, rows, strict=True) if st]
