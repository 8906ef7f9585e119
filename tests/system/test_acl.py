"""The Redis ACLs the README documents: the minimal user runs everything and nothing more, and
one user per app keeps two apps on one Redis out of each other's keys.

- ``ACL DRYRUN`` with exactly the README's rules refuses every server-wide destructive or
  freezing command (FLUSHALL, CLIENT PAUSE, SCRIPT FLUSH, FUNCTION, ...) and allows what the
  framework sends;
- a worker, ``status``, ``doctor`` and the console run under that user without one refusal;
- two apps, each under its own user: every attempt by one to read, change or block the other's
  keys (queue, job records, in-progress markers, results, retries, aborts, channels) is
  refused, and the other's jobs run with their original arguments;
- stray in-progress markers at the head of a queue do not stall it.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis as redis_sync

from harness import CliRun, Spawn, ledger, wait_until
from harness.apps.ledger import app as ledger_app
from harness.ports import free_port
from worker.client import Client
from worker.storage import keys as K

pytestmark = pytest.mark.timeout(120)

USER = "worker-minimal"
PASSWORD = "Acl-minimal-pw-3b7d"
TOKEN = "acl-console-token-0123456789abcdef"


def minimal_acl(prefix: str) -> list[str]:
    """docs/guarantees.md, "Redis operating contract": rules with ``worker:`` as ``prefix``."""
    return [
        f"~{prefix}*",
        f"~arq:job:{prefix}*",
        f"~arq:in-progress:{prefix}*",
        f"~arq:result:{prefix}*",
        f"~arq:retry:{prefix}*",
        f"&{prefix}*",
        "-@all",
        "+@read",
        "+@write",
        "+@scripting",
        "+@pubsub",
        "+@transaction",
        "+@connection",
        "-@dangerous",
        "+info",
        "+time",
        "-script|flush",
        "-script|kill",
        "-script|debug",
        "-function",
        "-client",
        "+client|setname",
        "+client|setinfo",
    ]


def acl_user(rsync: redis_sync.Redis, user: str, password: str, prefix: str) -> str:
    """Create ``user`` with the README's rules for ``prefix``; its URL."""
    rules = minimal_acl(prefix)
    rsync.execute_command("ACL", "SETUSER", user, "reset", "on", f">{password}", *rules)
    kw = rsync.connection_pool.connection_kwargs
    return f"redis://{user}:{password}@{kw['host']}:{kw['port']}/0"


@pytest.fixture
def minimal_user(rsync: redis_sync.Redis, spawn: Spawn) -> Iterator[str]:
    """A URL for an ACL user limited to the documented rules, for the spawn fixture's prefix."""
    yield acl_user(rsync, USER, PASSWORD, spawn.prefix)  # type: ignore[attr-defined]
    rsync.execute_command("ACL", "DELUSER", USER)


def test_the_readme_documents_these_rules() -> None:
    from harness.docpages import page

    guarantees = page("guarantees")
    documented = " ".join(minimal_acl("worker:"))
    assert f"ACL SETUSER worker on >PASSWORD {documented}\n" in guarantees, documented
    for app in ("shop", "billing"):
        assert " ".join(minimal_acl(f"{app}:")) in guarantees, app
    assert " ".join(minimal_acl("{shop[}#]")) in guarantees  # with queue shards


#: Server-wide commands one app's user must not run: each wipes, freezes, reconfigures or
#: spies on every app of the server (and the rest of @dangerous).
DENIED = [
    ["FLUSHALL"],
    ["FLUSHDB"],
    ["SWAPDB", "0", "1"],
    ["CLIENT", "KILL", "ID", "1"],
    ["CLIENT", "PAUSE", "1000"],
    ["CLIENT", "UNPAUSE"],
    ["CLIENT", "LIST"],
    ["CLIENT", "NO-EVICT", "on"],
    ["CLIENT", "UNBLOCK", "1"],
    ["CLIENT", "TRACKING", "on", "BCAST"],  # every app's changed key names, live
    ["CLIENT", "REPLY", "OFF"],
    ["CLIENT", "CACHING", "yes"],
    ["KEYS", "*"],
    ["SCRIPT", "FLUSH"],
    ["SCRIPT", "KILL"],
    ["SCRIPT", "DEBUG", "SYNC"],
    ["FUNCTION", "LOAD", "#!lua name=x\nredis.register_function('f', function() end)"],
    ["FUNCTION", "FLUSH"],
    ["FUNCTION", "DELETE", "x"],
    ["FUNCTION", "RESTORE", "x"],
    ["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"],
    ["DEBUG", "SLEEP", "1"],
    ["SHUTDOWN"],
    ["MONITOR"],
    ["SAVE"],
    ["BGSAVE"],
    ["BGREWRITEAOF"],
    ["REPLICAOF", "127.0.0.1", "1"],
    ["FAILOVER"],
    ["ACL", "SETUSER", "x"],
    ["SLOWLOG", "GET"],
    ["LATENCY", "RESET"],
    ["MIGRATE", "127.0.0.1", "1", "worker:x", "0", "1"],
    ["SORT", "worker:x"],
    ["RESTORE", "worker:x", "0", "x"],
]

#: What the framework sends (a sample of each kind), with the same user: allowed.
ALLOWED = [
    ["GET", "worker:leader"],
    ["SET", "arq:job:worker:0123", "x"],
    ["SET", "arq:in-progress:worker:0123", "x", "PX", "1000"],
    ["SET", "arq:result:worker:0123", "x"],
    ["INCR", "arq:retry:worker:0123"],
    ["ZADD", "worker:abort", "1", "worker:0123"],
    ["EVALSHA", "0" * 40, "1", "worker:leader"],
    ["SCRIPT", "LOAD", "return 1"],
    ["PUBLISH", "worker:wake", "1"],
    ["INFO", "memory"],
    ["TIME"],
    ["SCAN", "0", "MATCH", "worker:holds:*"],
    ["DBSIZE"],
    ["WAIT", "0", "1"],
    ["CLIENT", "SETNAME", "w"],
    ["CLIENT", "SETINFO", "LIB-NAME", "redis-py"],
    ["MULTI"],
]


def test_acl_dryrun_denies_every_server_wide_destructive_command(
    rsync: redis_sync.Redis,
) -> None:
    acl_user(rsync, USER, PASSWORD, "worker:")
    try:

        def dryrun(cmd: list[str]) -> str:
            try:
                out = rsync.execute_command("ACL", "DRYRUN", USER, *cmd)
            except redis_sync.ResponseError as exc:  # an unknown subcommand, a bad arity
                return f"error: {exc}"
            return out.decode() if isinstance(out, bytes) else str(out)

        allowed = {" ".join(c[:2]): dryrun(c) for c in DENIED}
        assert not {c: v for c, v in allowed.items() if "no permissions" not in v.lower()}
        refused = {" ".join(c[:2]): dryrun(c) for c in ALLOWED}
        assert {c: v for c, v in refused.items() if v != "OK"} == {}
        # other apps' keys and channels, arq's shared abort set included
        for cmd in (
            ["GET", "arq:job:billing:0123"],
            ["GET", "arq:job:0123"],
            ["ZADD", "arq:abort", "1", "billing:0123"],
            ["SET", "arq:in-progress:billing:0123", "x"],
            ["PUBLISH", "billing:wake", "1"],
            ["ZRANGE", "billing:queue", "0", "-1"],
        ):
            assert "no permissions" in dryrun(cmd).lower(), cmd
    finally:
        rsync.execute_command("ACL", "DELUSER", USER)


def _get(url: str) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


@pytest.mark.slow
def test_worker_status_doctor_and_console_run_with_the_minimal_acl(
    spawn: Spawn, rsync: redis_sync.Redis, cli: CliRun, minimal_user: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    proc = spawn("all", name="a1", env={"WORKER_REDIS_URL": minimal_user})
    port = free_port()
    web = spawn(
        "all",
        name="web",
        command="web",
        env={
            "WORKER_REDIS_URL": minimal_user,
            "WORKER_WEB_TOKEN": TOKEN,
            "WORKER_WEB_PORT": str(port),
        },
    )
    wait_until(lambda: len(ledger(rsync, prefix, "ticks")) >= 3, 30, what="three ticks")
    jid = asyncio.run(_enqueue(minimal_user, prefix, "record", "under-acl"))
    assert jid.startswith(prefix)
    wait_until(lambda: ledger(rsync, prefix, "records") == {"under-acl": 1}, 30, what="the job")
    time.sleep(3)  # a few more renewals, heartbeats, reaper rounds and polls
    assert proc.alive(), proc.log()
    ticks = ledger(rsync, prefix, "ticks")
    assert len(ticks) >= 5 and set(ticks.values()) == {1}, ticks

    env = {
        "WORKER_REDIS_URL": minimal_user,
        "WORKER_KEY_PREFIX": prefix,
        "WORKER_APP": "harness.apps.ledger:app",
    }
    st = cli("status", "--json", env=env)
    assert st.returncode == 0, st.stderr
    data = json.loads(st.stdout)
    assert data["leader"]["held"] and data["redis"]["maxmemory_policy"] == "noeviction"

    doc = cli("doctor", "--json", env=env)
    report = json.loads(doc.stdout)
    # the same verdicts as under the default user: no check is blind for want of a permission
    admin = cli("doctor", "--json", env={**env, "WORKER_REDIS_URL": _plain(rsync)})
    verdicts = {c["name"]: c["status"] for c in report["checks"]}
    assert verdicts == {c["name"]: c["status"] for c in json.loads(admin.stdout)["checks"]}
    assert doc.returncode == admin.returncode, doc.stdout

    wait_until(lambda: "console listening" in web.log(), 30, what="the console")
    overview = _get(f"http://127.0.0.1:{port}/api/overview")
    assert overview and "error" not in overview, overview
    assert "error" not in _get(f"http://127.0.0.1:{port}/api/dead?page=1&size=10")

    for p in (proc, web):
        assert p.terminate() == 0
        log = p.log()
        assert "NOPERM" not in log and "No permissions" not in log, log
        assert not [e for e in p.events() if e.get("level") in ("error", "critical")], log
        # CONFIG is not granted: the preflight read the policy from INFO, silently
        assert "cannot read Redis maxmemory-policy" not in log
    for out in (st, doc):
        assert "NOPERM" not in out.stdout + out.stderr and "No permissions" not in out.stderr


@pytest.mark.slow
def test_a_worker_whose_user_does_not_cover_its_prefix_exits_with_one_line(
    rsync: redis_sync.Redis, cli: CliRun
) -> None:
    url = acl_user(rsync, USER, PASSWORD, "shop:")
    try:
        env = {
            "WORKER_REDIS_URL": url,
            "WORKER_KEY_PREFIX": "billing:",
            "WORKER_APP": "harness.apps.ledger:app",
        }
        out = cli("run", "--role", "consumer", env=env)
    finally:
        rsync.execute_command("ACL", "DELUSER", USER)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("worker: error: WORKER_KEY_PREFIX 'billing:'") and "ACL" in last


def _plain(rsync: redis_sync.Redis) -> str:
    kw = rsync.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/0"


async def _enqueue(url: str, prefix: str, function: str, *args: Any) -> str:
    client = await Client.connect(url, app=ledger_app, key_prefix=prefix)
    try:
        jid = await client.enqueue(function, *args)
        assert jid is not None
        return jid
    finally:
        await client.close()


def _listen(r: redis_sync.Redis, channel: str) -> Any:
    p = r.pubsub()
    try:
        p.subscribe(channel)
        return p.get_message(timeout=2)
    finally:
        p.close()


def _refused(attempt: Callable[[], Any]) -> bool:
    try:
        attempt()
    except redis_sync.exceptions.NoPermissionError:
        return True
    except redis_sync.ResponseError as exc:  # a refusal inside a script
        return "no permissions" in str(exc).lower()
    return False


@pytest.mark.slow
def test_two_apps_under_their_own_users_cannot_touch_each_other(
    spawn: Spawn, rsync: redis_sync.Redis
) -> None:
    """docs/guarantees.md, "Two apps on one Redis": shop and billing, own prefixes and ACL users.
    Billing's user finds shop's queued jobs by name (SCAN shows names) but every read, rewrite
    or block of them is refused; shop's jobs then run with their original arguments."""
    tag = uuid.uuid4().hex[:6]
    shop, billing = f"shop{tag}:", f"billing{tag}:"
    shop_url = acl_user(rsync, f"shop{tag}", "pw-shop-1", shop)
    billing_url = acl_user(rsync, f"billing{tag}", "pw-billing-2", billing)
    try:
        # billing runs; shop's jobs wait in its queue (no shop consumer yet)
        bill = spawn(
            "all",
            name="billing",
            env={"WORKER_REDIS_URL": billing_url, "WORKER_KEY_PREFIX": billing},
        )
        originals = [f"bob-{n}-20" for n in range(5)]
        ids = [asyncio.run(_enqueue(shop_url, shop, "record", key)) for key in originals]
        asyncio.run(_enqueue(billing_url, billing, "record", "billing-own"))

        b = redis_sync.Redis.from_url(billing_url)
        try:
            seen = {k.decode() for k in b.scan_iter(match="arq:job:*", count=1000)}
            assert {f"arq:job:{j}" for j in ids} <= seen  # names are visible, nothing else
            evil = K.ARQ_JOB + ids[0]
            attempts: dict[str, Callable[[], Any]] = {
                "read a job record": lambda: b.get(evil),
                "rewrite a job's arguments": lambda: b.set(evil, b"mallory", keepttl=True),
                "block a job (in-progress marker)": lambda: b.set(K.ARQ_IN_PROGRESS + ids[1], 1),
                "block a future job": lambda: b.set(f"{K.ARQ_IN_PROGRESS}{shop}{'f' * 32}", 1),
                "forge a result": lambda: b.set(K.ARQ_RESULT + ids[2], b"x"),
                "exhaust its tries": lambda: b.set(K.ARQ_RETRY + ids[3], 99),
                "abort a job (arq's set)": lambda: b.zadd(K.ARQ_ABORT, {ids[4]: 1}),
                "abort a job (shop's set)": lambda: b.zadd(f"{shop}abort", {ids[4]: 1}),
                "read the queue": lambda: b.zrange(f"{shop}queue", 0, -1),
                "reorder the queue": lambda: b.zadd(f"{shop}queue", {ids[0]: 1e15}),
                "delete the leader lock": lambda: b.delete(f"{shop}leader"),
                "announce on its channels": lambda: b.publish(f"{shop}wake", 1),
                "listen on its channels": lambda: _listen(b, f"{shop}wake"),
                "a script on its keys": lambda: b.eval(
                    "return redis.call('GET', KEYS[1])", 1, evil
                ),
                "flush the server": lambda: b.flushall(),
                "pause every client": lambda: b.client_pause(1000),
                "flush the script cache": lambda: b.script_flush(),
                "follow its key names live": lambda: b.execute_command(
                    "CLIENT", "TRACKING", "on", "BCAST"
                ),
            }
            allowed = [what for what, attempt in attempts.items() if not _refused(attempt)]
            assert allowed == [], allowed
        finally:
            b.close()

        # a plain arq client's random id in shop's queue: outside shop's key patterns, so the
        # claim sets it aside instead of failing on it
        rsync.zadd(f"{shop}queue", {"plain-arq-id": 0})
        spawn("all", name="shop", env={"WORKER_REDIS_URL": shop_url, "WORKER_KEY_PREFIX": shop})
        wait_until(
            lambda: ledger(rsync, shop, "records") == dict.fromkeys(originals, 1),
            60,
            what=f"shop's jobs with their arguments: {ledger(rsync, shop, 'records')}",
        )
        wait_until(lambda: ledger(rsync, billing, "records") == {"billing-own": 1}, 30)
        wait_until(lambda: rsync.hexists(f"{shop}dead:jobs", "plain-arq-id"), 10)
        assert bill.alive(), bill.log()
        assert "NOPERM" not in bill.log() and "No permissions" not in bill.log()
    finally:
        for user in (f"shop{tag}", f"billing{tag}"):
            rsync.execute_command("ACL", "DELUSER", user)


async def _enqueue_sharded(url: str, prefix: str, keys: list[str]) -> list[str]:
    client = await Client.connect(url, app=ledger_app, key_prefix=prefix, queue_shards=3)
    try:
        ids = [await client.enqueue("record", key) for key in keys]
        assert all(ids)
        return [j for j in ids if j]
    finally:
        await client.close()


@pytest.mark.slow
def test_a_sharded_app_runs_under_the_documented_shard_patterns(
    spawn: Spawn, rsync: redis_sync.Redis, cli: CliRun
) -> None:
    """docs/guarantees.md, "Two apps on one Redis": with WORKER_QUEUE_SHARDS the rules read
    ``{shop[}#]`` where they read the prefix, covering the home ``{shop}:`` and every shard
    ``{shop#j}:``; the unsharded rules refuse a shard's keys."""
    tag = f"s{uuid.uuid4().hex[:6]}"
    prefix = f"{{{tag}}}:"
    wide = acl_user(rsync, f"{tag}-wide", "pw-wide-1", f"{{{tag}[}}#]")
    narrow = acl_user(rsync, f"{tag}-narrow", "pw-narrow-2", prefix)
    try:
        with pytest.raises(redis_sync.exceptions.NoPermissionError):
            asyncio.run(_enqueue_sharded(narrow, prefix, ["n0", "n1", "n2"]))  # one in a shard
        # a worker under the unsharded rules refuses to start, naming the shard (one line)
        refused = cli("run", "--role", "consumer", env={
            "WORKER_REDIS_URL": narrow, "WORKER_KEY_PREFIX": prefix, "WORKER_QUEUE_SHARDS": "3",
            "WORKER_APP": "harness.apps.ledger:app",
        })  # fmt: skip
        assert refused.returncode == 2, refused.stderr
        last = refused.stderr.strip().splitlines()[-1]
        assert last.startswith("worker: error: WORKER_QUEUE_SHARDS: the queue shard '{"), last
        keys = [f"k{i}" for i in range(9)]
        asyncio.run(_enqueue_sharded(wide, prefix, keys))
        env = {"WORKER_REDIS_URL": wide, "WORKER_KEY_PREFIX": prefix, "WORKER_QUEUE_SHARDS": "3"}
        proc = spawn("all", name="sharded", env=env)
        wait_until(
            lambda: (
                {k: v for k, v in ledger(rsync, prefix, "records").items() if k in keys}
                == dict.fromkeys(keys, 1)
            ),
            60,
            what="every shard's jobs run under the shard patterns",
        )
        assert "NOPERM" not in proc.log() and "No permissions" not in proc.log()
    finally:
        for user in (f"{tag}-wide", f"{tag}-narrow"):
            rsync.execute_command("ACL", "DELUSER", user)


@pytest.mark.slow
def test_stray_in_progress_markers_at_the_head_do_not_stall_the_queue(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    """25 queued jobs, in-progress markers nobody will ever remove on the 5 at the head (3
    without a TTL, 2 for a year), one consumer with concurrency 5: the claim reads past them, so
    the other 20 run; a marker without a TTL is taken over at once, a year-long one is cut to
    the marker TTL (the longest job timeout + 10 s: 12 s here), after which its job runs."""
    prefix = spawn.prefix  # type: ignore[attr-defined]
    keys = [f"job-{n:02d}" for n in range(25)]

    async def enqueue_all() -> list[str]:
        client = await Client.connect(redis_url, app=ledger_app, key_prefix=prefix)
        try:
            out = []
            for n, key in enumerate(keys):  # the first five due first
                jid = await client.enqueue("record", key, defer_by=-60 + n / 10)
                assert jid is not None
                out.append(jid)
            return out
        finally:
            await client.close()

    ids = asyncio.run(enqueue_all())
    for jid in ids[:3]:
        rsync.set(K.ARQ_IN_PROGRESS + jid, "stray")
    for jid in ids[3:5]:
        rsync.set(K.ARQ_IN_PROGRESS + jid, "stray", ex=365 * 86_400)
    proc = spawn(
        "consumer",
        name="c1",
        env={"WORKER_CONCURRENCY": "5", "WORKER_JOB_TIMEOUT_S": "2"},
    )
    wait_until(
        lambda: {*keys[:3], *keys[5:]} <= set(ledger(rsync, prefix, "records")),
        30,
        what=f"the 20 unmarked jobs and the 3 without a TTL: {ledger(rsync, prefix, 'records')}",
    )
    wait_until(
        lambda: len(ledger(rsync, prefix, "records")) == 25,
        60,
        what="the 2 year-long markers cut to 12 s, then their jobs",
    )
    assert ledger(rsync, prefix, "records") == dict.fromkeys(keys, 1)
    assert any(e.get("event", "").startswith("stale in-progress markers") for e in proc.events())
    assert proc.terminate() == 0
