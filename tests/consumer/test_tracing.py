"""OpenTelemetry tracing: a PRODUCER span per enqueue and a CONSUMER span per run in one trace,
in one process (the SDK's in-memory exporter) and across real processes (a worker whose app
installs an SDK provider and writes its spans to a file); a record without a trace context
(plain arq) or with a hostile one still runs; ``otel`` without the API is one line, exit 2."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from harness import CliRun, Spawn, eventually
from harness.arqfmt import Retry
from tests.consumer.test_consumer import KEYS, Loop, loops
from worker import App, Client, JobContext
from worker.core.serializer import job_payload, msgpack_dumps
from worker.storage.jobs import NewJob
from worker.tracing import KEY, Tracing

__all__ = ["loops"]  # the fixture, shared with test_consumer

EXPORTER = InMemorySpanExporter()
PROVIDER = TracerProvider()
PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The test process's finished spans (the global provider is set once per process)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(PROVIDER)
    assert trace.get_tracer_provider() is PROVIDER
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def traced_loop(r: Any, app: App) -> Loop:
    tracing = Tracing()
    lp = Loop(r, app, hooks=[tracing.hook()])
    lp.client.tracing = tracing
    return lp


def one(found: list[ReadableSpan], **want: Any) -> ReadableSpan:
    """The one span whose attributes match ``want`` (``messaging_message_id`` names
    ``messaging.message.id``; ``None``: absent)."""
    names = {k: k.replace("_", ".") for k in want}
    names = {k: v.replace("job.try", "job_try") for k, v in names.items()}
    match = [
        s for s in found if all((s.attributes or {}).get(names[k]) == v for k, v in want.items())
    ]
    assert len(match) == 1, (want, [(s.name, dict(s.attributes or {})) for s in found])
    return match[0]


async def test_a_run_is_the_child_of_its_enqueue_in_one_trace(
    fake_arq: Any, loops: list[Loop], spans: InMemorySpanExporter
) -> None:
    app = App("t")
    tries: list[int] = []

    @app.task
    async def greet(ctx: JobContext, name: str) -> str:
        with trace.get_tracer("app").start_as_current_span("inside"):
            return f"hello {name}"

    @app.task
    async def boom(ctx: JobContext) -> None:
        raise ValueError("no")

    @app.task(max_tries=3)
    async def again(ctx: JobContext) -> None:
        tries.append(ctx.job_try)
        if ctx.job_try < 2:
            raise Retry(defer=0.01)

    lp = traced_loop(fake_arq, app)
    loops.append(lp.start())
    with trace.get_tracer("test").start_as_current_span("request") as request:
        jid = await lp.client.enqueue("greet", "ada")
    bad = await lp.client.enqueue("boom")
    retried = await lp.client.enqueue("again")
    await eventually(lambda: tries == [1, 2] and not lp.consumer.running, what="the runs")
    await eventually(lambda: len(spans.get_finished_spans()) >= 10, what="the spans")
    found = list(spans.get_finished_spans())

    send = one(found, messaging_message_id=jid, messaging_operation_type="send")
    process = one(found, messaging_message_id=jid, messaging_operation_type="process")
    inside = next(s for s in found if s.name == "inside")
    assert send.kind == SpanKind.PRODUCER and process.kind == SpanKind.CONSUMER
    assert send.name == "send default" and process.name == "process default"
    assert send.parent is not None and send.parent.span_id == request.get_span_context().span_id
    assert process.parent is not None and process.parent.span_id == send.context.span_id
    assert inside.parent is not None and inside.parent.span_id == process.context.span_id
    trace_ids = {s.context.trace_id for s in (send, process, inside)}
    assert trace_ids == {request.get_span_context().trace_id}
    assert dict(process.attributes or {}) == {
        "messaging.system": "arq",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "default",
        "messaging.message.id": jid,
        "worker.task": "greet",
        "worker.job_try": 1,
        "worker.outcome": "success",
    }
    assert process.status.status_code == StatusCode.UNSET

    failed = one(found, messaging_message_id=bad, messaging_operation_type="process")
    assert failed.status.status_code == StatusCode.ERROR
    assert "ValueError: no" in (failed.status.description or "")
    assert [e.name for e in failed.events] == ["exception"]

    # a retry: two runs, both children of the one enqueue, and a re-enqueue span in the first
    runs = [
        s
        for s in found
        if (s.attributes or {}).get("messaging.message.id") == retried
        and s.kind == SpanKind.CONSUMER
    ]
    first_send = one(
        found, messaging_message_id=retried, messaging_operation_type="send", worker_retry=None
    )
    assert sorted((s.attributes or {})["worker.job_try"] for s in runs) == [1, 2]
    assert {s.parent.span_id for s in runs if s.parent} == {first_send.context.span_id}
    again_send = one(found, messaging_message_id=retried, worker_retry=True)
    first_run = next(s for s in runs if (s.attributes or {})["worker.job_try"] == 1)
    assert again_send.parent is not None and again_send.parent.span_id == first_run.context.span_id
    assert first_run.status.status_code == StatusCode.UNSET  # arq's Retry is no error


async def test_records_without_or_with_a_hostile_context_still_run(
    fake_arq: Any, loops: list[Loop], spans: InMemorySpanExporter
) -> None:
    app = App("t")
    ran: list[str] = []

    @app.task
    async def note(ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    lp = traced_loop(fake_arq, app)
    store = lp.client.store
    now = int(time.time() * 1000)
    hostile = {KEY: {"traceparent": 5, "tracestate": "x" * 10_000, "k": ["v"]}}
    for jid, extra in (("t:plain", None), ("t:hostile", hostile), ("t:list", {KEY: [1, 2]})):
        payload = job_payload("note", (), {}, now, msgpack_dumps, extra=extra)
        assert await store.unique_enqueue(NewJob(jid, payload, now), 60_000, "default")
    loops.append(lp.start())
    await eventually(lambda: len(ran) == 3, what="the three jobs")
    await eventually(lambda: len(spans.get_finished_spans()) == 3, what="their spans")
    for s in spans.get_finished_spans():
        assert s.kind == SpanKind.CONSUMER and s.parent is None  # a trace of its own
        assert (s.attributes or {})["worker.outcome"] == "success"


async def test_tracing_off_adds_nothing_to_the_record(fake_arq: Any) -> None:
    client = Client(fake_arq, keys=KEYS, serialize=msgpack_dumps)
    jid = await client.enqueue("anything", 1)
    from worker.core.serializer import msgpack_loads

    record = msgpack_loads(await fake_arq.get(f"arq:job:{jid}"))
    assert set(record) == {"t", "f", "a", "k", "et"}


def test_otel_without_the_api_is_one_line_exit_2(cli: CliRun, tmp_path: Path) -> None:
    # an interpreter where `import opentelemetry` fails, as without the extra
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['opentelemetry'] = None\n")
    root = Path(__file__).resolve().parents[2]
    env = {"WORKER_TRACING": "otel", "PYTHONPATH": f"{tmp_path}:{root}"}
    out = cli("plan", "--role", "all", env=env)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "WORKER_TRACING=otel" in lines[0]
    assert "pip install 'fenced-worker[otel]'" in lines[0] and "Traceback" not in out.stderr


def read_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
async def test_one_trace_across_processes_and_ticks_carry_tick_and_epoch(
    spawn: Spawn, redis_url: str, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    trace_file = tmp_path / "spans.jsonl"
    env = {"WORKER_TRACING": "otel", "TRACE_FILE": str(trace_file)}
    worker = spawn("all", app="harness.apps.traced:app", env=env)
    prefix = spawn.prefix  # type: ignore[attr-defined]
    client = await Client.connect(redis_url, key_prefix=prefix, tracing="otel")
    try:
        jid = await client.enqueue("greet", "ada")
        deadline = time.monotonic() + 60
        process: dict[str, Any] | None = None
        tick: dict[str, Any] | None = None
        while time.monotonic() < deadline and (process is None or tick is None):
            assert worker.alive(), worker.log()[-3000:]
            found = read_spans(trace_file)
            process = next(
                (s for s in found if s["attributes"].get("messaging.message.id") == jid
                 and s["kind"] == "CONSUMER"),
                None,
            )  # fmt: skip
            tick = next(
                (s for s in found if s["kind"] == "CONSUMER"
                 and s["attributes"].get("worker.task") == "beat"),
                None,
            )  # fmt: skip
            await asyncio.sleep(0.2)
        assert process is not None and tick is not None, worker.log()[-3000:]
    finally:
        await client.close()
        worker.terminate()
    send = one(list(spans.get_finished_spans()), messaging_message_id=jid)
    assert send.kind == SpanKind.PRODUCER
    assert process["trace_id"] == f"{send.context.trace_id:032x}"
    assert process["parent_id"] == f"{send.context.span_id:016x}"
    assert process["attributes"]["worker.outcome"] == "success"
    inside = [s for s in read_spans(trace_file) if s["name"] == "inside greet"]
    assert inside and inside[0]["parent_id"] == process["span_id"]
    # the tick: a child of its create span in the leader, with the tick instant and epoch
    attrs = tick["attributes"]
    assert attrs["worker.tick"].endswith("+00:00") and attrs["worker.leader_epoch"] >= 1
    create = next(s for s in read_spans(trace_file) if s["span_id"] == tick["parent_id"])
    # ticks go through the queue's duty lane (never behind its user backlog)
    assert create["kind"] == "PRODUCER" and create["name"] == "create default:duty"
    assert create["attributes"]["worker.tick"] == attrs["worker.tick"]
    assert create["attributes"]["worker.leader_epoch"] == attrs["worker.leader_epoch"]
    assert create["attributes"]["messaging.message.id"] == attrs["messaging.message.id"]


async def test_a_poll_dispatch_is_one_create_span_per_job_linked_from_one_send(
    fake_arq: Any, spans: InMemorySpanExporter
) -> None:
    from harness import FixedLease
    from tests.duties.test_poller import LOCK, NOW, client, make_app
    from worker.core.clock import FakeClock
    from worker.core.serializer import msgpack_loads
    from worker.duties.poller import PollingScheduler
    from worker.storage.store import FencedStore, Store

    app = make_app(shards=1)
    clock = FakeClock(NOW / 1000)
    cards = client(fake_arq, app, clock).poller("cards")
    for item in ("a", "b"):
        await cards.schedule(item, delay=-1)
    await fake_arq.set(KEYS.leader, LOCK)
    store = Store(fake_arq, KEYS)
    fenced = FencedStore(store, FixedLease(LOCK))
    s = PollingScheduler(
        app.pollers["cards"], store, fenced, msgpack_dumps, clock, tracing=Tracing()
    )
    await s.tick()
    found = list(spans.get_finished_spans())
    creates = [x for x in found if x.name == "create default"]
    (send,) = [x for x in found if x.name == "send default"]
    assert len(creates) == 2 and send.kind == SpanKind.CLIENT
    assert (send.attributes or {})["messaging.batch.message_count"] == 2
    assert {link.context.span_id for link in send.links} == {c.context.span_id for c in creates}
    for c in creates:
        attrs = c.attributes or {}
        assert c.kind == SpanKind.PRODUCER and attrs["worker.leader_epoch"] == 5
        assert attrs["worker.task"] == "poll_card"
        # the job's record carries its own create span's context
        record = msgpack_loads(await fake_arq.get(f"arq:job:{attrs['messaging.message.id']}"))
        assert f"{c.context.span_id:016x}" in record[KEY]["traceparent"]
        assert record[KEY]["worker.leader_epoch"] == "5"


@pytest.mark.slow
async def test_a_failed_runs_span_holds_the_masked_capped_error(
    spawn: Spawn, redis_url: str, tmp_path: Path
) -> None:
    """A real worker's exported span of a run that raised a Redis URL with its password,
    ``password=…`` and 3 MB more: the status and the exception event hold the failure
    record's texts (masked, capped), not the exception's own (a 6 MB span, secrets in it)."""
    trace_file = tmp_path / "spans.jsonl"
    env = {"WORKER_TRACING": "otel", "TRACE_FILE": str(trace_file)}
    worker = spawn("consumer", app="harness.apps.traced:app", env=env)
    prefix = spawn.prefix  # type: ignore[attr-defined]
    client = await Client.connect(redis_url, key_prefix=prefix)
    try:
        jid = await client.enqueue("leaks", 3_000_000)
        deadline = time.monotonic() + 60
        span: dict[str, Any] | None = None
        while span is None and time.monotonic() < deadline:
            assert worker.alive(), worker.log()[-3000:]
            span = next(
                (s for s in read_spans(trace_file) if s["kind"] == "CONSUMER"
                 and s["attributes"].get("messaging.message.id") == jid),
                None,
            )  # fmt: skip
            await asyncio.sleep(0.2)
        assert span is not None, worker.log()[-3000:]
    finally:
        await client.close()
        worker.terminate()
    size = len(json.dumps(span))
    print(f"the failed run's span: {size} bytes exported")
    text = json.dumps(span)
    assert "hunter2" not in text, f"{text.count('hunter2')} secrets in the span"
    assert size < 40_000, size  # 6 MB before: the message, and again in the stacktrace
    assert span["status"] == "ERROR"
    assert span["status_description"].startswith("ConnectionError: cannot reach redis://app:***@")
    (event,) = span["event_attributes"]
    assert span["events"] == ["exception"] and event["exception.type"] == "ConnectionError"
    assert "password=***" in event["exception.message"]
    assert "[cut: " in event["exception.message"]  # capped, with the length it had
    assert (
        "Traceback" in event["exception.stacktrace"]
        and "raise ConnectionError" in (event["exception.stacktrace"])
    )


def test_an_enqueue_error_on_its_spans_is_masked_and_capped(spans: InMemorySpanExporter) -> None:
    """The PRODUCER/CLIENT spans of an enqueue that raised hold the same masked, capped texts
    (the SDK would record the exception's own ``str`` and traceback)."""
    tracing = Tracing()
    leak = "redis://app:hunter2@cache:6379/0 password=hunter2 " + "x" * 3_000_000
    with pytest.raises(ConnectionError), tracing.send("greet", "j1", "default"):
        raise ConnectionError(leak)
    batch = tracing.batch()
    batch.create("greet", "j2", "default")
    with pytest.raises(ConnectionError), batch.send():
        raise ConnectionError(leak)
    failed = [s for s in spans.get_finished_spans() if s.status.status_code == StatusCode.ERROR]
    assert len(failed) == 2
    for span in failed:
        (event,) = span.events
        texts = [span.status.description or "", *map(str, (event.attributes or {}).values())]
        assert not any("hunter2" in t for t in texts), texts
        assert sum(map(len, texts)) < 40_000
        assert "redis://app:***@cache" in (event.attributes or {})["exception.message"]
