"""App identity (never two consumer sets on one queue). Every heartbeat record
names its app; a process refuses to start (exit 2, one line) when live instances of another
app use its key prefix; ``status`` shows the apps."""

from __future__ import annotations

from typing import Any

import pytest

from harness import FAST_ENV, CliRun, Spawn, wait_until
from tests.cli.test_cli import assert_config_error
from tests.duties.test_registry import View
from worker.app import App
from worker.core.clock import FakeClock
from worker.core.errors import ConfigError
from worker.duties.registry import Heartbeat
from worker.ops import status
from worker.runtime.preflight import check_app_identity
from worker.storage import keys as K
from worker.storage.store import Store

KEYS = K.Keys("t:")
NOW_S = 1_700_000_000.0


async def register(r: Any, instance: str, app: str | None, role: str = "consumer") -> Heartbeat:
    hb = Heartbeat(
        Store(r, KEYS), View(), FakeClock(NOW_S), instance_id=instance, instance_name=instance,
        role=role, interval_s=2, app=app,
    )  # fmt: skip
    await hb.tick()
    return hb


async def test_the_heartbeat_record_names_the_app(r: Any) -> None:
    await register(r, "i-1", "billing")
    assert await Store(r, KEYS).live_apps() == {"billing": 1}


async def test_live_instances_of_another_app_refuse_the_prefix(r: Any) -> None:
    store = Store(r, KEYS)
    await check_app_identity(store, "shop")  # nobody there
    await register(r, "b-1", "billing")
    await register(r, "b-2", "billing", role="leader")
    await register(r, "old-1", None)  # an older version's record: no app name, not counted
    await check_app_identity(store, "billing")  # ... the same app is fine
    with pytest.raises(ConfigError) as err:
        await check_app_identity(store, "shop")
    assert str(err.value) == (
        "WORKER_KEY_PREFIX 't:' is in use by live instances of app 'billing' (2); this is app "
        "'shop' — give each app its own WORKER_KEY_PREFIX"
    )
    await register(r, "s-1", "shop")  # (a race: two apps started at the same instant)
    with pytest.raises(ConfigError, match=r"of app 'billing' \(2\), app 'shop' \(1\); this is"):
        await check_app_identity(store, "mail")


async def test_only_live_instances_count(r: Any) -> None:
    store = Store(r, KEYS)
    hb = await register(r, "b-1", "billing")
    await r.delete(KEYS.instance("b-1"))  # its record expired: a dead process
    await check_app_identity(store, "shop")
    await hb.tick()
    await hb.deregister()  # a clean exit
    await check_app_identity(store, "shop")


async def test_status_shows_the_apps(r: Any) -> None:
    await register(r, "b-1", "billing")
    data = await status.collect(r, KEYS, App("billing"), FakeClock(NOW_S))
    assert data["apps"] == {"billing": 1} and data["prefix"] == "t:"
    text = status.render(data)
    assert "app: billing (1 live instance) on key prefix 't:'" in text.splitlines()
    header = next(ln for ln in text.splitlines() if ln.startswith("INSTANCE"))
    assert header.split()[:3] == ["INSTANCE", "APP", "ROLE"]
    assert next(ln for ln in text.splitlines() if ln.startswith("b-1 ")).split()[1] == "billing"

    await register(r, "s-1", "shop")
    text = status.render(await status.collect(r, KEYS, App("billing"), FakeClock(NOW_S)))
    assert (
        "apps: billing (1), shop (1) SHARE key prefix 't:' (one queue, one leader lock): give "
        "each app its own WORKER_KEY_PREFIX"
    ) in text.splitlines()


@pytest.mark.slow
def test_a_second_app_on_a_live_prefix_exits_2(
    spawn: Spawn, cli: CliRun, redis_url: str, rsync: Any
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    ledger = spawn("consumer", name="ledger-1", app="harness.apps.ledger:app")
    wait_until(lambda: rsync.keys(f"{prefix}instance:*"), timeout=30, what="ledger registered")

    env = {**FAST_ENV, "WORKER_REDIS_URL": redis_url, "WORKER_KEY_PREFIX": prefix}
    refused = cli("run", "--role", "consumer", "--app", "harness.apps.minimal:app", env=env)
    line = assert_config_error(refused)
    assert line == (
        f"worker: error: WORKER_KEY_PREFIX '{prefix}' is in use by live instances of app "
        "'ledger' (1); this is app 'minimal' — give each app its own WORKER_KEY_PREFIX"
    )
    assert ledger.alive()

    # with its own prefix, the other app runs beside it on the same Redis
    own = spawn("consumer", name="minimal-1", app="harness.apps.minimal:app",
                env={"WORKER_KEY_PREFIX": "minimal:"})  # fmt: skip
    wait_until(lambda: rsync.keys("minimal:instance:*"), timeout=30, what="minimal registered")
    assert own.alive() and ledger.alive()

    shown = cli("status", "--json", "--app", "harness.apps.ledger:app", env=env)
    assert shown.returncode == 0, shown.stderr
    assert '"apps": {\n    "ledger": 1\n  }' in shown.stdout

    # once the first app is gone (a clean exit deregisters), the prefix is free again
    assert ledger.terminate() == 0
    later = spawn("consumer", name="minimal-2", app="harness.apps.minimal:app")
    wait_until(lambda: rsync.keys(f"{prefix}instance:*"), timeout=30, what="minimal on prefix")
    assert later.alive(), later.log()
    assert own.terminate() == 0 and later.terminate() == 0
