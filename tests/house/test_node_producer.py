"""A producer in another language follows docs/protocol.md alone: the Node.js
script ``tests/node/producer.js`` (ioredis and @msgpack/msgpack from ``tests/node/package.json``,
installed by ``.ci/run`` with ``npm ci``), which the page shows whole, enqueues a plain job, a
job with a unique key twice and a job due in 2 s, as a Redis user holding only the page's
producer ACL rules; a real ``--role all`` worker runs each job once and the deferred one not
before its due time (the Redis server's clock, read by the task).

Without ``node`` or the installed packages the test is skipped on a developer's machine, and
fails in CI (``CI`` set), as the browser tests do."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis as redis_sync

from harness import Spawn, wait_until
from harness.docpages import ROOT, page, section
from worker.consumer.envelope import validate
from worker.core.serializer import json_loads
from worker.storage.keys import Keys

pytestmark = pytest.mark.timeout(60)

NODE_DIR = ROOT / "tests" / "node"
APP = "harness.apps.polyglot:app"


def node() -> str:
    """The ``node`` binary, with the producer's packages installed beside it."""
    found = shutil.which("node")
    why = ""
    if found is None:
        why = "no node on PATH (Debian: apt-get install nodejs npm)"
    elif not (NODE_DIR / "node_modules" / "ioredis").is_dir():
        why = "the producer's packages are not installed (cd tests/node && npm ci)"
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Node producer test: {why}")
        pytest.skip(why)
    assert found is not None
    return found


def producer_acl(prefix: str) -> list[str]:
    """The page's producer ACL rules for ``prefix`` (``ACL SETUSER`` arguments after the name)."""
    text = section("protocol", "What the ACL rules require of a producer")
    line = next(x for x in text.splitlines() if x.startswith("ACL SETUSER shop-producer"))
    rules = line.split()[3:]
    return [r.replace("shop:", prefix).replace(">PW", ">pw-producer") for r in rules]


def test_the_protocol_page_shows_the_producer_the_test_runs() -> None:
    text = page("protocol")
    assert '--8<-- "tests/node/producer.js"' in text
    # the page's plain commands and script are the ones the producer sends
    script = (NODE_DIR / "producer.js").read_text()
    lua = re.search(r"```lua\n(.*?)```", text, re.S)
    assert lua is not None and lua.group(1).strip() in script


def test_the_pages_json_record_is_one_a_consumer_accepts() -> None:
    text = section("protocol", "The job record")
    example = re.search(r"`(\{\"t\":.*?\})`", text)
    assert example is not None
    record = json_loads(example.group(1).encode())
    assert validate(record) == ("note", ("plain",), {}, None, 1764640800000)


def test_the_pages_plain_commands_are_the_ones_the_producer_sends_in_that_order() -> None:
    block = re.search(
        r"```\n(TIME.*?)```", section("protocol", "Enqueueing: what a producer must do"), re.S
    )
    assert block is not None
    verbs = [line.split()[0].lower() for line in block.group(1).splitlines() if line.strip()]
    assert verbs == ["time", "multi", "set", "zadd", "publish", "exec"]
    assert " NX\n" in block.group(1) and "PX <86400000 + delay ms>" in block.group(1)
    script = (NODE_DIR / "producer.js").read_text()
    at = [script.index(f".{verb}(") for verb in verbs]
    assert at == sorted(at), at


def test_a_node_producer_following_the_page_enqueues_jobs_a_worker_runs_once(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    binary = node()
    prefix = spawn.prefix  # type: ignore[attr-defined]
    rsync.execute_command("ACL", "SETUSER", "producer", "reset", *producer_acl(prefix))
    parts = urlsplit(redis_url)
    as_producer = urlunsplit(parts._replace(netloc=f"producer:pw-producer@{parts.netloc}"))
    producer = redis_sync.Redis.from_url(as_producer)
    for key in (f"arq:job:other:{prefix}x", f"arq:in-progress:{prefix}x", f"{prefix}leader"):
        with pytest.raises(redis_sync.exceptions.NoPermissionError):
            producer.set(key, "x")  # the page's rules: the app's job records and queues only
    producer.close()
    spawn("all", name="a1", app=APP)
    wait_until(lambda: rsync.exists(f"{prefix}leader"), 30, what="a leader")

    out = subprocess.run(
        [binary, str(NODE_DIR / "producer.js")],
        env={**os.environ, "REDIS_URL": as_producer, "WORKER_KEY_PREFIX": prefix},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    sent = json.loads(out.stdout)
    assert sent["first"]["written"] is True and sent["again"]["written"] is False, sent
    assert sent["first"]["id"] == f"{prefix}unique:once"
    for job in ("plain", "later"):
        assert re.fullmatch(re.escape(prefix) + "[0-9a-f]{32}", sent[job]["id"]), sent

    notes, started = f"{prefix}ledger:notes", f"{prefix}ledger:started"
    wait_until(lambda: rsync.hexists(notes, "deferred"), 15, what="the deferred job ran")
    wait_until(lambda: rsync.hlen(notes) == 3, 5, what="every job ran")
    runs = {k.decode(): int(v) for k, v in rsync.hgetall(notes).items()}
    assert runs == {"plain": 1, "unique": 1, "deferred": 1}, runs
    assert int(rsync.hget(started, "deferred") or 0) >= sent["later"]["due"]
    # each ran as the page says: a result record under arq's key, the queue empty
    for job in ("plain", "first", "later"):
        assert rsync.exists(f"arq:result:{sent[job]['id']}")
        assert not rsync.exists(f"arq:job:{sent[job]['id']}")
    assert rsync.zcard(Keys(prefix).queue) == 0
    dead = rsync.zcard(f"{prefix}dead")
    assert dead == 0, "a job of the Node producer was set aside"


def test_ci_installs_the_node_packages_from_the_lock_file() -> None:
    run = (ROOT / ".ci" / "run").read_text()
    assert "npm ci" in run and "tests/node" in run
    assert (NODE_DIR / "package-lock.json").is_file()
    assert Path(NODE_DIR / "package.json").is_file()
