"""Role-split background workers on arq: consumers scale out, singleton duties run once.

Public API::

    from worker import App, Client, Context, JobContext
"""

from __future__ import annotations

__version__ = "0.1.0"

from worker.app import App, load_app
from worker.client import BoundPoller, Client
from worker.context import Context, JobContext
from worker.errors import ConfigError, LeadershipLost
from worker.settings import Settings, load_settings

__all__ = [
    "App",
    "BoundPoller",
    "Client",
    "ConfigError",
    "Context",
    "JobContext",
    "LeadershipLost",
    "Settings",
    "__version__",
    "load_app",
    "load_settings",
]
