"""OpenTelemetry links between a workflow's steps (the SDK's in-memory exporter, as
``tests/consumer/test_tracing.py``): each step's CONSUMER span links to its parents' spans, a
root's to none, a group's callback to every member's; without tracing a step's result keeps no
context; and in a real ``python -m worker`` process (``harness/apps/traced.py``, spans to a
file)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from harness import Spawn, wait_until
from tests.consumer.test_consumer import KEYS, Loop, eventually
from tests.consumer.test_tracing import loops as loops  # fixtures
from tests.consumer.test_tracing import read_spans
from tests.consumer.test_tracing import spans as spans
from worker import App, Client, Job, JobContext, Workflow, WorkflowInfo, chain, chord, group
from worker.core.clock import SystemClock
from worker.core.serializer import msgpack_dumps, msgpack_loads
from worker.duties.workflows import WorkflowHook
from worker.storage.store import Store
from worker.tracing import Tracing


def _app() -> App:
    app = App("t")

    @app.task
    async def add(ctx: JobContext, *numbers: int) -> int:
        return sum(numbers)

    @app.task
    async def collect(ctx: JobContext, values: list[int]) -> int:
        return sum(values)

    return app


def _loop(r: Any, app: App, traced: bool) -> Loop:
    """A consumer with the workflow hook (and the tracing hook first, its span wrapping)."""
    tracing = Tracing() if traced else None
    hooks: list[Any] = [tracing.hook()] if tracing is not None else []
    flows = WorkflowHook(
        Store(r, KEYS), app.jobs(), (msgpack_dumps, msgpack_loads), SystemClock(),
        keep_result_s=60, trace=hooks[0].carrier if hooks else None,
    )  # fmt: skip
    lp = Loop(r, app, hooks=[*hooks, flows])
    lp.client.tracing = tracing
    return lp


async def _ended(lp: Loop, wid: str) -> WorkflowInfo:
    return await _ended_client(lp.client, wid)


async def _ended_client(client: Client, wid: str) -> WorkflowInfo:
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        info = await client.workflow(wid)
        if info is not None and info.state != "running":
            return info
        assert asyncio.get_running_loop().time() < deadline, f"{wid} still {info}"
        await asyncio.sleep(0.05)


def _runs(found: list[ReadableSpan]) -> dict[str, ReadableSpan]:
    """Each step's CONSUMER span by its job id."""
    return {
        str((s.attributes or {})["messaging.message.id"]): s
        for s in found
        if s.kind == SpanKind.CONSUMER
    }


def _linked(span: ReadableSpan) -> set[int]:
    return {link.context.span_id for link in span.links}


async def test_each_steps_span_links_to_its_parents_spans(
    fake_arq: Any, loops: list[Loop], spans: InMemorySpanExporter
) -> None:
    app = _app()
    lp = _loop(fake_arq, app, traced=True)
    loops.append(lp.start())
    wf = Workflow()
    a = wf.add(Job("add", 5))
    b = wf.add(Job("add", 1), after=[a])
    c = wf.add(Job("add", 2), after=[a])
    wf.add(Job("collect"), after=[c, b])
    diamond = await lp.client.start_workflow(wf)
    fan = await lp.client.start_workflow(
        chord(group(Job("add", i) for i in range(5)), Job("collect"))
    )
    ended = {wid: await _ended(lp, wid) for wid in (diamond, fan)}
    assert {w: i.state for w, i in ended.items()} == {diamond: "done", fan: "done"}
    await eventually(lambda: len(_runs(list(spans.get_finished_spans()))) >= 10, what="spans")
    runs = _runs(list(spans.get_finished_spans()))

    d = [runs[s.job_id] for s in ended[diamond].steps]
    assert not d[0].links  # a root: no parents
    assert _linked(d[1]) == {d[0].context.span_id}
    assert _linked(d[2]) == {d[0].context.span_id}
    assert _linked(d[3]) == {d[1].context.span_id, d[2].context.span_id}
    f = [runs[s.job_id] for s in ended[fan].steps]
    assert _linked(f[-1]) == {m.context.span_id for m in f[:-1]}
    assert all(not m.links for m in f[:-1])
    assert ended[fan].steps[-1].result == sum(range(5))


async def test_untraced_steps_keep_no_context(fake_arq: Any, loops: list[Loop]) -> None:
    app = _app()
    lp = _loop(fake_arq, app, traced=False)
    loops.append(lp.start())
    wid = await lp.client.start_workflow(chord(group(Job("add", 1), Job("add", 2)), Job("collect")))
    info = await _ended(lp, wid)
    assert info.state == "done" and info.results() == [1, 2, 3]
    kept = await fake_arq.hgetall(f"{KEYS.prefix}wf:{wid}")
    assert all(b"otel" not in v for k, v in kept.items() if k.startswith(b"r:"))


@pytest.mark.slow
async def test_a_worker_process_links_a_steps_span_to_its_parents(
    spawn: Spawn, redis_url: str, tmp_path: Path
) -> None:
    trace_file = tmp_path / "spans.jsonl"
    worker = spawn("all", app="harness.apps.traced:app",
                   env={"WORKER_TRACING": "otel", "TRACE_FILE": str(trace_file)})  # fmt: skip
    prefix = spawn.prefix  # type: ignore[attr-defined]
    client = await Client.connect(redis_url, key_prefix=prefix)
    try:
        wid = await client.start_workflow(chain(group(Job("greet", "a"), Job("greet", "b")),
                                                Job("greet")))  # fmt: skip
        info = await _ended_client(client, wid)
    finally:
        await client.close()
    assert info.state == "done", worker.log()[-3000:]

    def runs() -> dict[str, dict[str, Any]] | None:
        found = {
            s["attributes"].get("messaging.message.id"): s
            for s in read_spans(trace_file)
            if s["kind"] == "CONSUMER"
        }
        return found if all(s.job_id in found for s in info.steps) else None

    spans_of = wait_until(runs, 30, what="the steps' spans")
    a, b, last = (spans_of[s.job_id] for s in info.steps)
    assert sorted(last["links"]) == sorted([a["span_id"], b["span_id"]])
    assert a["links"] == [] and b["links"] == []
