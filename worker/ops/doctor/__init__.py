"""``python -m worker doctor``: the N-replica acceptance checklist, run against a live cluster.

It reads Redis only (plus the app, for the duties it declares) and judges what a correct
deployment at N replicas must look like: exactly one leader with a sane epoch, a Redis that
never evicts, every registered instance heartbeating, one app version, clocks that agree, each
duty kind's own checks (:mod:`worker.duties.kinds`: schedules kept, items dispatched), the
queue keeping up, no dead letters, no holds sets nobody owns. Each check answers ✓ (ok), !
(warning: shown, does not fail) or ✗ (fails: the command exits 1) with a one-line explanation
and, where useful, the offending instances or jobs below it.

:func:`diagnose` reads a :class:`~worker.ops.snapshot.ClusterSnapshot` (the read model ``status``
and the console read too; "now" being the Redis server's clock) and runs every check on it;
each check is a pure function of the snapshot, so it can be tested on a hand-made one.
:func:`render` prints the checklist; ``--json`` prints :meth:`Report.to_json`.

Some checks look at moments: a leader that took over within the last heartbeat interval, or a
tick due a second ago, can show as ✗ once. Run it again before acting; between the steps of a
staged rollout (docs/deployment.md, "Rolling out the role split") run it until it passes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from redis.asyncio import Redis

from worker.app import App
from worker.core.verdict import MARKS, Check, Limits, Status, iso
from worker.duties import kinds
from worker.ops import snapshot
from worker.ops.doctor.instances import (
    check_clock_skew,
    check_heartbeats,
    check_neighbours,
    check_orphaned_holds,
    check_readiness,
    check_versions,
)
from worker.ops.doctor.lease import check_durability, check_epochs, check_eviction, check_leader
from worker.ops.doctor.work import (
    check_dead_letters,
    check_queue,
    check_shards,
)
from worker.ops.snapshot import ClusterSnapshot
from worker.storage import keys as K
from worker.storage import open_store

__all__ = ["CHECKS", "MARKS", "Check", "Limits", "Report", "Snapshot", "Status"]
__all__ += ["diagnose", "gather", "judge", "render"]


@dataclass(frozen=True)
class Report:
    """Every check's result, judged at ``at_ms`` (the Redis server's clock)."""

    at_ms: int
    prefix: str
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "at": iso(self.at_ms),
            "prefix": self.prefix,
            "failed": [c.name for c in self.checks if c.status == "fail"],
            "checks": [asdict(c) for c in self.checks],
        }


#: The doctor judges the cluster's one read model (:mod:`worker.ops.snapshot`).
Snapshot = ClusterSnapshot


async def gather(redis: Redis, keys: K.Keys, app: App, *, now_ms: int | None = None) -> Snapshot:
    """Read everything the checks need (read-only). ``now_ms``: judge at this instant instead
    of the server's clock (tests)."""
    return await snapshot.read(open_store(redis, keys, None), app, now_ms=now_ms)


async def diagnose(
    redis: Redis,
    keys: K.Keys,
    app: App,
    *,
    limits: Limits | None = None,
    now_ms: int | None = None,
) -> Report:
    """Run the whole checklist against the cluster behind ``redis`` (read-only)."""
    snap = await gather(redis, keys, app, now_ms=now_ms)
    return judge(snap, app, limits or Limits())


def judge(snap: ClusterSnapshot, app: App, limits: Limits) -> Report:
    """Every check on one snapshot (pure); ``shards`` only with more than one queue shard."""
    checks = [*checklist(), check_shards] if snap.shards else checklist()
    return Report(snap.now_ms, snap.prefix, [check(snap, app, limits) for check in checks])


Checker = Callable[[Snapshot, App, Limits], Check]


def checklist() -> list[Checker]:
    """The checks in order: the cluster's, each duty kind's own (:mod:`worker.duties.kinds`),
    then the queue's."""
    duties: list[Checker] = [check for kind in kinds.KINDS for check in kind.checks]
    return [*_CLUSTER, *duties, *_QUEUE]


_CLUSTER: tuple[Checker, ...] = (
    check_leader,
    check_epochs,
    check_eviction,
    check_durability,
    check_heartbeats,
    check_versions,
    check_neighbours,
    check_clock_skew,
    check_readiness,
)
_QUEUE: tuple[Checker, ...] = (check_queue, check_dead_letters, check_orphaned_holds)
#: the checklist as the package's kinds make it (``judge`` reads :func:`checklist` each time)
CHECKS: Sequence[Checker] = tuple(checklist())


def render(report: Report) -> str:
    """The checklist: one line per check (✓ ok, ! warning, ✗ failed), details indented."""
    width = max(len(c.name) for c in report.checks)
    out = [f"worker doctor: prefix {report.prefix!r}, at {iso(report.at_ms)} (Redis clock)", ""]
    for c in report.checks:
        out.append(f"{MARKS[c.status]} {c.name:<{width}}  {c.summary}")
        out += [f"  {' ' * width}    {line}" for line in c.details]
    counts = {s: sum(1 for c in report.checks if c.status == s) for s in MARKS}
    out += [
        "",
        f"{counts['ok']} ok, {counts['warn']} warnings, {counts['fail']} failed"
        + ("" if report.ok else f": {', '.join(c.name for c in report.checks if not c.ok)}"),
    ]
    return "\n".join(out)
