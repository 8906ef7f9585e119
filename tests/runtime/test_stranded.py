"""A worker on a quickstart's embedded Redis, busy with jobs when that server goes away with
the worker that started it, exits with its one error line and says nothing else (before: a
line per failed job and component, 70 to 2,500 lines ahead of it in outside runs)."""

from __future__ import annotations

import re

import pytest
import redis as redis_sync

from harness import Spawn, client_call, wait_until

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]

APP = "harness.apps.aborts:app"
GONE = "the embedded Redis this worker used is gone"


def test_a_busy_stranded_worker_says_one_line_and_exits(spawn: Spawn) -> None:
    # the owner of the embedded server runs no job: the second one has them all
    owner = spawn("all", name="owner", app=APP,
                  env={"WORKER_REDIS_URL": None, "WORKER_QUEUES": "elsewhere"})  # fmt: skip
    found = wait_until(lambda: re.search(r"(unix://\S+/redis\.sock)", owner.log()), 60,
                       what="the banner's URL")  # fmt: skip
    url = found.group(1)
    second = spawn("consumer", name="second", app=APP,
                   env={"WORKER_REDIS_URL": url, "WORKER_CONCURRENCY": "50"})  # fmt: skip
    prefix = spawn.prefix  # type: ignore[attr-defined]
    client_call(url, prefix, "enqueue_many", [("in_redis", (60,))] * 40)
    r = redis_sync.Redis.from_url(url)
    try:
        wait_until(lambda: r.hlen(f"{prefix}aborts:started") >= 40, 60,
                   what="the jobs to run on second")  # fmt: skip
    finally:
        r.close()
    before = len(second.log().splitlines())
    assert owner.terminate() == 0  # its server and socket go with it
    code = second.proc.wait(timeout=30)
    after = second.log().splitlines()[before:]
    assert code == 1, "\n".join(after)
    assert sum(GONE in line for line in after) == 1, "\n".join(after)
    assert len(after) <= 3, f"{len(after)} lines after the server went away:\n" + "\n".join(
        after[:40]
    )
