"""Django tasks: plain ``@task`` functions, written against Django's API only. Where they run
is the ``TASKS`` setting's business (here: the worker framework's consumers)."""

from __future__ import annotations

import time

try:  # Django 6
    from django.tasks import TaskContext, task
except ImportError:  # Django 5.2 with the django-tasks package
    from django_tasks import TaskContext, task

from notes.models import Note


@task
def add_note(text: str) -> dict[str, object]:
    """Write a note with the ORM; its id and how many notes there are."""
    note = Note.objects.create(text=text)
    return {"id": note.pk, "notes": Note.objects.count()}


@task(takes_context=True)
def shout(context: TaskContext, text: str) -> str:
    """A task that reads its context: the attempt it is."""
    return f"{text.upper()} (attempt {context.attempt})"


@task
def nap(seconds: float) -> float:
    """A slow task: ``RUNNING`` while it sleeps."""
    time.sleep(seconds)
    return seconds


@task
def fail(reason: str) -> None:
    raise LookupError(reason)


@task
async def add_note_async(text: str) -> int:
    """An ``async def`` task: the runner awaits it (through ``async_to_sync``)."""
    note = await Note.objects.acreate(text=text)
    return int(note.pk)
