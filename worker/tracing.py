"""OpenTelemetry tracing (``WORKER_TRACING=otel``): a PRODUCER span per enqueue, a CONSUMER
span per run, in one trace.

The spans go to the global tracer provider (``opentelemetry.trace.set_tracer_provider``: the
framework installs none of its own). The producer's context travels in the job record as one
extra field, ``otel`` (a map the global propagator fills: ``traceparent``, ``tracestate``;
for duty jobs also ``worker.leader_epoch``). arq reads only ``t f a k et`` and ignores it, so
plain arq clients and workers keep working, and the function's arguments never change.

Attributes follow the messaging semantic conventions: ``messaging.system`` = ``arq`` (the
job protocol: arq's records and queues), ``messaging.destination.name`` = the queue,
``messaging.message.id`` = the job id, ``messaging.operation.type`` = ``send`` / ``create`` /
``process``; plus ``worker.task``, ``worker.job_try``, and for duty jobs ``worker.tick`` (ISO)
and ``worker.leader_epoch``. A failed run's span carries its error as a log line and a failure
record do: secrets (Redis URL passwords, ``password=``) masked and the texts capped (the
message at 2,000 characters, the traceback at 16 KiB: :func:`worker.core.logs.error_text`,
:func:`worker.core.logs.traceback_text`), in the status and in its ``exception`` event.

A workflow step's run is linked to its parents' runs: each step keeps its run's context with
its result, and a dependent's record carries its parents' (``wf_links``, at most 128, the
SDK's default limit); its CONSUMER span has one link per parent.

Batched enqueues (the leader's ticks, a poll dispatch) get one ``create`` PRODUCER span per
job, which is that job's parent, and one ``send`` CLIENT span for the script call, linked to
each.

Off (the default), nothing here is imported or called: one ``is None`` check per enqueue and
the consumer has no tracing hook.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from worker.core.errors import ConfigError
from worker.core.jobdefs import JobHook, JobOutcome, JobRun
from worker.core.logs import error_text, traceback_text
from worker.core.retry import is_retry
from worker.settings import OTEL_MISSING
from worker.version import __version__

if TYPE_CHECKING:
    from opentelemetry.trace import Link, Span

#: The job record's field carrying the producer's context (arq ignores unknown fields).
KEY = "otel"
#: The carrier's field for a duty job's leader epoch (no propagator reads it).
EPOCH = "worker.leader_epoch"
SYSTEM = "arq"
#: A carrier is at most this many fields of at most this many characters (hostile records).
MAX_FIELDS, MAX_FIELD_CHARS = 8, 512
#: The record's field carrying a workflow step's parents' contexts (its span's links).
LINKS = "wf_links"
#: Runs begun but not ended kept at most (ends always follow; this only bounds a leak).
MAX_OPEN = 10_000


def tracing_for(mode: str) -> Tracing | None:
    """The process's :class:`Tracing` for ``WORKER_TRACING``: ``None`` when off; a
    :class:`ConfigError` (one line, exit 2) when ``otel`` lacks the OpenTelemetry API."""
    if mode != "otel":
        return None
    try:
        return Tracing()
    except ImportError:
        raise ConfigError(OTEL_MISSING) from None


def tick_iso(tick_ms: int) -> str:
    """A tick instant as ``worker.tick`` carries it (UTC, ISO 8601, milliseconds)."""
    return dt.datetime.fromtimestamp(tick_ms / 1000, dt.UTC).isoformat(timespec="milliseconds")


def attributes(
    op: str,
    task: str,
    job_id: str,
    queue: str,
    *,
    job_try: int | None = None,
    tick_ms: int | None = None,
    epoch: int | None = None,
) -> dict[str, Any]:
    """A span's messaging attributes (see the module docstring)."""
    out: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": op,
        "messaging.operation.name": op,
        "messaging.destination.name": queue,
        "messaging.message.id": job_id,
        "worker.task": task,
    }
    if job_try is not None:
        out["worker.job_try"] = job_try
    if tick_ms is not None:
        out["worker.tick"] = tick_iso(tick_ms)
    if epoch is not None:
        out["worker.leader_epoch"] = epoch
    return out


class Tracing:
    """Spans for one process, on the global tracer provider (imports OpenTelemetry's API)."""

    def __init__(self) -> None:
        from opentelemetry import context, propagate, trace

        self._context = context
        self._propagate = propagate
        self._trace = trace
        self.tracer = trace.get_tracer("worker", __version__)

    def _carrier(self, span: Span | None = None, epoch: int | None = None) -> dict[str, str]:
        carrier: dict[str, str] = {}
        ctx = self._trace.set_span_in_context(span) if span is not None else None
        self._propagate.inject(carrier, context=ctx)
        if epoch is not None:
            carrier[EPOCH] = str(epoch)
        return carrier

    @contextmanager
    def send(self, task: str, job_id: str, queue: str) -> Iterator[dict[str, Any]]:
        """A PRODUCER span around one enqueue (a child of the current span); yields the record
        fields that carry it. An error in the block is recorded on the span."""
        from opentelemetry.trace import SpanKind

        name = f"send {queue}"
        attrs = attributes("send", task, job_id, queue)
        with (
            self.tracer.start_as_current_span(
                name, kind=SpanKind.PRODUCER, attributes=attrs, **_OWN_ERRORS
            ) as span,
            failing(span),
        ):
            yield {KEY: self._carrier()}

    def batch(self) -> Batch:
        """Spans for a batched enqueue: :meth:`Batch.create` per job, then :meth:`Batch.send`
        around the one call that writes them."""
        return Batch(self)

    def hook(self) -> TracingHook:
        """The consumer's hook: a CONSUMER span around each run."""
        return TracingHook(self)


class Batch:
    """One ``create`` PRODUCER span per job (ended at once: its context is the job's
    creation context) and one ``send`` CLIENT span linked to them all."""

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing
        self.links: list[Link] = []
        self.queues: set[str] = set()

    def create(
        self,
        task: str,
        job_id: str,
        queue: str,
        *,
        tick_ms: int | None = None,
        epoch: int | None = None,
    ) -> dict[str, Any]:
        """The record fields of one job of the batch, carrying its own ``create`` span."""
        from opentelemetry.trace import Link, SpanKind

        t = self.tracing
        attrs = attributes("create", task, job_id, queue, tick_ms=tick_ms, epoch=epoch)
        span = t.tracer.start_span(f"create {queue}", kind=SpanKind.PRODUCER, attributes=attrs)
        try:
            self.links.append(Link(span.get_span_context()))
            self.queues.add(queue)
            return {KEY: t._carrier(span, epoch)}
        finally:
            span.end()

    @contextmanager
    def send(self) -> Iterator[None]:
        """The CLIENT span of the call that writes the batch (errors recorded on it)."""
        from opentelemetry.trace import SpanKind

        attrs: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.batch.message_count": len(self.links),
        }
        queue = next(iter(self.queues)) if len(self.queues) == 1 else None
        if queue is not None:
            attrs["messaging.destination.name"] = queue
        name = f"send {queue}" if queue else "send"
        with (
            self.tracing.tracer.start_as_current_span(
                name, kind=SpanKind.CLIENT, attributes=attrs, links=self.links, **_OWN_ERRORS
            ) as span,
            failing(span),
        ):
            yield


def carried(record: Mapping[str, Any]) -> dict[str, str]:
    """The record's trace carrier, checked: string fields only, bounded (a hostile record
    yields an empty or cut carrier, never an error)."""
    raw = record.get(KEY)
    if not isinstance(raw, dict):
        return {}
    out: dict[str, str] = {}
    for k, v in raw.items():
        if len(out) >= MAX_FIELDS:
            break
        if isinstance(k, str) and isinstance(v, str) and len(k) + len(v) <= MAX_FIELD_CHARS:
            out[k] = v
    return out


class TracingHook(JobHook):
    """A CONSUMER span per run, a child of the producer's context carried in the record, and
    current while the function and the other hooks run. A failed run (failed, dead, timeout,
    or a retried error) sets the span's status to ERROR and records the exception; a retry
    adds a PRODUCER span for the re-enqueue, a child of the run's span."""

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing
        self._open: dict[int, tuple[Span, Any]] = {}

    async def started(self, run: JobRun) -> None:
        from opentelemetry.trace import SpanKind

        t = self.tracing
        carrier = carried(run.record)
        parent = t._propagate.extract(carrier) if carrier else None
        epoch = carrier.get(EPOCH)
        attrs = attributes(
            "process",
            run.job.name,
            run.job_id,
            run.queue,
            job_try=run.job_try,
            tick_ms=run.ctx.get("tick_ms"),
            epoch=int(epoch) if epoch is not None and epoch.isdigit() else None,
        )
        span = t.tracer.start_span(
            f"process {run.queue}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attrs,
            links=self._links(run.record),
        )
        token = t._context.attach(t._trace.set_span_in_context(span))
        if len(self._open) >= MAX_OPEN:
            self._open.pop(next(iter(self._open)))
        self._open[id(run)] = (span, token)

    def _links(self, record: Mapping[str, Any]) -> list[Link]:
        """Links to the spans of a workflow step's parents (their contexts in ``wf_links``,
        checked as :func:`carried` checks one; invalid ones skipped)."""
        from opentelemetry.trace import Link

        raw = record.get(LINKS)
        if not isinstance(raw, list):
            return []
        t, out = self.tracing, []
        for item in raw[:128]:
            carrier = carried({KEY: item})
            found = t._trace.get_current_span(t._propagate.extract(carrier)).get_span_context()
            if carrier and found.is_valid:
                out.append(Link(found))
        return out

    def carrier(self, run: JobRun) -> dict[str, str]:
        """The context of ``run``'s span (started, not yet finished), as a record carries one;
        empty when it has none."""
        opened = self._open.get(id(run))
        return self.tracing._carrier(opened[0]) if opened is not None else {}

    async def finished(self, run: JobRun, outcome: JobOutcome) -> None:
        from opentelemetry.trace import SpanKind

        opened = self._open.pop(id(run), None)
        if opened is None:
            return
        span, token = opened
        t = self.tracing
        try:
            span.set_attribute("worker.outcome", outcome.status)
            err = outcome.error
            if err is not None and _is_failure(outcome):
                record_error(span, err)
            if outcome.status == "retry":
                attrs = attributes(
                    "send", run.job.name, run.job_id, run.queue, job_try=run.job_try + 1
                )
                attrs["worker.retry"] = True
                t.tracer.start_span(
                    f"send {run.queue}", kind=SpanKind.PRODUCER, attributes=attrs
                ).end()
        finally:
            span.end()
            t._context.detach(token)


#: The SDK records an error's own ``str`` and traceback: the spans here record them masked.
_OWN_ERRORS: dict[str, Any] = {"record_exception": False, "set_status_on_exception": False}


def record_error(span: Span, err: BaseException) -> None:
    """Status ERROR and an ``exception`` event (the semantic conventions' fields) holding the
    texts a failure record and a log line keep (secrets masked, capped: :func:`error_text`,
    :func:`traceback_text`), never the exception's own ``str`` (a 3 MB message would make a
    6 MB span, and a Redis URL's password would leave the process in it)."""
    from opentelemetry.trace import Status, StatusCode

    if not span.is_recording():
        return
    message, tb = error_text(err), traceback_text(err)
    module, name = type(err).__module__, type(err).__qualname__
    span.add_event(
        "exception",
        {
            "exception.type": f"{module}.{name}" if module and module != "builtins" else name,
            "exception.message": message,
            "exception.stacktrace": tb,
            "exception.escaped": "False",
        },
    )
    span.set_status(Status(StatusCode.ERROR, f"{type(err).__name__}: {message}"[:256]))


@contextmanager
def failing(span: Span) -> Iterator[None]:
    """An error raised in the block is recorded on ``span`` (:func:`record_error`), then
    raised on."""
    try:
        yield
    except Exception as exc:  # as the SDK: not GeneratorExit, not a cancellation
        record_error(span, exc)
        raise


def _is_failure(outcome: JobOutcome) -> bool:
    """A run that failed: not a success, an abort, a ``Retry`` or a cut-short run."""
    if outcome.status in ("failed", "dead", "timeout"):
        return True
    if outcome.status != "retry" or outcome.error is None:
        return False
    return not (isinstance(outcome.error, asyncio.CancelledError) or is_retry(outcome.error))
