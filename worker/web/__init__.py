"""The operator console: ``python -m worker web``, one page and a small JSON API over Redis.

It reads only Redis (the cluster may be running or not) and acts through
:mod:`worker.ops.actions`, the same code as the command line. :func:`create_app` builds it as an
aiohttp application (to mount into another one); :func:`serve` runs it alone.
"""

from worker.web.app import create_app, serve

__all__ = ["create_app", "serve"]
