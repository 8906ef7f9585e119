"""The App registry: registration, validation, load_app errors, stable poller sharding."""

from __future__ import annotations

import datetime as dt
import sys
import uuid
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from worker.app import App, PollerDef, load_app
from worker.core.errors import ConfigError
from worker.core.schedule import Cron, Every


def one_line(info: pytest.ExceptionInfo[ConfigError]) -> str:
    msg = str(info.value)
    assert msg and "\n" not in msg, repr(msg)
    return msg


async def job(ctx: Any) -> None:
    return None


# ---------------------------------------------------------------------------------------------
# registration
# ---------------------------------------------------------------------------------------------


def test_register_each_kind() -> None:
    app = App("shop")

    @app.task
    async def plain(ctx: Any) -> None: ...

    @app.task(name="renamed", timeout_s=3, max_tries=2, keep_result_s=9)
    async def with_options(ctx: Any, x: int) -> int:
        return x

    @app.periodic(cron="0 9 * * *", tz="Asia/Shanghai", catch_up="latest", catch_up_limit=3)
    async def daily(ctx: Any) -> None: ...

    @app.periodic(every=dt.timedelta(seconds=10), name="tenner", timeout_s=5)
    async def every10(ctx: Any) -> None: ...

    cards = app.poller("cards", task="plain", shards=4, batch_size=10, interval_s=0.5)

    @app.initializer(version=2, poller="cards")  # type: ignore[arg-type]
    async def load(ctx: Any, cursor: str | None) -> AsyncIterator[Any]:
        yield "c", {"x": 1.0}

    @app.service()
    async def imap(ctx: Any, stop: Any) -> None: ...

    @app.service(cardinality="per_process", name="local-cache")
    async def cache(ctx: Any, stop: Any) -> None: ...

    @app.on_startup
    async def up(ctx: Any) -> None: ...

    @app.on_shutdown
    async def down(ctx: Any) -> None: ...

    # decorators return the function unchanged
    assert plain.__name__ == "plain" and with_options.__name__ == "with_options"

    assert set(app.tasks) == {"plain", "renamed"}
    t = app.tasks["renamed"]
    assert (t.fn, t.timeout_s, t.max_tries, t.keep_result_s) == (with_options, 3, 2, 9)
    assert app.tasks["plain"].timeout_s is None

    d = app.periodics["daily"]
    assert isinstance(d.schedule, Cron) and d.schedule.tz_name == "Asia/Shanghai"
    assert (d.catch_up, d.catch_up_limit, d.fn) == ("latest", 3, daily)
    e = app.periodics["tenner"]
    assert e.schedule == Every(10_000) and e.catch_up == "all" and e.timeout_s == 5

    assert app.pollers["cards"] is cards
    assert (cards.task, cards.shards, cards.batch_size, cards.interval_s) == ("plain", 4, 10, 0.5)

    i = app.initializers["load"]
    assert (i.version, i.poller, i.fn) == ("2", "cards", load)  # version is a string

    assert app.services["imap"].cardinality == "singleton"
    assert app.services["local-cache"].cardinality == "per_process"
    assert app.startup_hooks == [up] and app.shutdown_hooks == [down]
    app.validate()


def test_duplicate_names() -> None:
    app = App()
    app.task(job, name="j")
    with pytest.raises(ConfigError, match="twice") as info:
        app.task(job, name="j")
    one_line(info)
    # tasks and periodic jobs share one namespace (both are arq function names)
    with pytest.raises(ConfigError, match="twice"):
        app.periodic(every=60, name="j")(job)
    app.periodic(every=60, name="p")(job)
    with pytest.raises(ConfigError, match="twice"):
        app.task(job, name="p")

    app.poller("pp", task="j")
    with pytest.raises(ConfigError, match="twice"):
        app.poller("pp", task="j")

    async def gen(ctx: Any, cursor: Any) -> AsyncIterator[Any]:
        yield "c", None

    app.initializer(version="1", name="i")(gen)
    with pytest.raises(ConfigError, match="twice"):
        app.initializer(version="2", name="i")(gen)

    app.service(name="s")(job)
    with pytest.raises(ConfigError, match="twice"):
        app.service(name="s")(job)


def sync_fn(ctx: Any) -> None:
    return None


def test_plain_def_jobs_are_accepted_and_other_sync_callables_rejected() -> None:
    app = App()
    # tasks and periodic jobs: a plain def runs in the sync threads (tests/face/test_sync.py)
    app.task(sync_fn)
    app.periodic(every=60, name="sync_tick")(sync_fn)
    assert set(app.tasks) == {"sync_fn"} and set(app.periodics) == {"sync_tick"}

    def gen(ctx: Any) -> Iterator[Any]:
        yield 1

    for register in (app.task, app.periodic(every=60)):
        with pytest.raises(ConfigError, match="is a generator") as info:
            register(gen)
        assert "gen" in one_line(info)
    with pytest.raises(ConfigError, match="async function") as info:
        app.service()(sync_fn)  # services stay async
    assert "sync_fn" in one_line(info)
    assert not app.services


def test_initializer_must_be_async_generator() -> None:
    app = App()

    async def coroutine(ctx: Any, cursor: Any) -> None: ...

    def sync_gen(ctx: Any, cursor: Any) -> Iterator[Any]:
        yield "c", None

    for fn in (coroutine, sync_gen, sync_fn):
        with pytest.raises(ConfigError, match="async generator") as info:
            app.initializer(version="1")(fn)
        one_line(info)
    assert not app.initializers


@pytest.mark.parametrize(
    "kwargs",
    [
        {"shards": 0},
        {"shards": 1025},
        {"batch_size": 0},
        {"interval_s": 0},
        {"interval_s": -1},
        {"busy_defer_s": 0},
    ],
)
def test_bad_poller_args(kwargs: dict[str, Any]) -> None:
    app = App()
    with pytest.raises(ConfigError, match="'cards'") as info:
        app.poller("cards", task="t", **kwargs)
    one_line(info)
    assert not app.pollers


@pytest.mark.parametrize("name", ["1abc", "a b", "a/b", "x:y", "-x"])
def test_bad_names(name: str) -> None:
    app = App()
    with pytest.raises(ConfigError, match="name"):
        app.task(job, name=name)
    with pytest.raises(ConfigError, match="name"):
        app.poller(name, task="t")


def test_empty_poller_name() -> None:
    with pytest.raises(ConfigError, match="name"):
        App().poller("", task="t")


def test_bad_periodic_and_service_options() -> None:
    app = App()
    with pytest.raises(ConfigError, match="catch_up"):
        app.periodic(every=60, catch_up="some")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="catch_up_limit"):
        app.periodic(every=60, catch_up_limit=0)
    with pytest.raises(ConfigError, match="exactly one"):
        app.periodic()
    with pytest.raises(ConfigError, match="cron"):
        app.periodic(cron="not a cron")
    with pytest.raises(ConfigError, match="cardinality"):
        app.service(cardinality="everywhere")  # type: ignore[arg-type]


def test_validate_cross_checks() -> None:
    app = App()
    app.poller("cards", task="missing")
    with pytest.raises(ConfigError, match="'missing' is not registered") as info:
        app.validate()
    one_line(info)
    app.task(job, name="missing")
    app.validate()

    async def gen(ctx: Any, cursor: Any) -> AsyncIterator[Any]:
        yield "c", None

    app.initializer(version="1", poller="nope")(gen)
    with pytest.raises(ConfigError, match="'nope' is not declared"):
        app.validate()


# ---------------------------------------------------------------------------------------------
# load_app
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def module_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Write a throwaway module and return its unique import name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    created: list[str] = []

    def write(source: str) -> str:
        name = f"wapp_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{name}.py").write_text(source)
        created.append(name)
        return name

    yield write
    for name in created:
        sys.modules.pop(name, None)


APP_SRC = """
from worker import App
app = App("mine")

@app.task
async def hello(ctx): ...

def factory():
    return app

def not_an_app():
    return 42

number = 7
"""


def test_load_app_ok(module_dir: Any) -> None:
    mod = module_dir(APP_SRC)
    app = load_app(f"{mod}:app")
    assert isinstance(app, App) and app.name == "mine" and "hello" in app.tasks
    assert load_app(f"{mod}:factory") is app  # a callable returning an App is called
    assert load_app("harness.apps.ledger:app").name == "ledger"


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("no_such_module_xyz:app", "cannot import module 'no_such_module_xyz'"),
        ("worker.no_such_sub:app", "cannot import module 'worker.no_such_sub'"),
        ("worker.demo:nope", "has no attribute 'nope'"),
        ("worker.settings:ROLES", "is a tuple, not a worker.App"),
        ("worker.settings:default_instance_name", "returned a str, not a worker.App"),
        ("no-colon", "package.module:attribute"),
        (":app", "package.module:attribute"),
        ("worker.demo:", "package.module:attribute"),
    ],
)
def test_load_app_errors(spec: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_app(spec)
    msg = one_line(info)
    assert msg.startswith("WORKER_APP")
    assert fragment in msg


def test_load_app_wrong_types_in_user_module(module_dir: Any) -> None:
    mod = module_dir(APP_SRC)
    with pytest.raises(ConfigError, match=r"is a int, not a worker\.App") as info:
        load_app(f"{mod}:number")
    one_line(info)
    with pytest.raises(ConfigError, match="is a function that returned a int"):
        load_app(f"{mod}:not_an_app")


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("import no_such_dependency_xyz\n", "no_such_dependency_xyz"),
        ("raise RuntimeError('database down')\n", "RuntimeError: database down"),
        ("raise RuntimeError('line one\\nline two')\n", "RuntimeError: line one"),
        ("def broken(:\n", "SyntaxError"),
        (
            "from worker import App\napp = App()\napp.poller('p', task='ghost')\n",
            "'ghost' is not registered",
        ),
    ],
)
def test_load_app_import_failures_are_one_line(module_dir: Any, source: str, fragment: str) -> None:
    mod = module_dir(source)
    with pytest.raises(ConfigError) as info:
        load_app(f"{mod}:app")
    assert fragment in one_line(info)


# ---------------------------------------------------------------------------------------------
# PollerDef.shard_of
# ---------------------------------------------------------------------------------------------


def test_shard_of_is_stable_crc32() -> None:
    p = PollerDef("cards", task="t", shards=4)
    # pinned values: every process (any PYTHONHASHSEED, any version) must agree
    assert [p.shard_of(f"card-{i}") for i in range(8)] == [2, 0, 2, 0, 3, 1, 3, 1]
    assert zlib.crc32(b"card-1") == 1693242260 and p.shard_of("card-1") == 1693242260 % 4
    assert PollerDef("x", task="t", shards=1).shard_of("anything") == 0
    # utf-8, not the platform's hash()
    assert p.shard_of("卡-1") == 2 == zlib.crc32("卡-1".encode()) % 4


def test_shard_of_spreads_items() -> None:
    p = PollerDef("cards", task="t", shards=8)
    counts = [0] * 8
    for i in range(8000):
        counts[p.shard_of(f"card-{i}")] += 1
    assert min(counts) > 800  # roughly even (1000 each)
