"""Workflows against real worker processes (``harness/apps/flows.py``): a chain hands each
result on, a DAG's step starts once all its parents are done, a chord's callback runs exactly
once with every member's result although a consumer is SIGKILLed while finishing members, a
cancelled workflow starts no step, and the failure policies."""

from __future__ import annotations

import ast
import asyncio
import json
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import redis as redis_sync

from harness import ROOT, CliRun, Spawn, wait_until
from harness.docpages import python_block
from worker import Job, Workflow, WorkflowInfo, chain, chord, group
from worker.client import Client
from worker.storage import keys as K

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

APP = "harness.apps.flows:app"


def _call(url: str, prefix: str, use: Callable[[Client], Coroutine[Any, Any, Any]]) -> Any:
    async def go() -> Any:
        client = await Client.connect(url, key_prefix=prefix)
        try:
            return await use(client)
        finally:
            await client.close()

    return asyncio.run(go())


def _start(url: str, prefix: str, flow: Any, **options: Any) -> str:
    wid: str = _call(url, prefix, lambda c: c.start_workflow(flow, **options))
    return wid


def _info(url: str, prefix: str, wid: str) -> WorkflowInfo:
    info: WorkflowInfo | None = _call(url, prefix, lambda c: c.workflow(wid))
    assert info is not None, f"workflow {wid} unknown"
    return info


def _ended(url: str, prefix: str, wid: str, timeout: float = 60) -> WorkflowInfo:
    def ended() -> WorkflowInfo | None:
        info = _info(url, prefix, wid)
        return info if info.state != "running" else None

    info: WorkflowInfo = wait_until(ended, timeout, 0.2, what=f"workflow {wid} to end")
    return info


def _runs(rsync: redis_sync.Redis, prefix: str, task: str) -> dict[str, int]:
    raw: dict[bytes, bytes] = rsync.hgetall(f"{prefix}flows:runs")  # type: ignore[assignment]
    head = f"{task}:"
    return {k.decode()[len(head) :]: int(v) for k, v in raw.items() if k.decode().startswith(head)}


def _input(rsync: redis_sync.Redis, prefix: str, job_id: str) -> Any:
    raw: Any = rsync.hget(f"{prefix}flows:inputs", job_id)
    assert raw is not None, f"{job_id} kept no input"
    return json.loads(raw)


def test_a_chain_a_diamond_and_parents_in_the_context(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    spawn("all", name="w1", app=APP)
    flow = chain(Job("add", 1, 2), Job("double"), Job("double"))
    wf = Workflow()
    a = wf.add(Job("add", 5))
    b = wf.add(Job("double"), after=[a])
    c = wf.add(Job("add", 1), after=[a])  # gets 5 first: add(5, 1)
    wf.add(Job("collect"), after=[c, b])  # [6, 10], in the order of after
    ctx_flow = chain(group(Job("add", 1), Job("add", 2)), Job("report", "sum"))
    ids = [_start(redis_url, prefix, f) for f in (flow, wf, ctx_flow)]
    chained, diamond, reported = (_ended(redis_url, prefix, wid) for wid in ids)

    assert chained.state == "done", chained
    assert chained.results() == [3, 6, 12]
    assert diamond.state == "done", diamond
    assert diamond.results() == [5, 10, 6, 16]
    assert _input(rsync, prefix, diamond.steps[3].job_id) == [6, 10]
    assert reported.results()[-1] == "sum: [1, 2]"
    assert _input(rsync, prefix, reported.steps[-1].job_id) == [1, 2]
    assert all(s.state == "done" for i in (chained, diamond, reported) for s in i.steps)


@pytest.mark.parametrize("leader", ["kept", "sigkilled"])
def test_a_chord_callback_runs_once_with_every_result_across_a_sigkilled_consumer(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str, leader: str
) -> None:
    """200 members over 2 consumers; one SIGKILLs itself right after recording a member's end
    (before its job's end is surely written), holding up to 5 members. With ``sigkilled``
    the leader (which reaps the dead consumer's claims) is SIGKILLed at once too: its standby
    takes over and reaps them."""
    prefix = spawn.prefix  # type: ignore[attr-defined]
    members = 200
    env = {"FLOWS_MEMBER_S": "0.05", "WORKER_CONCURRENCY": "5"}
    leaders = {"WORKER_QUEUES": "elsewhere"}  # they lead, they run no member
    first = spawn("leader", name="l1", app=APP, env=leaders)
    wait_until(lambda: rsync.get(K.Keys(prefix).leader), 30, what="l1 to lead")
    spawn("leader", name="l2", app=APP, env=leaders)
    killer = spawn("consumer", name="c1", app=APP, env={**env, "FLOWS_KILL_AT": "30"})
    spawn("consumer", name="c2", app=APP, env=env)
    wait_until(lambda: rsync.zcard(K.Keys(prefix).instances) >= 4, 30, what="4 processes up")
    wid = _start(redis_url, prefix, chord(group(Job("square", i) for i in range(members)),
                                          Job("collect")))  # fmt: skip
    wait_until(lambda: not killer.alive(), 60, what="the consumer to SIGKILL itself")
    if leader == "sigkilled":
        first.kill()
    info = _ended(redis_url, prefix, wid, timeout=120)

    assert info.state == "done", info
    callback = info.steps[-1]
    assert _runs(rsync, prefix, "collect") == {callback.job_id: 1}, "callback not run once"
    assert _input(rsync, prefix, callback.job_id) == [i * i for i in range(members)]
    assert callback.result == sum(i * i for i in range(members))
    squares = _runs(rsync, prefix, "square")
    assert set(squares) == {s.job_id for s in info.steps[:-1]}, "a member never ran"
    again = {j: n for j, n in squares.items() if n > 1}
    assert len(again) <= 5, f"more members ran twice than the killed one held: {again}"


def test_a_cancelled_workflow_starts_no_step(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    spawn("all", name="w1", app=APP)
    # a nap far longer than the test: only the abort can end it (and the cancels are sure to
    # come while it runs, however slow the box)
    flow = chain(Job("nap", 240), group(Job("double", 1), Job("double", 2)), Job("collect"))
    wid = _start(redis_url, prefix, flow)
    wait_until(lambda: _runs(rsync, prefix, "nap"), 30, what="the first step to start")
    assert _call(redis_url, prefix, lambda c: c.cancel_workflow(wid)) is True
    assert _call(redis_url, prefix, lambda c: c.cancel_workflow(wid)) is False
    info = _info(redis_url, prefix, wid)
    assert info.state == "cancelled"
    assert [s.state for s in info.steps] == ["cancelled"] * 4
    # the running step is aborted (as Client.abort does): it ends well before its 240 s
    nap = info.steps[0].job_id
    result = _call(redis_url, prefix, lambda c: c.job(nap).result_info())
    wait_until(lambda: _call(redis_url, prefix, lambda c: c.job(nap).result_info()), 60,
               what="the running step to end aborted")  # fmt: skip
    result = _call(redis_url, prefix, lambda c: c.job(nap).result_info())
    assert result.success is False
    assert _runs(rsync, prefix, "double") == {}
    assert _runs(rsync, prefix, "collect") == {}


@pytest.mark.parametrize("policy", ["fail", "continue"])
def test_a_failed_step_under_each_policy(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str, policy: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    spawn("all", name="w1", app=APP)
    wf = Workflow(on_failure=policy)  # type: ignore[arg-type]
    a = wf.add(Job("boom"))
    b = wf.add(Job("add", 1))
    c = wf.add(Job("collect"), after=[a, b])
    wf.add(Job("double"), after=[c])
    info = _ended(redis_url, prefix, _start(redis_url, prefix, wf))

    assert info.state == "failed", info
    assert info.steps[0].state == "failed"
    assert info.steps[0].error == "ValueError: boom"
    if policy == "fail":
        assert [s.state for s in info.steps[2:]] == ["cancelled", "cancelled"]
        assert _runs(rsync, prefix, "collect") == {}
    else:  # the dependents ran, given None for the failed parent
        assert [s.state for s in info.steps[1:]] == ["done", "done", "done"]
        assert _input(rsync, prefix, info.steps[2].job_id) == [None, 1]


def test_the_examples_of_the_workflows_page(spawn: Spawn, redis_url: str, tmp_path: Path) -> None:
    (tmp_path / "docflows.py").write_text(python_block("workflows", "The tasks"))
    prefix = spawn.prefix  # type: ignore[attr-defined]
    spawn("all", name="w1", app="docflows:app", env={"PYTHONPATH": f"{ROOT}:{tmp_path}"})
    code = compile(python_block("workflows", "Starting one"), "workflows.md", "exec",
                   flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)  # fmt: skip

    async def run(client: Client) -> dict[str, Any]:
        names: dict[str, Any] = {"client": client}
        await eval(code, names)  # the page's own example
        return names

    names = _call(redis_url, prefix, run)
    chained, fanned, dag = (
        _ended(redis_url, prefix, names[k]) for k in ("chain_id", "chord_id", "dag_id")
    )
    assert chained.results()[-1] == f"stored {len('<html>example.com</html>')} bytes"
    assert fanned.results()[-1] == sum(i * 10 for i in range(100))
    assert dag.state == "done", dag
    assert dag.results()[-1] == "daily: [1, 2, 3] {'count': 3, 'max': 3}"


def test_the_command_line_shows_lists_and_cancels_workflows(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str, cli: CliRun
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    spawn("all", name="w1", app=APP)
    env = {"WORKER_REDIS_URL": redis_url, "WORKER_KEY_PREFIX": prefix, "WORKER_APP": APP}
    done = _start(redis_url, prefix, chain(Job("add", 1, 2), Job("double")))
    _ended(redis_url, prefix, done)
    # running until cancelled: the three commands before the cancel took 37 s at load 16,
    # and a 30 s nap had ended (the cancel then found nothing running)
    slow = _start(redis_url, prefix, chain(Job("nap", 240), Job("double")))
    wait_until(lambda: _runs(rsync, prefix, "nap"), 30, what="the nap to start")

    shown = cli("workflow", done, "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["state"] == "done"
    assert [(s["function"], s["state"], s["result"]) for s in doc["steps"]] == [
        ("add", "done", 3), ("double", "done", 6),
    ]  # fmt: skip
    table = cli("workflow", done, env=env)
    assert table.returncode == 0 and "double" in table.stdout, table.stdout
    listed = cli("workflows", "--state", "running", "--json", env=env)
    assert [w["id"] for w in json.loads(listed.stdout)] == [slow]
    cancel = cli("workflow", slow, "--cancel", env=env)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    assert _info(redis_url, prefix, slow).state == "cancelled"
    audit = [json.loads(e) for e in rsync.lrange(K.Keys(prefix).audit, 0, -1)]  # type: ignore[union-attr]
    assert [(e["action"], e["target"]) for e in audit] == [("cancel-workflow", slow)]
    assert cli("workflow", slow, "--cancel", env=env).returncode == 1  # not running any more
    assert cli("workflow", "nope", env=env).returncode == 1
    assert _runs(rsync, prefix, "double").keys() == {_info(redis_url, prefix, done).steps[1].job_id}


def test_a_batch_with_on_complete_runs_its_callback_once_with_the_counts(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    spawn("all", name="w1", app=APP)
    spawn("consumer", name="c2", app=APP)
    specs: list[Any] = [("square", (i,)) for i in range(50)] + [("boom", ())]
    ids = _call(redis_url, prefix,
                lambda c: c.enqueue_many(specs, on_complete=Job("tally", "nightly")))  # fmt: skip
    assert len(ids) == 51 and all(ids)
    wid = ids[0].split(":wf:", 1)[1].rsplit(":", 1)[0]
    info = _ended(redis_url, prefix, wid)
    tally = info.steps[-1]
    assert tally.result == "nightly: 50 done, 1 failed"
    assert _runs(rsync, prefix, "tally") == {tally.job_id: 1}
    assert _input(rsync, prefix, tally.job_id) == {"done": 50, "failed": 1}
