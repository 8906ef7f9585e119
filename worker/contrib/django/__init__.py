"""A backend for Django's task framework (Django 6's ``django.tasks``, or the ``django-tasks``
package on Django 5.2): Django ``@task`` functions run on this framework's consumers.

The web side, in Django's settings::

    TASKS = {"default": {"BACKEND": "worker.contrib.django.WorkerBackend", "OPTIONS": {}}}

The workers' side, the app ``python -m worker`` runs::

    from worker.contrib.django import install
    install(app)    # django.setup() and the runner task

Importing this package imports Django; nothing else in ``worker`` imports it
(``pip install 'fenced-worker[django]'``). See docs/web-apps.md.
"""

from __future__ import annotations

from worker.contrib.django.backend import WorkerBackend, close_clients
from worker.contrib.django.runner import RUNNER, install

__all__ = ["RUNNER", "WorkerBackend", "close_clients", "install"]
