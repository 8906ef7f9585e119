"""The Django example (examples/django) for real: Django's test client calls the project's
views, which enqueue Django ``@task`` functions through ``worker.contrib.django.WorkerBackend``;
two real ``python -m worker`` processes run them (and the project's periodic job, once per
tick between them) on the real server; results come back through Django's ``TaskResult``.
Plus the backend's refusals, without workers. Django 6 (``django.tasks``) or Django 5.2 with
the django-tasks package, whichever is installed."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness import ROOT, Spawn, wait_until

if not os.environ.get("CI"):  # in CI it fails, not skips, without the extra
    pytest.importorskip("django", reason="the django extra: pip install 'fenced-worker[django]'")

EXAMPLE = ROOT / "examples" / "django"


@pytest.fixture(scope="session")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The example project set up in this process, once: Django is set up once per process
    (and the slow test runs after every other module's, so the fixture lives for the
    session)."""
    import django
    from django.conf import settings

    db = tmp_path_factory.mktemp("django") / "notes.sqlite3"
    sys.path.append(str(EXAMPLE))  # after the rest: its "jobs" and "notes" shadow nothing
    os.environ["DJANGO_SETTINGS_MODULE"] = "mysite.settings"
    os.environ["NOTES_DB"] = str(db)
    if not settings.configured:
        django.setup()
    assert settings.DATABASES["default"]["NAME"] == str(db)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    yield db
    sys.path.remove(str(EXAMPLE))
    for name in ("DJANGO_SETTINGS_MODULE", "NOTES_DB"):
        os.environ.pop(name, None)


@pytest.fixture
def web(
    project: Path, redis_url: str, spawn: Spawn, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Any]:
    """Django's test client, its backend's client on this test's server and key prefix."""
    from django.test import Client as DjangoClient

    from worker.contrib.django import close_clients

    monkeypatch.setenv("WORKER_REDIS_URL", redis_url)
    monkeypatch.setenv("WORKER_KEY_PREFIX", spawn.prefix)  # type: ignore[attr-defined]
    close_clients()
    yield DjangoClient()
    close_clients()


def workers_env(project: Path) -> dict[str, str | None]:
    return {
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(EXAMPLE)]),
        "DJANGO_SETTINGS_MODULE": "mysite.settings",
        "NOTES_DB": str(project),
    }


def enqueue(web: Any, **query: Any) -> str:
    response = web.post("/notes?" + "&".join(f"{k}={v}" for k, v in query.items()))
    assert response.status_code == 202, response.content
    return str(response.json()["id"])


def result(web: Any, result_id: str, task: str = "add_note") -> dict[str, Any]:
    response = web.get(f"/results/{result_id}?task={task}")
    assert response.status_code == 200, response.content
    return dict(response.json())


@pytest.mark.slow
def test_views_enqueue_django_tasks_and_the_periodic_job_ticks_once(
    project: Path, web: Any, spawn: Spawn
) -> None:
    from notes.models import Note, Tick

    from worker.contrib.django import RUNNER

    Note.objects.all().delete()
    Tick.objects.all().delete()
    procs = [spawn("all", name=f"w{i}", app="jobs:app", env=workers_env(project)) for i in (1, 2)]
    logs = lambda: "\n".join(p.log()[-3000:] for p in procs)  # noqa: E731

    def ended(result_id: str, task: str = "add_note") -> dict[str, Any] | None:
        body = result(web, result_id, task)
        return body if body["status"] in ("SUCCESSFUL", "FAILED") else None

    note = enqueue(web, text="hello")
    done = wait_until(lambda: ended(note), timeout=60, what=f"the note task\n{logs()}")
    assert done["status"] == "SUCCESSFUL" and done["attempts"] == 1, done
    assert done["return_value"]["notes"] == 1
    assert Note.objects.get(pk=done["return_value"]["id"]).text == "hello"

    shout = enqueue(web, task="shout", text="hi")
    done = wait_until(lambda: ended(shout, "shout"), timeout=30, what="shout")
    assert done["return_value"] == "HI (attempt 1)"

    failed = enqueue(web, task="fail", text="no-such-row")
    done = wait_until(lambda: ended(failed, "fail"), timeout=30, what="fail")
    assert done["status"] == "FAILED" and done["errors"] == ["builtins.LookupError"], done

    async_note = enqueue(web, task="add_note_async", text="from async")
    done = wait_until(lambda: ended(async_note, "add_note_async"), timeout=30, what="async")
    assert Note.objects.get(pk=done["return_value"]).text == "from async"

    # run_after: READY until due, then run; priority >= 50: the urgent queue
    later = enqueue(web, text="later", delay=3)
    assert result(web, later)["status"] == "READY"
    urgent = enqueue(web, text="urgent", priority=60)
    from notes import tasks

    wait_until(lambda: ended(later), timeout=30, what="the deferred task")
    waited = tasks.add_note.get_result(later)
    assert waited.started_at - waited.enqueued_at >= dt.timedelta(seconds=2.5)
    wait_until(lambda: ended(urgent), timeout=30, what="the urgent task")
    backend = tasks.add_note.get_backend()
    info = backend.client.job(urgent).info()
    assert info.function == RUNNER and info.queue_name.endswith("urgent"), info

    # RUNNING while a consumer holds it; aenqueue and aget_result from async code
    napping = tasks.nap.enqueue(3)
    wait_until(
        lambda: tasks.nap.get_result(napping.id).status == "RUNNING", timeout=30, what="RUNNING"
    )

    async def from_async() -> Any:
        queued = await tasks.add_note.aenqueue("enqueued from async code")
        return await tasks.add_note.aget_result(queued.id)

    queued = asyncio.run(from_async())
    assert queued.status in ("READY", "RUNNING", "SUCCESSFUL"), queued.status
    done = wait_until(lambda: ended(queued.id), timeout=30, what="the aenqueue'd task")
    assert Note.objects.get(pk=done["return_value"]["id"]).text == "enqueued from async code"
    wait_until(lambda: napping.refresh() or napping.is_finished, timeout=30, what="nap")
    assert napping.return_value == 3 and napping.finished_at > napping.started_at

    # TaskResult.refresh() reads the job again
    fresh = tasks.add_note.get_result(note)
    fresh.refresh()
    assert fresh.is_finished and fresh.return_value["id"] > 0

    # the periodic job: one run per tick across the two workers
    wait_until(lambda: Tick.objects.count() >= 4, timeout=60, what=f"ticks\n{logs()}")
    ats = list(Tick.objects.values_list("at", flat=True))
    assert len(ats) == len(set(ats)), sorted(ats)
    for p in procs:
        assert p.terminate() == 0, p.log()[-3000:]
    ats = list(Tick.objects.values_list("at", flat=True))
    assert len(ats) == len(set(ats)), sorted(ats)


def test_what_the_framework_cannot_do_is_refused(web: Any) -> None:
    from django.core.exceptions import ImproperlyConfigured
    from notes import tasks

    from worker.contrib.django import WorkerBackend
    from worker.contrib.django.api import InvalidTask, TaskResultDoesNotExist

    # a priority with no queue to map it to would be silently ignored: refused
    plain = WorkerBackend("default", {"OPTIONS": {}})
    with pytest.raises(InvalidTask, match="PRIORITY_QUEUES"):
        plain.validate_task(tasks.add_note.using(priority=5))
    plain.validate_task(tasks.add_note)
    # the configured backend maps it: below 50 its own queue, from 50 "urgent"
    backend = tasks.add_note.get_backend()
    assert backend.queue_for(tasks.add_note.using(priority=49)) == "default"
    assert backend.queue_for(tasks.add_note.using(priority=50)) == "urgent"
    # a Django queue name the workers' queues cannot carry
    odd = WorkerBackend("default", {"QUEUES": ["no spaces"]})
    fake = SimpleNamespace(
        func=tasks.add_note.func,
        takes_context=False,
        priority=0,
        run_after=None,
        queue_name="no spaces",
        module_path="notes.tasks.add_note",
    )
    with pytest.raises(InvalidTask, match="not a valid queue name"):
        odd.validate_task(fake)
    with pytest.raises(ImproperlyConfigured, match="unknown"):
        WorkerBackend("default", {"OPTIONS": {"RETRIES": 3}})
    with pytest.raises(ImproperlyConfigured, match="PRIORITY_QUEUES"):
        WorkerBackend("default", {"OPTIONS": {"PRIORITY_QUEUES": {"urgent": "high"}}})
    # arguments JSON cannot hold are refused before anything is enqueued
    with pytest.raises(TypeError):
        tasks.add_note.enqueue(object())
    # an id the framework never ran for a Django task
    for unknown in ("no-such-job", "bad\nid"):
        with pytest.raises(TaskResultDoesNotExist):
            tasks.add_note.get_result(unknown)


def test_the_exception_path_is_read_off_the_traceback() -> None:
    from worker.contrib.django.results import exception_path

    tb = "Traceback (most recent call last):\n  ...\nnotes.errors.Missing: row 7\n"
    assert exception_path(tb, "Missing") == "notes.errors.Missing"
    assert exception_path("...\nLookupError: x\n", "LookupError") == "builtins.LookupError"
    assert exception_path("", "TimeoutError") == "builtins.TimeoutError"
    assert exception_path("CancelledError: aborted", "CancelledError") == "asyncio.CancelledError"
    assert exception_path("BadJob: oversized", "BadJob") == "builtins.Exception"


def test_a_job_that_ends_between_the_two_reads_is_read_as_ended(
    web: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``get_result`` reads the result record, then the job record: a job that ended in between
    (its record gone, its result written in the same script) is read from its result, not
    reported unknown."""
    from notes import tasks

    from worker.contrib.django import RUNNER
    from worker.core.codec import JobResult, JobStatus
    from worker.storage.handle import Job

    now = dt.datetime.now(dt.UTC)
    spec = {"task": "notes.tasks.add_note", "priority": 0, "queue": "default"}
    spec |= {"takes_context": False, "backend": "default"}
    ended = JobResult(
        RUNNER, (spec, ["x"], {}), {}, 1, now, None, "j1", True, {"id": 1}, now, now, "q"
    )
    reads = iter([None, ended])  # the first read: neither record; the second: the result

    async def result_info(self: Job) -> JobResult | None:
        return next(reads)

    async def info(self: Job) -> JobResult | None:
        return await self.result_info()  # the result, then the job record: both gone

    async def status(self: Job) -> JobStatus:
        return JobStatus.not_found

    monkeypatch.setattr(Job, "result_info", result_info)
    monkeypatch.setattr(Job, "info", info)
    monkeypatch.setattr(Job, "status", status)
    found = tasks.add_note.get_result("j1")
    assert found.status == "SUCCESSFUL" and found.return_value == {"id": 1}
