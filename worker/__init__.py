"""Role-split background workers on arq: consumers scale out, singleton duties run once.

Public API::

    from worker import App, Client, Context, JobContext, JobOutcome, SyncClient

An arq app moves in unchanged: ``worker.from_arq(WorkerSettings)`` is its :class:`App`, and
``python -m worker --arq-settings module:WorkerSettings`` runs it (docs/moving-from-arq.md).
"""

from __future__ import annotations

from worker.app import App, load_app
from worker.arqcompat import from_arq
from worker.bulk import JobSpec
from worker.client import Client
from worker.context import Context, JobContext
from worker.core.errors import ConfigError, InvalidId, LeadershipLost, PayloadTooLarge, UnknownTask
from worker.core.jobdefs import JobOutcome
from worker.polls import BoundPoller
from worker.settings import Settings, load_settings
from worker.sync_client import SyncClient
from worker.version import __version__

__all__ = [
    "App",
    "BoundPoller",
    "Client",
    "ConfigError",
    "Context",
    "InvalidId",
    "JobContext",
    "JobOutcome",
    "JobSpec",
    "LeadershipLost",
    "PayloadTooLarge",
    "Settings",
    "SyncClient",
    "UnknownTask",
    "__version__",
    "from_arq",
    "load_app",
    "load_settings",
]
