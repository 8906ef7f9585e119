"""The workers' side of the Django backend: one task, :data:`RUNNER`, runs every Django task
function.

The workers' app installs it::

    # jobs.py: WORKER_APP=jobs:app, DJANGO_SETTINGS_MODULE set
    from worker import App
    from worker.contrib.django import install

    app = App("shop", queues=("urgent", "default"))   # the queues the Django tasks use
    install(app)   # django.setup(), then the "django_task" runner registered

A job of the runner carries ``{"task": <module path>, ...}``, the arguments and keyword
arguments; the runner imports the ``@task`` object by its path and calls it
(``Task.call``: a plain function in this thread, an ``async def`` through ``async_to_sync``),
in the worker's sync threads (``WORKER_SYNC_THREADS``), with the database connections Django
would close after a request closed before and after (``close_old_connections``). Django's
``task_started`` and ``task_finished`` signals are sent around the call; a ``takes_context``
task gets a ``TaskContext`` whose ``attempt`` is the job's try.
"""

from __future__ import annotations

import traceback
from typing import Any

import django
from django.db import close_old_connections
from django.utils import timezone
from django.utils.module_loading import import_string

from worker.app import App
from worker.context import JobContext
from worker.contrib.django import api

__all__ = ["RUNNER", "install", "run_task", "task_of"]

#: The framework task every Django task function runs under (the name the console shows).
RUNNER = "django_task"


def install(app: App, *, setup: bool = True, **options: Any) -> None:
    """Register the runner on the workers' ``app`` (``options``: ``@app.task``'s, e.g.
    ``timeout_s``, ``keep_result_s``, ``max_concurrency``) after ``django.setup()`` (unless
    ``setup=False``: the caller set Django up). Its jobs wait in the queues the Django tasks
    name: list them in ``App(queues=...)`` or ``WORKER_QUEUES``."""
    if setup:
        django.setup()
    app.task(name=RUNNER, **options)(run_task)


def task_of(spec: dict[str, Any]) -> Any:
    """The Django ``Task`` a job names, with the options it was enqueued with."""
    path = spec["task"]
    found = import_string(path)
    if not isinstance(found, api.Task):
        raise TypeError(f"{path!r} is a {type(found).__name__}, not a Django task")
    return found.using(priority=spec["priority"], queue_name=spec["queue"], backend=spec["backend"])


def run_task(ctx: JobContext, spec: dict[str, Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Run the Django task a job names (module docstring); its return value, made JSON's."""
    task = task_of(spec)
    now = timezone.now()
    result = api.TaskResult(
        task=task,
        id=ctx.job_id,
        status=api.TaskResultStatus.RUNNING,
        enqueued_at=None,
        started_at=now,
        finished_at=None,
        last_attempted_at=now,
        args=args,
        kwargs=kwargs,
        backend=task.backend,
        errors=[],
        worker_ids=[ctx.context.instance_id] * max(1, ctx.job_try),
    )
    sender = type(task.get_backend())
    close_old_connections()
    api.task_started.send(sender=sender, task_result=result)
    try:
        if task.takes_context:
            value = task.call(api.TaskContext(task_result=result), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
        value = api.normalize_json(value)
    except BaseException as exc:
        _ended(result, api.TaskResultStatus.FAILED)
        kind = type(exc)
        error = api.TaskError(
            exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
            traceback="".join(traceback.format_exception(exc)),
        )
        result.errors.append(error)
        api.task_finished.send(sender=sender, task_result=result)
        raise
    else:
        _ended(result, api.TaskResultStatus.SUCCESSFUL)
        object.__setattr__(result, "_return_value", value)
        api.task_finished.send(sender=sender, task_result=result)
        return value
    finally:
        close_old_connections()


def _ended(result: Any, status: Any) -> None:
    object.__setattr__(result, "finished_at", timezone.now())
    object.__setattr__(result, "status", status)
