"""The console in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by selenium) against real worker processes and a real
``python -m worker web``.

One run of the demo app (two ``all`` processes: a leader and a standby) and the console; the
test signs in, checks every view against Redis, clicks each action and checks its effect in
Redis, checks that actions without the token are refused and that a hostile payload shows as
text, and saves a screenshot of each main view under the test's temporary folder (and, when
``WORKER_SCREENSHOTS_DIR`` is set, there too: that is how ``docs/console/`` is made).

Without a browser the test is skipped on a developer's machine, and fails in CI (``CI`` set):
``.ci/run`` installs both packages.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_sync

from harness import Spawn, client_call, free_port, wait_until
from worker import demo
from worker.core.ids import LockValue
from worker.core.jobdefs import duty_lane

pytestmark = pytest.mark.slow

TOKEN = "browser-test-token-0123456789"
HOSTILE = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>'
DEMO_ENV = {
    "DEMO_CARDS": "60",
    "DEMO_BATCH": "25",
    "DEMO_POLL_EVERY_S": "3",
    "DEMO_REPORT_EVERY_S": "2",
}
CHROMIUM = ("chromium", "chromium-browser", "google-chrome")


def _find(names: tuple[str, ...]) -> str | None:
    for name in names:
        found = shutil.which(name) or (
            f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None
        )
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser_paths() -> tuple[str, str]:
    chromium, driver = _find(CHROMIUM), _find(("chromedriver",))
    try:
        import selenium  # noqa: F401
    except ImportError:
        chromium = None
    if chromium is None or driver is None:
        why = (
            "headless Chromium, chromedriver and selenium are needed (apt-get install chromium "
            "chromium-driver; pip install -e '.[test]')"
        )
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser tests: {why}")
        pytest.skip(why)
    return chromium, driver


@pytest.fixture
def browser(browser_paths: tuple[str, str], tmp_path: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = browser_paths[0]
    for arg in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1500,1000",
        f"--user-data-dir={tmp_path / 'chromium'}",
    ):
        options.add_argument(arg)
    service = Service(
        executable_path=browser_paths[1], log_output=str(tmp_path / "chromedriver.log")
    )
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


class Page:
    """The console as the test sees it: waits, clicks, and screenshots."""

    def __init__(self, driver: Any, url: str, shots: Path) -> None:
        self.d = driver
        self.url = url
        self.shots = shots
        shots.mkdir(parents=True, exist_ok=True)

    def until(self, cond: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
        from selenium.common.exceptions import StaleElementReferenceException

        def safe() -> Any:
            try:
                return cond()
            except StaleElementReferenceException:
                return None  # the page re-rendered under us: look again

        return wait_until(safe, timeout=timeout, interval=0.2, what=what)

    def css(self, selector: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return list(self.d.find_elements(By.CSS_SELECTOR, selector))

    def one(self, selector: str) -> Any:
        return self.until(lambda: (self.css(selector) or [None])[0], selector)

    def text(self, selector: str) -> str:
        """The element's text, read in one script call (the page re-renders every 2 s)."""
        script = "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;"
        value = self.until(
            lambda: (v := self.d.execute_script(script, selector)) is not None and [v], selector
        )
        return str(value[0])

    def rows(self, selector: str, attr: str) -> dict[str, str]:
        """``attr`` -> text of every row matching ``selector``, read in one script call."""
        script = """return Array.from(document.querySelectorAll(arguments[0]))
            .map((r) => [r.getAttribute(arguments[1]), r.innerText]);"""
        return {k: v for k, v in self.d.execute_script(script, selector, attr)}

    def click(self, selector: str, confirm: bool = False) -> None:
        from selenium.common.exceptions import StaleElementReferenceException

        def attempt() -> bool:
            try:
                self.one(selector).click()
                return True
            except StaleElementReferenceException:
                return False  # re-rendered between finding and clicking: again

        self.until(attempt, f"click {selector}")
        if confirm:
            self.until(self._alert, "the confirmation dialog").accept()

    def _alert(self) -> Any:
        from selenium.common.exceptions import NoAlertPresentException

        try:
            return self.d.switch_to.alert
        except NoAlertPresentException:
            return None

    def sign_in(self, operator: str = "ada", token: str = TOKEN) -> None:
        """Sign in through the console's form (the page open); ``operator`` left empty if ``""``."""
        self.until(lambda: self.one("#login").is_displayed(), "the sign-in form")
        self.one("#token").send_keys(token)
        if operator:
            self.one("#operator").send_keys(operator)
        self.click("#login-submit")
        self.until(lambda: not self.one("#login").is_displayed(), "signed in")

    def tab(self, name: str) -> None:
        self.click(f'#tabs a[data-tab="{name}"]')
        self.until(lambda: self.one(f'.view[data-view="{name}"]').is_displayed(), f"view {name}")

    def shot(self, name: str) -> Path:
        path = self.shots / f"console-{name}.png"
        time.sleep(0.3)  # let the last render settle
        self.d.save_screenshot(str(path))
        extra = os.environ.get("WORKER_SCREENSHOTS_DIR")
        if extra:
            Path(extra).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(extra) / path.name)
        return path

    def post(self, path: str, body: dict[str, Any], token: str | None) -> int:
        """A fetch from the page itself (same origin), with or without the token."""
        script = """
            const [path, body, token, done] = arguments;
            const headers = {"Content-Type": "application/json"};
            if (token) headers["Authorization"] = "Bearer " + token;
            fetch(path, {method: "POST", headers, body: JSON.stringify(body)})
              .then((r) => done(r.status), () => done(-1));
        """
        return int(self.d.execute_async_script(script, path, body, token))


def start_console(spawn: Spawn, app: str, env: dict[str, str] | None = None) -> str:
    """A ``python -m worker web`` process for ``app`` guarded by :data:`TOKEN`: its URL, once it
    listens."""
    port = free_port()
    web = spawn(
        "all", name="web", app=app, command="web",
        env={"WORKER_WEB_TOKEN": TOKEN, "WORKER_WEB_PORT": str(port), **(env or {})},
    )  # fmt: skip
    wait_until(lambda: "console listening" in web.log(), 30, what="the console")
    return f"http://127.0.0.1:{port}/"


def _audit(r: redis_sync.Redis, prefix: str) -> list[dict[str, Any]]:
    return [json.loads(e) for e in r.lrange(f"{prefix}audit", 0, -1)]


def _instances(r: redis_sync.Redis, prefix: str) -> dict[str, dict[str, Any]]:
    out = {}
    for member in r.zrange(f"{prefix}instances", 0, -1):
        raw = r.get(f"{prefix}instance:{member.decode()}")
        if raw:
            rec = json.loads(raw)
            out[rec["name"]] = rec
    return out


def test_the_console_shows_the_cluster_and_acts_on_it(
    spawn: Spawn, redis_url: str, rsync: redis_sync.Redis, browser: Any, tmp_path: Path
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    env = {**DEMO_ENV, "WORKER_LOG_LEVEL": "WARNING"}
    a1 = spawn("all", name="a1", app="worker.demo:app", env=env)
    spawn("all", name="a2", app="worker.demo:app", env=env)
    url = start_console(spawn, "worker.demo:app")
    wait_until(lambda: LockValue.parse(rsync.get(f"{prefix}leader")), 30, what="a leader")
    wait_until(lambda: len(_instances(rsync, prefix)) == 2, 30, what="two instances")
    wait_until(lambda: rsync.hget(f"{prefix}init:load_cards", "done") == b"1", 60, what="cards")
    for n in range(3):  # no such task: each is set aside, and counts as a failure
        client_call(redis_url, prefix, "enqueue", "no_such_task", HOSTILE if n == 0 else n)
    wait_until(lambda: rsync.zcard(f"{prefix}dead") == 3, 30, what="three dead letters")

    page = Page(browser, url, tmp_path / "screens")
    started = time.monotonic()
    browser.get(url)
    # -- sign in -----------------------------------------------------------------------------
    page.until(lambda: page.one("#login").is_displayed(), "the sign-in form")
    page.one("#token").send_keys("wrong-token-000000")
    page.click("#login-submit")
    page.until(lambda: page.text("#login-error"), "a refusal")
    page.sign_in()
    page.until(lambda: page.css("#instances tbody tr[data-instance]"), "instance rows")
    load_s = time.monotonic() - started

    # -- cluster -------------------------------------------------------------------------------
    lock = LockValue.parse(rsync.get(f"{prefix}leader"))
    assert lock is not None
    instances = _instances(rsync, prefix)
    leader = next(
        n for n, rec in instances.items() if rec.get("epoch") == lock.epoch and rec["is_leader"]
    )
    page.until(lambda: page.text("#leader-name") == leader, "the leader's name")
    assert f"epoch {lock.epoch}" in page.text("#leader-detail")
    # the table may still show a refresh from before the leader's record said it leads
    rows = page.until(
        lambda: (
            (r := page.rows("#instances tbody tr", "data-instance"))
            and f"epoch {lock.epoch}" in r.get(leader, "")
            and r
        ),
        "the leader's row with its epoch",
    )
    assert set(rows) == set(instances)
    for name, rec in instances.items():
        assert rec["version"] in rows[name] and rec["role"] in rows[name]
    assert page.text("#dead-count") == "3"
    assert "doctor" not in page.text("#banners") or page.css("#banners .banner")
    page.shot("cluster")

    # -- schedules -----------------------------------------------------------------------------
    page.tab("schedules")
    periodic = page.rows("#periodic tbody tr", "data-periodic")
    assert set(periodic) == set(demo.app.periodics)
    for name, job in demo.app.periodics.items():
        assert job.schedule.describe() in periodic[name] and job.catch_up in periodic[name]
    page.until(
        lambda: "ago" in page.text('#periodic tr[data-periodic="demo_report"] td.last-tick'),
        "demo_report's last tick",
    )
    # a daily job on a cluster a minute old never ran: no age of its schedule's previous slot
    assert page.text('#periodic tr[data-periodic="daily_traffic_flush"] td.last-tick') == "never"
    (init,) = page.rows("#initializers tbody tr", "data-initializer").values()
    state = rsync.hgetall(f"{prefix}init:load_cards")
    assert "done" in init and state[b"items"].decode() in init
    shards = page.text('#pollers tr[data-poller="cards"] td.shards').split()
    assert len(shards) == demo.cards.shards
    assert "running" in page.text('#pollers tr[data-poller="cards"] td.state')
    page.click('#pollers tr[data-poller="cards"] button[data-action="pause"]')
    wait_until(lambda: rsync.sismember(f"{prefix}paused", "poller:cards"), 10, what="paused")
    page.until(lambda: "paused" in page.text('#pollers tr[data-poller="cards"] td.state'), "shown")
    page.click('#periodic tr[data-periodic="alert_check"] button[data-action="pause"]')
    wait_until(lambda: rsync.sismember(f"{prefix}paused", "periodic:alert_check"), 10, what="p")
    page.shot("schedules")
    page.click('#pollers tr[data-poller="cards"] button[data-action="resume"]')
    wait_until(lambda: not rsync.sismember(f"{prefix}paused", "poller:cards"), 10, what="resumed")
    page.click('#periodic tr[data-periodic="alert_check"] button[data-action="resume"]')
    wait_until(lambda: not rsync.smembers(f"{prefix}paused"), 10, what="all resumed")
    page.click('#periodic tr[data-periodic="data_cleanup"] button[data-action="trigger"]')
    trigger = wait_until(
        lambda: next((a for a in _audit(rsync, prefix) if a["action"] == "trigger"), None), 10
    )
    assert (trigger["target"], trigger["who"], trigger["via"], trigger["ok"]) == (
        "data_cleanup",
        "ada",
        "web",
        True,
    )
    job_id = trigger["message"].split("enqueued ", 1)[1]
    wait_until(lambda: rsync.exists(f"arq:result:{job_id}"), 20, what="the triggered run")
    # the outbox relay's table, drawn from its kind's columns like the others: paused, a row
    rsync.sadd(f"{prefix}paused", "outbox:relay")
    relay = '#outbox tr[data-outbox="relay"]'
    page.until(lambda: page.css(relay) and "paused" in page.text(f"{relay} td.state"), "relay")
    page.click(f'{relay} button[data-action="resume"]')
    wait_until(lambda: not rsync.sismember(f"{prefix}paused", "outbox:relay"), 10, what="relay")

    # -- queues ------------------------------------------------------------------------------
    page.tab("queues")
    queues = page.rows("#queues tbody tr", "data-queue")
    names = demo.app.queue_names()  # each queue with its duty lane (ticks, poll jobs) beside it
    assert set(queues) == {*names, *(duty_lane(q) for q in names)}
    hour = int(time.time() * 1000) // 3_600_000
    counted = {
        k.decode(): int(v)
        for h in (hour - 1, hour)
        for k, v in rsync.hgetall(f"{prefix}stats:default:{h}").items()
    }
    failed = sum(v for k, v in counted.items() if k.endswith(":failed"))
    assert failed >= 3  # the three jobs set aside
    page.until(lambda: int(page.text('#queues tr[data-queue="default"] td.failed')) >= 3, "fails")
    done_shown = int(page.text('#queues tr[data-queue="default"] td.done'))
    assert 0 < done_shown <= sum(v for k, v in counted.items() if k.endswith(":done")) + 1000
    assert page.css('#queues tr[data-queue="default"] svg.chart rect.failed')
    page.shot("queues")

    # -- dead letters ------------------------------------------------------------------------
    page.tab("dead")
    page.until(lambda: len(page.rows("#dead tbody tr[data-job]", "data-job")) == 3, "three rows")
    ids = [r.decode() for r in rsync.zrevrange(f"{prefix}dead", 0, -1)]
    assert list(page.rows("#dead tbody tr[data-job]", "data-job")) == ids
    hostile = next(
        j
        for j in ids
        if b"onerror"
        in base64.b64decode(json.loads(rsync.hget(f"{prefix}dead:jobs", j))["payload_b64"])  # type: ignore[arg-type]
    )
    page.click(f'#dead a[data-open="{hostile}"]')
    shown = page.until(
        lambda: "<script>window.pwned=2</script>" in page.text("#detail-payload"), "the payload"
    )
    assert shown and '<img src=x onerror=\\"window.pwned=1\\">' in page.text("#detail-payload")
    assert page.css("#detail-payload *") == []  # nothing became an element
    assert browser.execute_script("return window.pwned === undefined")
    assert "no_such_task" in page.text("#detail-fields")
    page.shot("dead-letters")
    # re-queue one (it comes back: its task is still unknown), purge one, then all
    before_ms = json.loads(rsync.hget(f"{prefix}dead:jobs", ids[0]))["at_ms"]  # type: ignore[arg-type]
    page.click(f'#dead input.pick[data-job="{ids[0]}"]')
    page.click("#requeue-selected")
    wait_until(
        lambda: (
            json.loads(rsync.hget(f"{prefix}dead:jobs", ids[0]) or b'{"at_ms": 0}')["at_ms"]
            > before_ms
        ),
        20,
        what="the re-queued job ran again (and was set aside again)",
    )
    page.click(f'#dead input.pick[data-job="{ids[1]}"]')
    page.click("#purge-selected", confirm=True)
    wait_until(lambda: rsync.zscore(f"{prefix}dead", ids[1]) is None, 10, what="purged")
    assert rsync.zcard(f"{prefix}dead") == 2
    page.click("#purge-all", confirm=True)
    wait_until(lambda: rsync.zcard(f"{prefix}dead") == 0, 10, what="all purged")
    page.until(lambda: page.css("#dead tbody tr.empty"), "an empty list")

    # -- actions without the token are refused -----------------------------------------------
    assert page.post("api/pause", {"kind": "poller", "name": "cards"}, None) == 401
    assert page.post("api/pause", {"kind": "poller", "name": "cards"}, "not-the-token-0000") == 401
    forged = urllib.request.Request(
        url + "api/pause",
        data=b'{"kind": "poller", "name": "cards"}',
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {TOKEN}",
            "Origin": "https://evil.example",
        },
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(forged, timeout=10)
    refused.value.close()  # the error holds the response's socket
    assert refused.value.code == 403
    assert not rsync.smembers(f"{prefix}paused")

    # -- a planned handoff from the page -----------------------------------------------------
    page.tab("cluster")
    before = LockValue.parse(rsync.get(f"{prefix}leader"))
    assert before is not None
    page.click("#handoff", confirm=True)
    after = wait_until(
        lambda: (
            (v := LockValue.parse(rsync.get(f"{prefix}leader"))) and v.epoch > before.epoch and v
        ),
        20,
        what="another epoch",
    )
    history = [h.decode().split("|") for h in rsync.lrange(f"{prefix}leader:history", 0, 1)]
    assert [h[2] for h in history] == ["after handoff", "handoff"]
    assert history[0][3] != history[1][3] and history[1][3] == leader  # the other one leads
    page.until(lambda: page.text("#leader-name") == history[0][3], "the new leader shown")
    page.tab("activity")
    page.until(
        lambda: page.css(f'#history tbody tr[data-epoch="{after.epoch}"]'), "the new epoch listed"
    )
    assert "after handoff" in page.text(f'#history tbody tr[data-epoch="{after.epoch}"]')
    assert "ada" in page.text("#audit")
    page.shot("activity")
    assert a1.alive()
    print(f"console: signed in and first rows shown in {load_s:.2f} s")


def test_the_jobs_view_lists_details_retries_and_cancels(
    spawn: Spawn, redis_url: str, rsync: redis_sync.Redis, browser: Any, tmp_path: Path
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    spawn("all", name="w1", app="harness.apps.ledger:app", env={"WORKER_LOG_LEVEL": "WARNING"})
    url = start_console(spawn, "harness.apps.ledger:app")
    wait_until(lambda: len(_instances(rsync, prefix)) == 1, 30, what="the worker")
    dead = client_call(redis_url, prefix, "enqueue", "no_such_task", HOSTILE)
    done = client_call(redis_url, prefix, "enqueue", "record", "fine")
    failed = client_call(redis_url, prefix, "enqueue", "fail", HOSTILE)
    wait_until(lambda: rsync.zscore(f"{prefix}dead", dead) is not None, 30, what="a dead letter")
    wait_until(lambda: rsync.exists(f"arq:result:{done}"), 30, what="a finished job")
    wait_until(lambda: rsync.exists(f"arq:result:{failed}"), 30, what="a failed job")

    page = Page(browser, url, tmp_path / "screens")
    browser.get(url)
    page.sign_in()

    # -- failed: listed, searched, in detail (escaped), retried -----------------------------
    page.tab("jobs")
    page.click('#job-states button[data-state="failed"]')
    page.until(lambda: page.css(f'#jobs tr[data-job="{dead}"]'), "the dead job listed")
    page.until(lambda: page.css(f'#jobs tr[data-job="{failed}"]'), "the failed job listed")
    page.click(f'#jobs a[data-open-job="{failed}"]')
    page.until(lambda: "Traceback" in page.text("#job-error"), "its traceback shown")
    assert "raise ValueError" in page.text("#job-error")
    assert HOSTILE in page.text('#job-fields dd[data-field="args"]')  # as text
    assert page.css("#job-detail pre *") == [] and page.css("#job-fields dd *") == []
    assert browser.execute_script("return window.pwned === undefined")
    page.shot("jobs-traceback")
    page.one("#job-search").send_keys("no_such")
    page.click("#job-go")
    page.until(lambda: list(page.rows("#jobs tbody tr[data-job]", "data-job")) == [dead], "found")
    page.click(f'#jobs a[data-open-job="{dead}"]')
    page.until(lambda: "unknown function" in page.text("#job-error"), "the error shown")
    assert page.css("#job-detail pre *") == [] and page.css("#job-fields dd *") == []
    assert browser.execute_script("return window.pwned === undefined")
    page.shot("jobs-detail")
    before = json.loads(rsync.hget(f"{prefix}dead:jobs", dead))["at_ms"]  # type: ignore[arg-type]
    page.click("#job-retry", confirm=True)
    wait_until(
        lambda: (
            json.loads(rsync.hget(f"{prefix}dead:jobs", dead) or b'{"at_ms": 0}')["at_ms"] > before
        ),
        20,
        what="the retried job ran again (and was set aside again: its task is still unknown)",
    )
    retry = next(a for a in _audit(rsync, prefix) if a["action"] == "retry")
    assert (retry["target"], retry["who"], retry["via"], retry["ok"]) == (dead, "ada", "web", True)

    # -- running: listed with its state, cancelled from its detail --------------------------
    slow = client_call(redis_url, prefix, "enqueue", "slow_job", 60)
    wait_until(lambda: rsync.hget(f"{prefix}ledger:slow-started", slow), 30, what="slow started")
    page.one("#job-search").clear()
    page.click("#job-go")
    page.click('#job-states button[data-state="running"]')
    page.until(lambda: page.css(f'#jobs tr[data-job="{slow}"]'), "the running job listed", 15)
    page.shot("jobs")
    page.click(f'#jobs a[data-open-job="{slow}"]')
    page.until(lambda: "running" in page.text('#job-fields dd[data-field="state"]'), "running")
    asked = time.monotonic()
    page.click("#job-cancel", confirm=True)
    page.until(
        lambda: page.text('#job-fields dd[data-field="state"]') == "cancelled", "cancelled", 15
    )
    took = time.monotonic() - asked
    assert rsync.hget(f"{prefix}ledger:slow-done", slow) is None
    cancel = next(a for a in _audit(rsync, prefix) if a["action"] == "cancel")
    assert (cancel["target"], cancel["via"], cancel["ok"]) == (slow, "web", True)

    # -- per-task figures and labelled charts ------------------------------------------------
    page.tab("queues")
    page.until(lambda: page.css('#tasks tr[data-task="record"]'), "the task table")
    assert page.text('#tasks tr[data-task="record"] td.done') != "0"
    assert "jobs/min" in page.text("#queues")  # the chart's unit is printed on it
    assert page.css("#queues svg.chart text.x") and page.css("#backlog-chart svg")
    page.shot("queues-tasks")
    print(f"cancel from the page: shown cancelled {took:.2f} s after the click")


def test_ids_with_braces_open_and_spoofing_characters_show_escaped(
    spawn: Spawn, rsync: redis_sync.Redis, browser: Any, tmp_path: Path
) -> None:
    """A hash-tagged prefix's job (``{tag}:…``, every job of a Cluster or
    sharded app) opens in the Jobs view; a job id written with a line break and a right-to-left
    override (by plain redis-py: enqueue refuses them now) is shown escaped, in the table, the
    detail and the cancel confirmation, whose text it cannot spoof."""
    from worker.core.serializer import get_serializer, job_payload

    prefix = "{b" + uuid.uuid4().hex[:6] + "}:"
    url = start_console(spawn, "harness.apps.ledger:app", {"WORKER_KEY_PREFIX": prefix})
    braced = f"{prefix}braced-1"
    spoof = f"{prefix}dup\n\nThis only cancels the duplicate test job\u202e"
    ser, _ = get_serializer("msgpack")
    due = int(time.time() * 1000) + 600_000
    for jid in (braced, spoof):
        rsync.set(f"arq:job:{jid}", job_payload("record", ("x",), {}, due - 600_000, ser))
        rsync.zadd(f"{prefix}queue", {jid: due})
    page = Page(browser, url, tmp_path / "screens")
    browser.get(url)
    page.sign_in(operator="")
    page.tab("jobs")
    page.click('#job-states button[data-state="scheduled"]')
    page.until(lambda: len(page.css("#jobs a[data-open-job]")) == 2, "both jobs listed")

    page.click(f'#jobs a[data-open-job="{braced}"]')
    page.until(lambda: page.text("#job-title") == braced, "the braced job opened")
    assert page.text('#job-fields dd[data-field="state"]') == "scheduled"

    shown = "This only cancels the duplicate test job"
    link = page.until(
        lambda: [a for a in page.css("#jobs a[data-open-job]") if shown in a.text], "the spoof"
    )[0]
    assert link.text == f"{prefix}dup\\x0a\\x0a{shown}\\u202e"
    link.click()
    page.until(lambda: "\\x0a" in page.text("#job-title"), "the spoofed job opened")
    page.click("#job-cancel")
    alert = page.until(page._alert, "the confirmation dialog")
    assert alert.text == f"Cancel {prefix}dup\\x0a\\x0a{shown}\\u202e?", alert.text
    alert.dismiss()
    assert rsync.zscore(f"{prefix}queue", spoof) is not None  # dismissed: nothing done


def test_the_sign_in_form_keeps_what_is_typed_while_the_page_polls(
    spawn: Spawn, browser: Any, tmp_path: Path
) -> None:
    """The page goes on polling behind the sign-in form (every 2 s, each refused): a refusal
    while the operator types must not wipe the name typed (every action then said
    "anonymous": seen as a flaky audit in the schedules test)."""
    url = start_console(spawn, "harness.apps.ledger:app")
    page = Page(browser, url, tmp_path / "screens")
    browser.get(url)
    page.until(lambda: page.one("#login").is_displayed(), "the sign-in form")
    page.one("#operator").send_keys("grace")
    time.sleep(4.5)  # two refused polls come while the form is filled in
    page.one("#token").send_keys(TOKEN)
    page.click("#login-submit")
    page.until(lambda: not page.one("#login").is_displayed(), "signed in")
    stored = browser.execute_script("return window.sessionStorage.getItem('worker.operator')")
    assert stored == "grace"
