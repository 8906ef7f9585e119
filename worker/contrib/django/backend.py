"""``WorkerBackend``: Django's task framework on this framework's consumers.

A Django ``@task`` function's ``.enqueue()`` (and ``aenqueue``) becomes one job of the runner
task (:data:`~worker.contrib.django.runner.RUNNER`, which the workers' app registers with
:func:`~worker.contrib.django.runner.install`): the job carries the function's module path,
its arguments and its options; a consumer imports the function and calls it with Django set
up. ``get_result`` (and ``TaskResult.refresh``) read the job back (:mod:`.results`).

What maps, and how::

    TASKS = {
        "default": {
            "BACKEND": "worker.contrib.django.WorkerBackend",
            "QUEUES": ["default", "emails", "urgent"],     # Django's own list of queue names
            "OPTIONS": {
                "PRIORITY_QUEUES": {"urgent": 50},         # priority >= 50 waits in "urgent"
                "SETTINGS": {"key_prefix": "shop:"},       # else the WORKER_* environment
            },
        }
    }

- ``queue_name``: the framework's queue of that name (consumers take queues in the app's
  order, ``App(queues=[...])`` or ``WORKER_QUEUES``);
- ``priority``: the framework orders work by queue, not job by job within a queue, so a
  priority picks a queue: ``PRIORITY_QUEUES`` maps a queue to the lowest priority it takes;
  a task goes to the band with the highest minimum its priority reaches, else to its own
  ``queue_name``. Without ``PRIORITY_QUEUES`` a priority other than 0 is refused
  (``InvalidTask`` at ``validate_task``), since it would be silently ignored;
- ``run_after``: the job's due time (``defer_until``; a naive time is read in Django's current
  time zone);
- the function runs in the worker's sync threads (``WORKER_SYNC_THREADS``), an ``async def``
  one through ``async_to_sync`` there.
"""

from __future__ import annotations

import atexit
import re
import threading
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from worker.contrib.django import api
from worker.contrib.django.results import read_result
from worker.contrib.django.runner import RUNNER
from worker.sync_client import SyncClient

__all__ = ["WorkerBackend", "close_clients"]

#: The framework's queue names (``@app.task(queue=...)``).
_QUEUE_NAME = re.compile(r"^[A-Za-z_][\w.-]*$")

_clients: dict[tuple[str, str], SyncClient] = {}
_clients_lock = threading.Lock()


def _client(alias: str, settings: dict[str, Any]) -> SyncClient:
    """One :class:`SyncClient` per backend alias and settings, shared by every thread: Django
    makes a backend per thread; a client per thread would be a loop thread and a pool each."""
    key = (alias, repr(sorted(settings.items())))
    with _clients_lock:
        client = _clients.get(key)
        if client is None or client.closed:
            client = _clients[key] = SyncClient.from_env(**settings)
        return client


@atexit.register
def close_clients() -> None:
    """Close the backends' clients (at exit; tests call it between settings)."""
    with _clients_lock:
        for client in _clients.values():
            client.close()
        _clients.clear()


class WorkerBackend(api.BaseTaskBackend):
    """Django's ``TASKS`` backend for this framework (module docstring)."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options = dict(self.options)
        bands = options.pop("PRIORITY_QUEUES", None) or {}
        self.settings: dict[str, Any] = dict(options.pop("SETTINGS", None) or {})
        if options:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']: unknown {sorted(options)}; "
                "known: PRIORITY_QUEUES, SETTINGS"
            )
        for queue, minimum in bands.items():
            if not _QUEUE_NAME.match(str(queue)) or not isinstance(minimum, int):
                raise ImproperlyConfigured(
                    f"TASKS[{alias!r}]['OPTIONS']['PRIORITY_QUEUES']: {queue!r}: {minimum!r} "
                    "is not a queue name mapped to a whole-number priority"
                )
        #: (lowest priority, queue), highest first
        self.bands: list[tuple[int, str]] = sorted(((m, q) for q, m in bands.items()), reverse=True)
        self.supports_priority = bool(self.bands)

    @property
    def client(self) -> SyncClient:
        return _client(self.alias, self.settings)

    def validate_task(self, task: Any) -> None:
        """Django's checks (module-level function, queue in ``QUEUES``, priority range, aware
        ``run_after``), then what the framework cannot do, refused with ``InvalidTask``."""
        if task.priority != api.DEFAULT_TASK_PRIORITY and not self.bands:
            raise api.InvalidTask(
                f"{task.module_path}: priority {task.priority} with backend {self.alias!r}: "
                "this backend orders work by queue, not job by job; map priorities to queues "
                "with OPTIONS['PRIORITY_QUEUES'] (the workers take those queues first)"
            )
        super().validate_task(task)
        if not _QUEUE_NAME.match(task.queue_name):
            raise api.InvalidTask(
                f"{task.module_path}: queue {task.queue_name!r} is not a valid queue name "
                "for the workers: use letters, digits, '_', '.', '-'"
            )

    def queue_for(self, task: Any) -> str:
        """The framework queue ``task`` waits in: its priority band's, else its own."""
        for minimum, queue in self.bands:
            if task.priority >= minimum:
                return queue
        return str(task.queue_name)

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        self.validate_task(task)
        result = api.TaskResult(
            task=task,
            id="",
            status=api.TaskResultStatus.READY,
            enqueued_at=None,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=list(args),
            kwargs=dict(kwargs),
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )  # normalizes the arguments to JSON, raising for what is not
        run_after = task.run_after
        if run_after is not None and timezone.is_naive(run_after):
            run_after = timezone.make_aware(run_after)
        spec = {
            "task": task.module_path,
            "priority": task.priority,
            "queue": task.queue_name,
            "takes_context": task.takes_context,
            "backend": self.alias,
        }
        job_id = self.client.enqueue(
            RUNNER,
            spec,
            result.args,
            result.kwargs,
            queue=self.queue_for(task),
            defer_until=run_after,
        )
        object.__setattr__(result, "id", job_id)
        object.__setattr__(result, "enqueued_at", timezone.now())
        api.task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> Any:
        """The task's result from the job's records: ``READY`` while queued (or due later),
        ``RUNNING`` while claimed, ``SUCCESSFUL`` or ``FAILED`` once ended (while the
        framework keeps the result: ``keep_result_s``, a day by default);
        ``TaskResultDoesNotExist`` for an unknown, expired or foreign id."""
        return read_result(self, result_id)
