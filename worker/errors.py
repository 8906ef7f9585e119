"""Exceptions the framework raises and the CLI maps to exit codes."""

from __future__ import annotations


class WorkerError(Exception):
    """Base class for the framework's own errors."""


class ConfigError(WorkerError):
    """Bad configuration or start-up input. The message is one line; the CLI exits with 2."""


class LeadershipLost(WorkerError):
    """A fenced write was refused: this process no longer holds the leader lock."""
