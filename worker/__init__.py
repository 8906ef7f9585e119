"""Role-split background workers speaking arq's job format: consumers scale out, singleton
duties run once.

Public API::

    from worker import App, Client, Context, JobContext, JobOutcome, SyncClient
    from worker import Retry, JobStatus     # raise Retry(defer=...) in a task; Job.status()

An arq app moves in unchanged: ``worker.from_arq(WorkerSettings)`` is its :class:`App`, and
``python -m worker --arq-settings module:WorkerSettings`` runs it (docs/moving-from-arq.md).
"""

from __future__ import annotations

from worker import outbox
from worker.app import App, load_app
from worker.arqcompat import from_arq
from worker.bulk import JobSpec
from worker.client import Client
from worker.context import Context, JobContext
from worker.core.codec import JobResult, JobStatus
from worker.core.errors import (
    ConfigError,
    InvalidId,
    JobExpired,
    LeadershipLost,
    PayloadTooLarge,
    UnknownTask,
)
from worker.core.jobdefs import JobOutcome
from worker.core.retry import Retry, RetryJob
from worker.core.workflow import Job, Workflow, WorkflowInfo, chain, chord, group
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
    "Job",
    "JobContext",
    "JobExpired",
    "JobOutcome",
    "JobResult",
    "JobSpec",
    "JobStatus",
    "LeadershipLost",
    "PayloadTooLarge",
    "Retry",
    "RetryJob",
    "Settings",
    "SyncClient",
    "UnknownTask",
    "Workflow",
    "WorkflowInfo",
    "__version__",
    "chain",
    "chord",
    "from_arq",
    "group",
    "load_app",
    "load_settings",
    "outbox",
]
