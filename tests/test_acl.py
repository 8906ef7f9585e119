"""The minimal Redis ACL documented in the README is enough to run a real worker."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import redis as redis_sync

from tests.conftest import CliRun, Spawn, wait_until
from tests.test_operations import ledger

pytestmark = pytest.mark.timeout(120)

USER = "worker-minimal"
PASSWORD = "Acl-minimal-pw-3b7d"


def minimal_acl(prefix: str) -> list[str]:
    """README, "Redis operating contract": the rules with ``worker:`` replaced by ``prefix``."""
    return [
        f"~{prefix}*",
        "~arq:*",
        f"&{prefix}*",
        "-@all",
        "+@read",
        "+@write",
        "+@scripting",
        "+@pubsub",
        "+@transaction",
        "+@connection",
        "+info",
        "+time",
    ]


@pytest.fixture
def minimal_user(rsync: redis_sync.Redis, spawn: Spawn) -> Iterator[str]:
    """A URL for an ACL user limited to the documented rules, for the spawn fixture's prefix."""
    prefix = spawn.prefix  # type: ignore[attr-defined]
    rules = minimal_acl(prefix)
    rsync.execute_command("ACL", "SETUSER", USER, "reset", "on", f">{PASSWORD}", *rules)
    kw = rsync.connection_pool.connection_kwargs
    try:
        yield f"redis://{USER}:{PASSWORD}@{kw['host']}:{kw['port']}/0"
    finally:
        rsync.execute_command("ACL", "DELUSER", USER)


def test_the_readme_documents_these_rules() -> None:
    from tests.test_docs import README

    documented = " ".join(minimal_acl("worker:"))
    assert documented in README, documented


@pytest.mark.slow
def test_worker_runs_with_the_minimal_acl(
    spawn: Spawn, rsync: redis_sync.Redis, cli: CliRun, minimal_user: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    proc = spawn("all", name="a1", env={"WORKER_REDIS_URL": minimal_user})
    wait_until(lambda: len(ledger(rsync, prefix, "ticks")) >= 3, 30, what="three ticks")
    time.sleep(3)  # a few more renewals, heartbeats, reaper rounds and polls
    assert proc.alive(), proc.log()
    ticks = ledger(rsync, prefix, "ticks")
    assert len(ticks) >= 5 and set(ticks.values()) == {1}, ticks

    log = proc.log()
    assert "NOPERM" not in log and "No permissions" not in log, log
    assert not [e for e in proc.events() if e.get("level") in ("error", "critical")], log
    # CONFIG is not granted: the preflight read the policy from INFO, silently
    assert "cannot read Redis maxmemory-policy" not in log

    st = cli(
        "status",
        "--json",
        env={
            "WORKER_REDIS_URL": minimal_user,
            "WORKER_KEY_PREFIX": prefix,
            "WORKER_APP": "tests.apps.ledger:app",
        },
    )
    assert st.returncode == 0, st.stderr
    data = json.loads(st.stdout)
    assert data["leader"]["held"] and data["redis"]["maxmemory_policy"] == "noeviction"
    assert proc.terminate() == 0
    assert "NOPERM" not in proc.log()
