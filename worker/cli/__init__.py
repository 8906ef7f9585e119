"""Command line: ``python -m worker COMMAND`` (also the installed ``worker`` script).

``run`` (the default) runs a worker process; ``plan`` shows what a role runs; ``status``,
``health``, ``doctor`` and ``dead`` look at the cluster; ``trigger``, ``pause``, ``resume``,
``handoff`` and the ``dead`` actions act on it through :class:`worker.ops.actions.Operations`, the
console's door, so each is audited. ``worker COMMAND --help`` lists a command's own options.

- :mod:`worker.cli.parser`: the commands, their options and help;
- :mod:`worker.cli.main`: settings, errors and exit codes;
- :mod:`worker.cli.process`: ``run``, ``plan``, ``health``, ``web``;
- :mod:`worker.cli.cluster`: ``status``, ``doctor``, the ``dead`` listing (the read model);
- :mod:`worker.cli.operate`: the actions (``Operations``).

Bad input exits with code 2 and one line on stderr naming the variable and what is accepted;
no traceback. Output into a closed pipe (``status | head -1``) exits quietly with code 1.
"""

from __future__ import annotations

from worker.cli.main import main

__all__ = ["main"]
