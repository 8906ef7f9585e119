"""A traced app: installs an OpenTelemetry SDK provider at import (as a user's app would) whose
exporter appends every finished span as a JSON line to ``$TRACE_FILE``."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from worker import App, JobContext


class FileExporter(SpanExporter):
    """One JSON line per finished span: what the test reads across the process boundary."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a") as fh:
            for s in spans:
                ctx, parent = s.context, s.parent
                fh.write(
                    json.dumps(
                        {
                            "name": s.name,
                            "kind": s.kind.name,
                            "trace_id": f"{ctx.trace_id:032x}" if ctx else None,
                            "span_id": f"{ctx.span_id:016x}" if ctx else None,
                            "parent_id": f"{parent.span_id:016x}" if parent else None,
                            "links": [f"{link.context.span_id:016x}" for link in s.links],
                            "attributes": dict(s.attributes or {}),
                            "status": s.status.status_code.name,
                            "status_description": s.status.description,
                            "events": [e.name for e in s.events],
                            "event_attributes": [dict(e.attributes or {}) for e in s.events],
                        }
                    )
                    + "\n"
                )
        return SpanExportResult.SUCCESS


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(FileExporter(os.environ["TRACE_FILE"])))
trace.set_tracer_provider(provider)

app = App("traced")


@app.task
async def greet(ctx: JobContext, name: str) -> str:
    with trace.get_tracer("app").start_as_current_span("inside greet"):
        return f"hello {name}"


@app.task
async def boom(ctx: JobContext) -> None:
    raise ValueError("boom")


@app.task
async def leaks(ctx: JobContext, size: int) -> None:
    """Fails with what an error can carry: a Redis URL with its password, a ``password=``
    argument, and ``size`` characters more."""
    url = "redis://app:hunter2-url-secret@cache.internal:6379/0"
    raise ConnectionError(f"cannot reach {url} (password=hunter2-arg-secret) " + "x" * size)


@app.periodic(every=1)
async def beat(ctx: JobContext) -> None:
    return None
