"""Integrations with other frameworks, each imported only by the code that uses it: nothing in
the rest of ``worker`` imports this package (``worker.contrib.django``: a backend for Django's
task framework)."""
