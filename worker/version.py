"""The version (one place; ``worker.__version__`` re-exports it) and the distribution name."""

from __future__ import annotations

__version__ = "0.1.0"

#: The name it is installed by (``pip install fenced-worker``): the PyPI name ``worker`` belongs
#: to an unrelated package. The import package and the console script are both ``worker``.
DIST_NAME = "fenced-worker"


def describe() -> str:
    """``<distribution> <version>`` as the installed metadata says (``--version``); the source's
    own version when run from a tree that is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{DIST_NAME} {version(DIST_NAME)}"
    except PackageNotFoundError:
        return f"{DIST_NAME} {__version__} (not installed)"
