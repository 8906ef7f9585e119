"""Leadership under hostile or mistaken neighbours, with real processes: a message on a
channel is a hint to look, never a fact to act on; every epoch read from Redis is validated;
no value in Redis makes leadership flap or end for good."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
import redis as redis_sync

from harness import FAST_ENV, CliRun, Spawn, WorkerProc, wait_until
from worker.storage.shards import shard_prefixes

pytestmark = pytest.mark.slow

#: A lock value as the framework writes it: a plain integer epoch, a token.
PLAIN = re.compile(rb"^[1-9][0-9]{0,15}:[0-9a-f]{32}$")


@pytest.fixture
def key_prefix() -> str:
    """Hash-tagged: the shard-fence test needs ``WORKER_QUEUE_SHARDS`` (any test may use it)."""
    return f"{{h{time.monotonic_ns() % 10**9}}}:"


def lock(r: redis_sync.Redis, prefix: str) -> bytes | None:
    value = r.get(f"{prefix}leader")
    return value if isinstance(value, bytes) else None


def events(p: WorkerProc, name: str) -> list[dict[str, Any]]:
    return [e for e in p.events() if e.get("event") == name]


def renewed_ms(r: redis_sync.Redis, prefix: str) -> int:
    return int(r.hget(f"{prefix}leader:state", "renewed_ms") or 0)


def renews_after(r: redis_sync.Redis, prefix: str, n: int = 3) -> None:
    """Wait until the leader renewed ``n`` more times (it would have acted on anything by then)."""
    seen, left = renewed_ms(r, prefix), n
    deadline = time.monotonic() + 20
    while left and time.monotonic() < deadline:
        now = renewed_ms(r, prefix)
        if now != seen:
            seen, left = now, left - 1
        time.sleep(0.05)
    assert not left, "the leader stopped renewing"


def test_a_forged_announcement_is_a_hint_the_leader_checks_and_ignores(
    spawn: Spawn, rsync: redis_sync.Redis
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    leader = spawn("leader", name="leader")
    held = wait_until(lambda: lock(rsync, prefix), what="the lease")
    assert PLAIN.match(held), held
    for forged in (
        b"100000000000000:x",
        b"99999999999999999999:forged",
        held.split(b":")[0] + b":y",
    ):
        rsync.publish(f"{prefix}leader:acquired", forged)
    renews_after(rsync, prefix)
    assert lock(rsync, prefix) == held  # the same lease, still renewed
    assert not events(leader, "leadership lost; stepping down"), leader.log()
    counter = rsync.get(f"{prefix}leader:epoch")
    assert counter is not None and counter.isdigit() and int(counter) < 2**53, counter
    # and the next acquisition (after a restart) is a plain integer epoch again
    leader.terminate()
    spawn("leader", name="again")
    wait_until(lambda: lock(rsync, prefix) not in (None, held), what="a new lease")
    assert PLAIN.match(lock(rsync, prefix) or b""), lock(rsync, prefix)


def test_a_bare_publish_on_the_handoff_channel_hands_nothing_over(
    spawn: Spawn, rsync: redis_sync.Redis
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    leader = spawn("leader", name="leader")
    held = wait_until(lambda: lock(rsync, prefix), what="the lease")
    epoch = held.split(b":")[0]
    for _ in range(3):
        rsync.publish(f"{prefix}leader:handoff-requested", epoch)
    renews_after(rsync, prefix)
    assert lock(rsync, prefix) == held
    assert not events(leader, "stepping down"), leader.log()
    assert not rsync.lrange(f"{prefix}leader:history", 0, 0)[0].count(b"|handoff|")


def test_two_apps_with_one_prefix_in_two_databases_never_hear_each_other(
    spawn: Spawn, redis_url: str, rsync: redis_sync.Redis, cli: CliRun
) -> None:
    base = redis_url.rsplit("/", 1)[0] if redis_url.count("/") > 2 else redis_url
    urls = {db: f"{base}/{db}" for db in (0, 2)}
    # A lease that outlasts a loaded box's stalls: with the suite's 1.5 s renew deadline, a
    # renewal held up while app b's two processes start (their imports take both cores) ended
    # app a's lease, "renew deadline passed", read here as the apps hearing each other. Every
    # hand-over below is a release, so the long lease costs no time.
    lease = {"WORKER_LEADER_TTL_S": "12", "WORKER_LEADER_RENEW_DEADLINE_S": "8"}
    env = {
        db: {"WORKER_REDIS_URL": url, "WORKER_KEY_PREFIX": None, **lease}
        for db, url in urls.items()
    }
    first = spawn("leader", name="a-leader", env=env[0])
    db0 = redis_sync.Redis.from_url(urls[0])
    db2 = redis_sync.Redis.from_url(urls[2])
    try:
        wait_until(lambda: db0.get("worker:leader"), what="app a leads")
        second = [spawn("leader", name=f"b-leader-{i}", env=env[2]) for i in range(2)]
        wait_until(lambda: db2.get("worker:leader"), what="app b leads")
        holder = wait_until(
            lambda: next((p for p in second if events(p, "leadership acquired")), None),
            what="which of app b's processes leads",
        )
        other = second[1] if holder is second[0] else second[0]
        holder.terminate()  # a release and a new acquisition in db 2
        wait_until(
            lambda: db2.lrange("worker:leader:history", 0, -1).__len__() >= 3, what="b again"
        )
        renews_after(db0, "worker:")
        for p in (first, other):
            lost = events(p, "leadership lost; stepping down")
            assert not lost, f"{p.name}: {[e.get('reason') for e in lost]}\n{p.log()}"
        # doctor, run for app a, tells that the prefix is in use in another database too
        out = cli(
            "doctor", "--json",
            env={**FAST_ENV, "WORKER_REDIS_URL": urls[0], "WORKER_APP": "harness.apps.ledger:app"},
        )  # fmt: skip
        report = json.loads(out.stdout)
        assert out.returncode == 1 and "neighbours" in report["failed"], out.stdout
    finally:
        db0.close()
        db2.close()


def test_a_corrupt_epoch_counter_is_repaired_and_doctor_reads_it(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str, cli: CliRun
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    rsync.set(f"{prefix}leader:epoch", "1e+20")
    env = {**FAST_ENV, "WORKER_REDIS_URL": redis_url, "WORKER_KEY_PREFIX": prefix,
           "WORKER_APP": "harness.apps.ledger:app"}  # fmt: skip
    out = cli("doctor", "--json", env=env)
    assert "Traceback" not in out.stderr, out.stderr
    assert "epochs" in json.loads(out.stdout)["failed"], out.stdout
    leader = spawn("leader", name="leader")
    held = wait_until(lambda: lock(rsync, prefix), timeout=15, what="leadership despite it")
    assert PLAIN.match(held), held
    counter = rsync.get(f"{prefix}leader:epoch") or b""
    assert counter == held.split(b":")[0], counter
    assert any(e.get("malformed") for e in leader.events()), leader.log()
    # a huge but numeric counter (the forged 10^14 of old) is out of range: repaired likewise
    leader.terminate()
    rsync.set(f"{prefix}leader:epoch", "100000000000000")
    spawn("leader", name="again")
    wait_until(lambda: lock(rsync, prefix), timeout=15, what="leadership again")
    assert int((lock(rsync, prefix) or b"0:").split(b":")[0]) < 10**14


def test_a_shard_fence_above_every_epoch_is_reported_and_never_makes_leadership_flap(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str, cli: CliRun
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    shards = shard_prefixes(prefix, 3)
    rsync.set(f"{shards[1]}fence", str(2**53 - 2))  # above every epoch
    rsync.set(f"{shards[2]}fence", "not a number")
    leader = spawn("leader", name="leader", env={"WORKER_QUEUE_SHARDS": "3"})
    wait_until(lambda: lock(rsync, prefix), what="the lease")
    start = time.monotonic()
    reported = "queue shard fenced above this leadership; skipped"
    wait_until(lambda: events(leader, reported), what="the shard reported")
    renews_after(rsync, prefix, 4)
    took = time.monotonic() - start
    acquired = len(events(leader, "leadership acquired"))
    assert acquired <= 3, (acquired, took)
    assert not [e for e in leader.events() if e.get("event") == "component failed; restarting"]
    assert (rsync.get(f"{shards[2]}fence") or b"").isdigit()  # repaired by the new leader
    env = {**FAST_ENV, "WORKER_REDIS_URL": redis_url, "WORKER_KEY_PREFIX": prefix,
           "WORKER_APP": "harness.apps.ledger:app", "WORKER_QUEUE_SHARDS": "3"}  # fmt: skip
    out = cli("doctor", "--json", env=env)
    assert "shards" in json.loads(out.stdout)["failed"], out.stdout


def test_a_lock_deleted_again_and_again_cannot_make_leadership_flap(
    spawn: Spawn, rsync: redis_sync.Redis
) -> None:
    """Campaigns back off after a leadership shorter than a lease TTL (0.5 s, doubling): a
    neighbour deleting the lock every 20 ms for 6 s costs a few acquisitions, not one per
    renew interval (about 12 before)."""
    prefix = spawn.prefix  # type: ignore[attr-defined]
    leader = spawn("leader", name="leader")
    wait_until(lambda: lock(rsync, prefix), what="the lease")
    wait_until(lambda: renewed_ms(rsync, prefix), what="a renew")
    before = len(events(leader, "leadership acquired"))
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        rsync.delete(f"{prefix}leader")
        time.sleep(0.02)
    acquired = len(events(leader, "leadership acquired")) - before
    assert 1 <= acquired <= 6, acquired
    assert events(leader, "campaigning again after a short leadership"), leader.log()
    wait_until(lambda: lock(rsync, prefix), what="it leads again once left alone")
