"""Which Django task framework is installed: Django 6's ``django.tasks``, else the
``django-tasks`` package (the reference backport of the same API for Django 5.2, import name
``django_tasks``). The two have the same classes under the same names, except the invalid-task
error (``InvalidTask`` in Django, ``InvalidTaskError`` in the backport); every module of this
package takes them from here."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


def _tasks_package() -> ModuleType:
    try:
        return importlib.import_module("django.tasks")
    except ImportError:
        pass
    try:
        return importlib.import_module("django_tasks")
    except ImportError:
        raise ImportError(
            "worker.contrib.django needs Django's task framework: Django 6 (django.tasks) or, "
            "on Django 5.2, the django-tasks package (pip install 'fenced-worker[django]')"
        ) from None


_pkg = _tasks_package()
#: ``"django.tasks"`` or ``"django_tasks"``
PACKAGE: str = _pkg.__name__
_base = importlib.import_module(f"{PACKAGE}.base")
_errors = importlib.import_module(f"{PACKAGE}.exceptions")
_backends = importlib.import_module(f"{PACKAGE}.backends.base")
_signals = importlib.import_module(f"{PACKAGE}.signals")

BaseTaskBackend: Any = _backends.BaseTaskBackend
Task: Any = _base.Task
TaskContext: Any = _base.TaskContext
TaskError: Any = _base.TaskError
TaskResult: Any = _base.TaskResult
TaskResultStatus: Any = _base.TaskResultStatus
DEFAULT_TASK_PRIORITY: int = _base.DEFAULT_TASK_PRIORITY
InvalidTask: type[Exception] = getattr(_errors, "InvalidTask", None) or _errors.InvalidTaskError
TaskResultDoesNotExist: type[Exception] = _errors.TaskResultDoesNotExist
task_enqueued: Any = _signals.task_enqueued
task_started: Any = _signals.task_started
task_finished: Any = _signals.task_finished


def _normalize_json() -> Any:
    try:  # Django 6
        return importlib.import_module("django.utils.json").normalize_json
    except (ImportError, AttributeError):
        return importlib.import_module(f"{PACKAGE}.utils").normalize_json


#: a value made JSON's (tuples as lists, bytes as text), raising for what JSON cannot hold
normalize_json: Any = _normalize_json()
