"""Every Redis key name the framework uses, under one prefix; no Lua and no Redis access.

The scripts live beside their one caller in the other modules of :mod:`worker.storage`, and
:mod:`worker.core.ids` builds and parses ids (the Cluster hash tag included).

All keys live under one configurable prefix (``WORKER_KEY_PREFIX``, default ``worker:``) so
several apps can share a Redis. The only exceptions are arq's own per-job keys
(``arq:job:<id>``, ``arq:in-progress:<id>``, ``arq:result:<id>``, ``arq:retry:<id>``), whose
prefixes arq fixes; the job ids the framework generates carry the prefix, so they do not clash.

Each script opens with a ``KEYS[n] ->`` / ``ARGV[n] ->`` / ``Returns:`` header. Scripts marked
*fenced* begin by comparing the leader lock with the caller's lock value and answer with the
error ``FENCED ...`` when it differs; Redis runs a script atomically, so a leader that lost its
lease (paused, partitioned, replaced) can never write through one of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.core import codec
from worker.core.ids import hash_tag
from worker.core.jobdefs import DEFAULT_QUEUE

__all__ = [
    "DEFAULT_QUEUE",
    "FENCE_ERROR",
    "HISTORY_KEEP",
    "STATS_TTL_MS",
    "TASK_BUCKETS_MS",
    "TASK_SLOT_MIN",
    "Keys",
]

ARQ_JOB = codec.JOB_KEY_PREFIX
ARQ_RESULT = codec.RESULT_KEY_PREFIX
ARQ_IN_PROGRESS = codec.IN_PROGRESS_KEY_PREFIX
ARQ_RETRY = codec.RETRY_KEY_PREFIX
ARQ_ABORT = codec.ABORT_JOBS_SS

#: Prefix of the error a fenced script answers with when the caller no longer holds the lock.
FENCE_ERROR = "FENCED"

#: Leadership changes kept in ``<prefix>leader:history`` (newest first).
HISTORY_KEEP = 100
#: How long the per-minute throughput counters of an hour are kept after their last write.
STATS_TTL_MS = 2 * 3600 * 1000
#: Upper bounds (ms) of the run-time buckets FINISH counts per task (:meth:`Keys.task_stats`);
#: a run longer than the last falls in one more bucket.
TASK_BUCKETS_MS = (10, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000, 60_000, 300_000)
#: Minutes per slot of the per-task run-time buckets.
TASK_SLOT_MIN = 10


def channel_scope(db: int) -> str:
    """What the framework's pub/sub channel names end with in database ``db``: ``@db<n>``, or
    nothing in 0 (Pub/Sub is server-wide: two databases' apps would hear each other)."""
    return f"@db{db}" if db else ""


@dataclass(frozen=True)
class Keys:
    """Key names under one prefix. Pure functions of their arguments; no Redis access."""

    prefix: str = "worker:"
    #: appended to every pub/sub channel name (:func:`channel_scope`; set by the store from
    #: its connection's database); key names never carry it
    scope: str = ""

    def scoped(self, scope: str) -> Keys:
        """The same key names, with channel names scoped by ``scope``."""
        return self if scope == self.scope else Keys(self.prefix, scope)

    # -- queues (arq's sorted sets of job ids scored by due time in ms) ------------------------
    @property
    def queue(self) -> str:
        """The default queue (named ``default``)."""
        return f"{self.prefix}queue"

    def queue_of(self, name: str) -> str:
        """A named queue: ``default`` is :attr:`queue`, any other ``<prefix>queue:<name>``."""
        return self.queue if name == DEFAULT_QUEUE else f"{self.prefix}queue:{name}"

    # -- leadership --------------------------------------------------------------------------
    @property
    def leader(self) -> str:
        """The lease: value ``<epoch>:<token>``, PX = leader TTL."""
        return f"{self.prefix}leader"

    @property
    def leader_epoch(self) -> str:
        """Counter INCRed on every acquisition; never decreases while Redis keeps its data."""
        return f"{self.prefix}leader:epoch"

    @property
    def leader_channel(self) -> str:
        """Pub/sub channel a releasing leader publishes on so standbys campaign at once."""
        return f"{self.prefix}leader:released{self.scope}"

    @property
    def leader_announce(self) -> str:
        """Pub/sub channel every acquisition is announced on (``<epoch>:<token>``): a hint; a
        leader hearing another value renews at once (the renew reads the lock)."""
        return f"{self.prefix}leader:acquired{self.scope}"

    @property
    def leader_state(self) -> str:
        """Hash about the lease: ``epoch``, ``renewed_ms`` (server time of the last renew) and
        ``released`` (the epoch released cleanly): how long a previous holder may lead."""
        return f"{self.prefix}leader:state"

    @property
    def leader_history(self) -> str:
        """The last :data:`HISTORY_KEEP` leadership changes, newest first, each ``<epoch>|<server
        ms>|<reason>|<instance>`` (written by ACQUIRE and RELEASE; read by ``leader_history``)."""
        return f"{self.prefix}leader:history"

    @property
    def leader_handoff(self) -> str:
        """A planned handoff request: value = the epoch it targets, short PX. The leader of that
        epoch sees it on its next renew (at once when :attr:`leader_handoff_channel` wakes
        it: only this key, a write the app's ACL protects, hands the lease over), releases
        the lease and stays a standby for a while, so another candidate takes over."""
        return f"{self.prefix}leader:handoff"

    @property
    def leader_handoff_channel(self) -> str:
        """Pub/sub channel a handoff request is published on (the targeted epoch): a hint to
        renew now, never a request by itself."""
        return f"{self.prefix}leader:handoff-requested{self.scope}"

    @property
    def boot(self) -> str:
        """Marker ``<random id>:<created ms>`` written once per Redis dataset: a process that
        saw it and finds it gone knows Redis lost its data."""
        return f"{self.prefix}boot"

    @property
    def probe(self) -> str:
        """Counter INCRed only to measure replication: a ``WAIT`` right after it confirms that
        the replicas have every write the primary made before it (see ``StoreBase.confirm``)."""
        return f"{self.prefix}probe"

    @property
    def slot_tag(self) -> str:
        """The Redis Cluster hash tag the prefix starts with (``{shop}``), or ``""``: every job
        id must then start with it, so arq's per-job keys share the app's slot."""
        tag = hash_tag(self.prefix)
        return f"{{{tag}}}" if tag is not None else ""

    @property
    def abort(self) -> str:
        """The app's sorted set of abort requests (``Client.abort``), not arq's shared
        ``arq:abort``, which a Redis user limited to the app's keys cannot reach."""
        return f"{self.prefix}abort"

    @property
    def fence(self) -> str:
        """The highest fencing token (a lease epoch) a leader wrote into this queue shard with
        (``WORKER_QUEUE_SHARDS``): a shard's fenced scripts refuse a lower token and raise it
        to a higher one (see ``fenced.TOKEN_FENCE``). Only shards other than home have one."""
        return f"{self.prefix}fence"

    @property
    def wake(self) -> str:
        """Pub/sub channel every enqueue publishes the earliest due time (ms) on, so idle
        consumers claim at once instead of at their next poll."""
        return f"{self.prefix}wake{self.scope}"

    @property
    def wake_marker(self) -> str:
        """One-member sorted set scored with the earliest due time announced: announcements
        ``ZADD … LT`` it, one idle consumer takes it (``BZPOPMIN``) and passes it on."""
        return f"{self.prefix}wakeup"

    @property
    def wake_duty_marker(self) -> str:
        return f"{self.prefix}wakeup:duty"  # the duty lanes' (set by the leader's duties)

    # -- periodic jobs ------------------------------------------------------------------------
    @property
    def periodic_state(self) -> str:
        """Hash: periodic job name -> the newest tick planned (epoch ms): enqueued, or skipped
        by the catch-up policy (a new job records the slot before its first tick and enqueues
        from the next one). Where planning resumes, not what ran: see :attr:`periodic_enqueued`."""
        return f"{self.prefix}periodic:last"

    @property
    def periodic_enqueued(self) -> str:
        """Hash: periodic job name -> the newest tick actually enqueued as a job (epoch ms);
        no field: no tick of it was ever enqueued (what ``status`` and the console show)."""
        return f"{self.prefix}periodic:enqueued"

    @property
    def periodic_runs(self) -> str:
        """Hash of how periodic runs ended, written by the consumers that ran them:
        ``<name>:success`` and ``<name>:failure`` -> JSON ``{at_ms, tick_ms, instance[,
        error]}`` of the most recent such end, ``<name>:failing_since`` -> end time (ms) of
        the first failure since the last success."""
        return f"{self.prefix}periodic:runs"

    # -- run-time schedules (client.schedules) -----------------------------------------------
    @property
    def schedules(self) -> str:
        """Hash: schedule name -> its definition (JSON, see :mod:`worker.core.schedule_spec`)."""
        return f"{self.prefix}schedules"

    @property
    def schedule_versions(self) -> str:
        """Hash: schedule name -> the version of its definition (the :attr:`schedules_gen`
        value of its last upsert); the tick script enqueues only for a matching version."""
        return f"{self.prefix}schedules:version"

    @property
    def schedules_gen(self) -> str:
        """Counter raised by every upsert and removal: the leader re-reads the schedules only
        when it moved."""
        return f"{self.prefix}schedules:gen"

    @property
    def schedule_state(self) -> str:
        """Hash: schedule name -> newest tick planned (ms), as :attr:`periodic_state`."""
        return f"{self.prefix}schedules:last"

    @property
    def schedule_enqueued(self) -> str:
        """Hash: schedule name -> job id of its newest enqueued tick (``overlap="skip"`` looks
        whether that job has ended)."""
        return f"{self.prefix}schedules:enqueued"

    @property
    def schedule_overlaps(self) -> str:
        """Hash: schedule name -> ticks skipped because the previous run had not ended."""
        return f"{self.prefix}schedules:overlaps"

    # -- pollers ------------------------------------------------------------------------------
    def poll_shard(self, poller: str, shard: int) -> str:
        """Sorted set of items due for polling, scored by due time (epoch ms). The poller name
        is a Cluster hash tag so one poller's shards, its in-flight hash and a dispatch script's
        keys could share a slot (docs/deployment.md, "Scale")."""
        return f"{self.prefix}poll:{{{poller}}}:{shard}"

    def poll_inflight(self, poller: str) -> str:
        """Hash: item -> id of the arq job currently carrying it."""
        return f"{self.prefix}poll:{{{poller}}}:inflight"

    def poll_removed(self, poller: str) -> str:
        """Hash: item -> id of the job that carried it when the app removed it (that job's
        failure must not put the item back)."""
        return f"{self.prefix}poll:{{{poller}}}:removed"

    # -- initializers -------------------------------------------------------------------------
    def init_state(self, name: str) -> str:
        """Hash: version, cursor, batches, items, done, started_ms, finished_ms, epoch."""
        return f"{self.prefix}init:{name}"

    # -- instance registry --------------------------------------------------------------------
    @property
    def instances(self) -> str:
        """Sorted set: instance id -> last heartbeat (epoch ms). Outlives the instance hash."""
        return f"{self.prefix}instances"

    @property
    def apps(self) -> str:
        """Hash: app name -> its manifest (JSON, see :mod:`worker.manifest`), written by every
        process at start; admin commands describe the running app from it."""
        return f"{self.prefix}apps"

    def instance(self, instance_id: str) -> str:
        """Hash describing one live process; expires at about twice the heartbeat interval."""
        return f"{self.prefix}instance:{instance_id}"

    def holds(self, instance_id: str) -> str:
        """Set of arq job ids the instance is running (for orphan recovery)."""
        return f"{self.prefix}instance:{instance_id}:jobs"

    @property
    def holds_pattern(self) -> str:
        """SCAN pattern of every holds set (``doctor`` looks for ones nobody owns)."""
        return f"{self.prefix}instance:*:jobs"

    def holds_owner(self, key: str) -> str | None:
        """The instance id of a holds set key, or ``None`` if ``key`` is not one."""
        head, tail = f"{self.prefix}instance:", ":jobs"
        if key.startswith(head) and key.endswith(tail) and len(key) > len(head) + len(tail):
            return key[len(head) : -len(tail)]
        return None

    def arq_health(self, instance_id: str) -> str:
        """arq's health-check key, one per instance (github.com/python-arq/arq/issues/291)."""
        return f"{self.prefix}arq-health:{instance_id}"

    @property
    def paused(self) -> str:
        """Set of paused duties (``periodic:<name>``, ``poller:<name>``) and queues
        (``queue:<name>``, ``queue:*``: CLAIM skips them; each queue shard has its own)."""
        return f"{self.prefix}paused"

    # -- per_key services ---------------------------------------------------------------------
    def service_members(self, service: str) -> str:
        """Sorted set: instance id -> last round (epoch ms) of processes running the service."""
        return f"{self.prefix}svc:{service}:members"

    def service_lease(self, service: str, key: str) -> str:
        """Lease of one key of a per_key service: value = owning instance id, PX = lease TTL."""
        return f"{self.prefix}svc:{service}:lease:{key}"

    # -- broadcasts ---------------------------------------------------------------------------
    def broadcast(self, topic: str) -> str:
        """Stream of a broadcast topic's recent messages (capped; see ``BROADCAST``): entry
        fields ``seq``, ``origin``, ``chain``, ``data``. The stream id is the read cursor."""
        return f"{self.prefix}bcast:{topic}"

    # -- job helpers --------------------------------------------------------------------------
    def mutex(self, name: str) -> str:
        return f"{self.prefix}mutex:{name}"

    def once(self, name: str) -> str:
        return f"{self.prefix}once:{name}"

    def coalesce(self, task: str, key: str) -> str:
        """Hash: a coalescing key's state (``p``, ``f``, ``t``, ``r``; see storage/coalesce.py)."""
        return f"{self.prefix}coalesce:{task}:{key}"

    # -- cluster-wide limits: a task's, or with ``flow`` one flow key's of the task -----------
    def limit_slots(self, task: str, flow: str | None = None) -> str:
        """Sorted set: job id -> lease expiry (ms) of each run holding a concurrency slot."""
        return f"{self.prefix}limit:{task}:{'' if flow is None else f'key:{flow}:'}slots"

    def limit_rate(self, task: str, flow: str | None = None) -> str:
        """The rate limiter's theoretical arrival time (ms) for ``task``."""
        return f"{self.prefix}limit:{task}:{'' if flow is None else f'key:{flow}:'}rate"

    def fair(self, queue: str, flow: str | None = None) -> str:
        """A fair queue's ring (flow key -> pass); with ``flow``, that key's queue (id -> due)."""
        return f"{self.prefix}fair:{queue}" + ("" if flow is None else f":{flow}")

    # -- throughput and the operators' log ------------------------------------------------------
    def stats(self, queue: str, hour: int) -> str:
        """Hash of one queue's finished runs in one hour (``hour`` = epoch ms // 3,600,000):
        ``<minute>:done`` / ``:failed`` -> count, ``minute`` = epoch ms // 60,000; by FINISH
        (one HINCRBY per batch and outcome), expiring :data:`STATS_TTL_MS` after its last."""
        return f"{self.prefix}stats:{queue}:{hour}"

    def task_stats(self, hour: int) -> str:
        """Hash of every task's finished runs in one hour (``hour`` as in :meth:`stats`):
        ``<minute>:<task>:d`` / ``:f`` -> runs done / failed in that minute, and per
        :data:`TASK_SLOT_MIN`-minute slot (``slot`` = minute // 10) ``s<slot>:<task>:ms`` -> their
        summed run time and ``s<slot>:<task>:<k>`` -> runs in run-time bucket ``k``
        (:data:`TASK_BUCKETS_MS`). Only tasks the app defines are counted (bounded fields).
        Written by FINISH with the queue counters; expires like them."""
        return f"{self.prefix}tstats:{hour}"

    @property
    def audit(self) -> str:
        """List of the operators' recent actions (console and CLI), newest first, JSON each."""
        return f"{self.prefix}audit"

    # -- job records: failures, completions, progress -----------------------------------------
    def failure(self, job_id: str) -> str:
        """JSON of the last final failure of a job (status ``failed`` | ``timeout`` |
        ``cancelled`` | ``dead`` | ``expired``, error, capped traceback, try, instance, times,
        capped args): by FINISH with the job's end, kept ``keep_result_s`` and while in
        :attr:`failures`."""
        return f"{self.prefix}failure:{job_id}"

    @property
    def failures(self) -> str:
        """Sorted set: job id -> finished ms of recent final failures (dead-lettered or not),
        at most ``WORKER_FAILURES_KEEP`` entries, none older than ``WORKER_FAILURES_KEEP_S``:
        trimmed by FINISH as it adds, the trimmed ids' :meth:`failure` keys deleted too."""
        return f"{self.prefix}failures"

    @property
    def done(self) -> str:
        """Sorted set: job id -> finished ms of the latest successful runs, at most
        ``WORKER_DONE_KEEP`` (trimmed by rank by FINISH, once per batch). The result is arq's
        ``arq:result:<id>``; an id whose result expired is skipped by readers."""
        return f"{self.prefix}done"

    def progress(self, job_id: str) -> str:
        """JSON ``{fraction, message, at_ms}`` of a job's last ``ctx.progress()``; PX = the
        job's timeout + its ``keep_result_s`` (readable as long as its result)."""
        return f"{self.prefix}progress:{job_id}"

    # -- dead letters -------------------------------------------------------------------------
    @property
    def dead(self) -> str:
        """Sorted set: job id -> time it was set aside (epoch ms)."""
        return f"{self.prefix}dead"

    @property
    def dead_jobs(self) -> str:
        """Hash: job id -> JSON record {reason, payload (base64), at}."""
        return f"{self.prefix}dead:jobs"

    @property
    def dead_index(self) -> str:
        """Hash: job id -> the same JSON record without its payload (what a listing reads)."""
        return f"{self.prefix}dead:index"
