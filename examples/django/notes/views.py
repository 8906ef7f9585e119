"""Views that enqueue Django tasks and read their results through Django's API."""

from __future__ import annotations

import datetime as dt

from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from notes import tasks

TASKS = {t.name: t for t in (tasks.add_note, tasks.add_note_async, tasks.shout, tasks.fail)}


@csrf_exempt
@require_POST
def add_note(request: HttpRequest) -> JsonResponse:
    """``POST /notes?text=...[&task=shout][&priority=60][&delay=5]``: enqueue, answer at once."""
    task = TASKS[request.GET.get("task", "add_note")]
    if "priority" in request.GET:
        task = task.using(priority=int(request.GET["priority"]))
    if "delay" in request.GET:
        task = task.using(
            run_after=timezone.now() + dt.timedelta(seconds=float(request.GET["delay"]))
        )
    result = task.enqueue(request.GET.get("text", "hello"))
    return JsonResponse({"id": result.id, "task": task.name}, status=202)


@require_GET
def result(request: HttpRequest, result_id: str) -> JsonResponse:
    """``GET /results/<id>?task=add_note``: the task's ``TaskResult``, as JSON."""
    found = TASKS[request.GET.get("task", "add_note")].get_result(result_id)
    body: dict[str, object] = {
        "id": found.id,
        "status": str(found.status),
        "attempts": found.attempts,
    }
    if found.status == "SUCCESSFUL":
        body["return_value"] = found.return_value
    body["errors"] = [e.exception_class_path for e in found.errors]
    return JsonResponse(body)
