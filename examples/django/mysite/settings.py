"""The example project's settings: one app (``notes``), SQLite, and Django's task framework on
the worker framework (``TASKS``). Django 6 has the task framework built in; on Django 5.2 it is
the ``django-tasks`` package, which is then an installed app too."""

from __future__ import annotations

import os
from pathlib import Path

import django

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "mysite.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = ["notes"]
if django.VERSION < (6, 0):
    INSTALLED_APPS.append("django_tasks")

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("NOTES_DB", str(BASE_DIR / "notes.sqlite3")),
        # the web process and the workers write the one file: wait for its lock
        "OPTIONS": {"timeout": 20},
    }
}

TASKS = {
    "default": {
        "BACKEND": "worker.contrib.django.WorkerBackend",
        # Django's queue names the tasks may use; the workers take them in App(queues=...)
        "QUEUES": ["default", "urgent"],
        "OPTIONS": {
            # a task of priority 50 or more waits in "urgent", which the workers take first
            "PRIORITY_QUEUES": {"urgent": 50},
            # the connection: the WORKER_* environment, as the workers read it
            "SETTINGS": {},
        },
    }
}
