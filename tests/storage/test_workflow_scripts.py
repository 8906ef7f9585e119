"""The workflow scripts (``worker/storage/workflows.py``) against fakeredis AND the real server,
and the compiled shapes of ``chain``/``group``/``chord``/``Workflow``: a step's end is recorded
once, a repeat answers the same dependents again (so a consumer that died before enqueueing
them enqueues them on its re-run) and changes nothing, a fan-in opens on its last parent only,
a step enqueued twice under its id is written once, cancel and the failure policies."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from worker import Job, SyncClient, Workflow, chain, chord, group
from worker.core.serializer import get_serializer
from worker.core.workflow import compile_flow, parse_step, step_job_id
from worker.storage import keys as K
from worker.storage.store import Store
from worker.storage.workflows import result_blob

SER, DE = get_serializer("msgpack")
T = 1_700_000_000_000
KEEP = 60_000


def _store(r: Any) -> Store:
    return Store(r, K.Keys(f"t{uuid.uuid4().hex[:6]}:"))


async def _done(store: Store, wid: str, step: int, value: Any) -> Any:
    return await store.advance_workflow(wid, step, True, result_blob(value, SER), T, KEEP, DE)


def test_the_shapes_compile_to_steps_with_their_parents() -> None:
    flow = chain(Job("a"), group(Job("b", 1), Job("b", 2)), Job("c"), Job("d"))
    wf = compile_flow(flow)
    assert [(s.job.function, s.parents, s.many) for s in wf.steps] == [
        ("a", (), False),
        ("b", (0,), False),
        ("b", (0,), False),
        ("c", (1, 2), True),
        ("d", (3,), False),
    ]
    one = compile_flow(chord([Job("m", 0)], Job("cb")))  # a chord of one still gets a list
    assert one.steps[1].parents == (0,) and one.steps[1].many
    dag = Workflow(on_failure="continue")
    x = dag.add(Job("x"))
    dag.add(Job("y"), after=[x])
    assert compile_flow(dag).on_failure == "continue"
    with pytest.raises(ValueError):
        dag.add(Job("z"), after=[7])
    with pytest.raises(ValueError):
        compile_flow(dag, on_failure="maybe")  # type: ignore[arg-type]
    jid = step_job_id("{p}:", "w:1", 12)
    assert parse_step("{p}:", jid) == ("w:1", 12)
    assert parse_step("{p}:", "{p}:abc") is None


async def test_a_fan_in_opens_once_on_its_last_parent_and_a_repeat_answers_it_again(
    r: Any,
) -> None:
    store = _store(r)
    wf = compile_flow(chord(group(Job("m", i) for i in range(3)), Job("cb", "x")))
    roots = await store.start_workflow("w1", wf, ["default"] * 4, T, SER)
    assert [s.index for s in roots] == [0, 1, 2]
    assert await store.start_workflow("w1", wf, ["default"] * 4, T, SER) == roots  # not started
    assert await store.begin_step("w1", 2)
    assert (await _done(store, "w1", 2, 20)).ready == []
    assert (await _done(store, "w1", 0, 0)).ready == []
    last = await _done(store, "w1", 1, 10)
    assert [(s.index, s.function, s.many, s.args, s.parents) for s in last.ready] == [
        (3, "cb", True, ("x",), [0, 10, 20])
    ]
    # a member run again (its consumer died before finishing it): the same answer, nothing new
    again = await store.advance_workflow("w1", 1, True, result_blob(99, SER), T, KEEP, DE)
    assert again.ready == last.ready and not again.ended_now
    # enqueued twice under the step's id: written once
    assert await store.enqueue_steps("w1", last.ready, T, SER, JOB_TTL) == [True]
    assert await store.enqueue_steps("w1", again.ready, T, SER, JOB_TTL) == [False]
    assert await store.begin_step("w1", 3)
    assert (await _done(store, "w1", 1, 10)).ready == []  # the callback started: not again
    end = await _done(store, "w1", 3, 30)
    assert end.state == "done" and end.ended_now
    info = await store.read_workflow("w1", DE)
    assert info is not None and info.state == "done"
    assert info.results() == [0, 10, 20, 30]
    assert 0 < await r.pttl(f"{store.keys.prefix}wf:w1") <= KEEP


JOB_TTL = 86_400_000


async def test_a_failure_cancels_the_rest_or_hands_on_none(r: Any) -> None:
    store = _store(r)
    flow = chain(Job("a"), Job("b"), Job("c"))
    await store.start_workflow("f", compile_flow(flow), ["default"] * 3, T, SER)
    failed = await store.advance_workflow("f", 0, False, "ValueError: x", T, KEEP, DE)
    assert failed.state == "failed" and failed.ended_now and failed.ready == []
    assert not await store.begin_step("f", 1)  # cancelled: it must not start
    info = await store.read_workflow("f", DE)
    assert info is not None
    assert [s.state for s in info.steps] == ["failed", "cancelled", "cancelled"]
    assert info.steps[0].error == "ValueError: x"

    await store.start_workflow("g", compile_flow(flow, "continue"), ["default"] * 3, T, SER)
    moved = await store.advance_workflow("g", 0, False, "ValueError: x", T, KEEP, DE)
    assert moved.state == "running"
    assert [(s.index, s.parents) for s in moved.ready] == [(1, [None])]


async def test_cancel_stops_every_step_and_asks_the_live_ones_to_abort(r: Any) -> None:
    store = _store(r)
    wf = compile_flow(chain(group(Job("a"), Job("b")), Job("c")))
    roots = await store.start_workflow("c", wf, ["default"] * 3, T, SER)
    await store.enqueue_steps("c", roots[:1], T, SER, JOB_TTL)  # step 1's job not written yet
    assert await store.begin_step("c", 0)
    assert await store.cancel_workflow("c", T)
    assert not await store.cancel_workflow("c", T)
    assert not await store.begin_step("c", 1)
    aborts = {m.decode() for m in await r.zrange(store.keys.abort, 0, -1)}
    assert aborts == {step_job_id(store.keys.prefix, "c", 0)}  # none for a job never written
    late = await _done(store, "c", 0, 1)  # the running step ended after all: nothing follows
    assert late.state == "cancelled" and late.ready == []
    listed = await store.list_workflows()
    assert [(w, s) for w, s, _ in listed] == [("c", "cancelled")]


def test_a_sync_client_starts_reads_and_cancels_a_workflow(redis_url: str) -> None:
    prefix = f"t{uuid.uuid4().hex[:6]}:"
    with SyncClient.connect(redis_url, key_prefix=prefix) as client:  # no worker runs it
        wid = client.start_workflow(chain(Job("a", 1), Job("b")), workflow_id="nightly-1")
        assert wid == "nightly-1"
        assert client.start_workflow(chain(Job("a", 1)), workflow_id=wid) == wid  # once
        info = client.workflow(wid)
        assert info is not None and info.state == "running"
        assert [(s.function, s.state) for s in info.steps] == [("a", "queued"), ("b", "pending")]
        assert client.cancel_workflow(wid) is True
        cancelled = client.workflow(wid)
        assert cancelled is not None and cancelled.state == "cancelled"
        assert client.workflow("unknown") is None
