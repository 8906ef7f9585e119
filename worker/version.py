"""The package version (one place; ``worker.__version__`` re-exports it)."""

__version__ = "0.1.0"
