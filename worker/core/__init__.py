"""The core: the job wire format (:mod:`worker.core.codec`) and the retry requests a task
raises (:mod:`worker.core.retries`). No Redis I/O and no settings."""
