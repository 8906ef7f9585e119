"""The workers' app: ``WORKER_APP=jobs:app python -m worker run`` from this folder (with
``DJANGO_SETTINGS_MODULE=mysite.settings``). ``install`` sets Django up and registers the one
task that runs every Django ``@task`` function; ``record_tick`` is an ordinary periodic job of
the framework, run once per tick across all the workers, using the Django ORM."""

from __future__ import annotations

import os

from worker import App, JobContext
from worker.contrib.django import install

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")

# the Django queues, highest priority first (TASKS' PRIORITY_QUEUES sends priority >= 50 to urgent)
app = App("notes", queues=("urgent", "default"))
install(app)

from notes.models import Tick  # noqa: E402 (Django is set up by install)


@app.periodic(every=1)
def record_tick(ctx: JobContext) -> None:
    Tick.objects.create(at=ctx.tick, instance=ctx.context.instance_id)
