"""The console's Workflows view: its API on the real server (filters, one workflow, the graph,
cancel audited, the token), and in headless Chromium (as ``tests/web/test_web_browser.py``)
against a real worker process running ``harness/apps/flows.py`` and a real ``python -m worker
web``: the list by state, one workflow's steps and graph (SVG and text), a step's link to its
job, and cancel (audited, refused without the token)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis as redis_sync

from harness import Spawn, client_call, wait_until
from tests.web.test_web import AUTH, _http
from tests.web.test_web import TOKEN as WEB_TOKEN
from tests.web.test_web import client as client  # fixture
from tests.web.test_web_browser import Page, _audit, _instances, start_console
from tests.web.test_web_browser import browser as browser  # fixtures
from tests.web.test_web_browser import browser_paths as browser_paths
from worker import Job, Workflow, chain
from worker.client import Client
from worker.ops.workflowsview import depths

pytestmark = pytest.mark.timeout(240)

APP = "harness.apps.flows:app"
HOSTILE = '<img src=x onerror="window.pwned=1">'


def _state(url: str, prefix: str, wid: str) -> str:
    info = client_call(url, prefix, "workflow", wid)
    return "gone" if info is None else str(info.state)


def test_depths_put_a_step_one_past_its_deepest_parent() -> None:
    assert depths([[], [0], [0], [1, 2], []]) == [0, 1, 1, 2, 0]
    assert depths([[], [0], [1], [0, 2]]) == [0, 1, 2, 3]


async def test_the_api_lists_shows_and_cancels_workflows(client: Client) -> None:
    http = await _http(client, token=WEB_TOKEN)
    try:
        wf = Workflow()
        a = wf.add(Job("record", "a"))
        for key in "bcd":
            wf.add(Job("record", key), after=[a])
        wid = await client.start_workflow(wf)
        assert (await http.get("/static/workflows.js")).status == 200
        assert (await http.get("/api/workflows")).status == 401
        for bad in ("state=bogus", "limit=x", "limit=0"):
            assert (await http.get(f"/api/workflows?{bad}", headers=AUTH)).status == 400, bad
        listed = await (await http.get("/api/workflows?state=running", headers=AUTH)).json()
        assert [w["id"] for w in listed["items"]] == [wid]
        none = await (await http.get("/api/workflows?state=done", headers=AUTH)).json()
        assert none["items"] == []
        one = await (await http.get(f"/api/workflows/{quote(wid)}", headers=AUTH)).json()
        assert [(s["index"], s["depth"], s["parents"]) for s in one["steps"]] == [
            (0, 0, []), (1, 1, [0]), (2, 1, [0]), (3, 1, [0])
        ]  # fmt: skip
        assert one["graph"] == "0 record [queued]\n  1-3 (3×) record [pending] <- 0"
        assert one["counts"] == {"queued": 1, "pending": 3} and one["size"] == 4
        assert (await http.get("/api/workflows/nope", headers=AUTH)).status == 404
        assert (await http.post("/api/workflows/cancel", json={}, headers=AUTH)).status == 400
        done = await http.post("/api/workflows/cancel", json={"id": wid}, headers=AUTH)
        assert (await done.json())["ok"] is True
        again = await http.post("/api/workflows/cancel", json={"id": wid}, headers=AUTH)
        assert (await again.json())["ok"] is False
        audit = await client.store.audit_log(10)
        assert [(e["action"], e["target"], e["who"], e["via"]) for e in audit][:2] == [
            ("cancel-workflow", wid, "ada", "web"), ("cancel-workflow", wid, "ada", "web")
        ]  # fmt: skip
    finally:
        await http.close()


@pytest.mark.slow
def test_the_workflows_view_lists_shows_the_graph_links_steps_and_cancels(
    spawn: Spawn, redis_url: str, rsync: redis_sync.Redis, browser: Any, tmp_path: Path
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    spawn("all", name="w1", app=APP, env={"WORKER_LOG_LEVEL": "WARNING"})
    url = start_console(spawn, APP)
    wait_until(lambda: len(_instances(rsync, prefix)) == 1, 30, what="the worker")
    wf = Workflow()
    a = wf.add(Job("add", 5))
    b = wf.add(Job("double"), after=[a])
    c = wf.add(Job("add", 1), after=[a])
    wf.add(Job("collect"), after=[c, b])
    diamond = client_call(redis_url, prefix, "start_workflow", wf)
    failed = client_call(redis_url, prefix, "start_workflow", chain(Job("boom"), Job("double")))
    hostile = client_call(redis_url, prefix, "start_workflow", chain(Job("report", HOSTILE)))
    slow = client_call(redis_url, prefix, "start_workflow", chain(Job("nap", 60), Job("double")))
    wait_until(lambda: _state(redis_url, prefix, diamond) == "done", 60, what="the diamond done")
    wait_until(lambda: _state(redis_url, prefix, failed) == "failed", 60, what="the failed one")
    wait_until(lambda: _state(redis_url, prefix, hostile) == "done", 60, what="the hostile one")

    page = Page(browser, url, tmp_path / "screens")
    browser.get(url)
    page.sign_in()

    # -- the list, by state ---------------------------------------------------------------------
    page.tab("workflows")
    page.until(lambda: len(page.rows("#workflows tbody tr[data-workflow]", "data-workflow")) == 4,
               "every workflow listed")  # fmt: skip
    page.click('#workflow-states button[data-state="done"]')
    page.until(lambda: set(page.rows("#workflows tbody tr[data-workflow]", "data-workflow"))
               == {diamond, hostile}, "only the done ones")  # fmt: skip

    # -- one workflow: steps, graph, a step's job ------------------------------------------------
    page.click(f'#workflows a[data-open-workflow="{diamond}"]')
    page.until(lambda: page.text('#workflow-fields dd[data-field="state"]') == "done", "its state")
    steps = page.rows("#workflow-steps tbody tr[data-step]", "data-step")
    assert list(steps) == ["0", "1", "2", "3"]
    assert all("done" in row for row in steps.values()), steps
    assert "16" in steps["3"]  # collect's result: 6 + 10
    assert len(page.css("#workflow-graph svg g.node.state-done")) == 4
    assert len(page.css("#workflow-graph svg line.edge")) == 4
    assert "3 collect [done] <- 2, 1" in page.text("#workflow-graph-text")
    page.shot("workflows-graph")
    info = client_call(redis_url, prefix, "workflow", diamond)
    collect = info.steps[3].job_id
    page.click(f'#workflow-steps a[data-open-job="{collect}"]')
    page.until(lambda: page.one('.view[data-view="jobs"]').is_displayed(), "the Jobs view")
    page.until(lambda: page.text("#job-title") == collect, "the step's job opened")
    assert page.text('#job-fields dd[data-field="task"]') == "collect"

    # -- a failed one with its error; a hostile result shown as text ----------------------------
    page.tab("workflows")
    page.click('#workflow-states button[data-state="failed"]')
    page.click(f'#workflows a[data-open-workflow="{failed}"]')
    page.until(lambda: "boom" in page.text('#workflow-steps tr[data-step="0"]'), "the error")
    assert "cancelled" in page.text('#workflow-steps tr[data-step="1"]')
    assert page.css("#workflow-graph svg g.node.state-failed")
    page.click('#workflow-states button[data-state="done"]')
    page.click(f'#workflows a[data-open-workflow="{hostile}"]')
    page.until(lambda: "<img src=x onerror=" in page.text('#workflow-steps tr[data-step="0"]'),
               "the result, as JSON text")  # fmt: skip
    assert page.css("#workflow-steps td *:not(a)") == []
    assert browser.execute_script("return window.pwned === undefined")

    # -- cancel: refused without the token, audited with it ---------------------------------------
    assert page.post("api/workflows/cancel", {"id": slow}, None) == 401
    assert _state(redis_url, prefix, slow) == "running"
    page.click('#workflow-states button[data-state="running"]')
    page.click(f'#workflows a[data-open-workflow="{slow}"]')
    page.until(lambda: page.text('#workflow-fields dd[data-field="state"]') == "running", "run")
    page.shot("workflows")
    asked = time.monotonic()
    page.click("#workflow-cancel", confirm=True)
    page.until(lambda: page.text('#workflow-fields dd[data-field="state"]') == "cancelled",
               "shown cancelled", 15)  # fmt: skip
    assert _state(redis_url, prefix, slow) == "cancelled"
    took = time.monotonic() - asked
    done = next(e for e in _audit(rsync, prefix) if e["action"] == "cancel-workflow")
    assert (done["target"], done["who"], done["via"], done["ok"]) == (slow, "ada", "web", True)
    assert client_call(redis_url, prefix, "workflow", slow).steps[1].state == "cancelled"
    print(f"workflow cancel from the page: shown cancelled {took:.2f} s after the click")
