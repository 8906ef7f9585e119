"""The consumer's slice of the settings, and the bounds its parts share."""

from __future__ import annotations

from dataclasses import dataclass

from worker.storage.jobs import DEFAULT_RETENTION, Retention
from worker.storage.keys import DEFAULT_QUEUE

SUMMARY_EVERY_S = 60.0
#: arq's health-check key is rewritten this often (arq's own Worker: every hour by default).
HEALTH_EVERY_S = 300.0
#: arq's retry-counter TTL (88,400 s).
RETRY_TTL_MS = 88_400_000
#: Most jobs one claim round takes (the scripts unpack one argument per job).
MAX_CLAIM = 1000
#: After the drain, how long the consumer keeps trying to record (and confirm) the last ends.
FINAL_FLUSH_S = 3.0


@dataclass(frozen=True)
class ConsumerConfig:
    """The consumer's slice of the settings."""

    concurrency: int = 100
    #: slots only duty lane jobs may take (ticks, poll jobs), beside ``concurrency``: user jobs
    #: filling every shared slot never hold a duty back (see :meth:`Fetcher.claim_round`)
    duty_slots: int = 4
    poll_delay_s: float = 0.05
    idle_poll_max_s: float = 0.5
    #: the idle fallback look while the wake channel is subscribed (announcements wake it)
    idle_poll_subscribed_s: float = 30.0
    job_timeout_s: float = 300.0
    max_tries: int = 5
    keep_result_s: float = 3600.0
    shutdown_timeout_s: float = 30.0
    holds_ttl_s: float = 360.0
    max_payload_bytes: int = 4 * 1024 * 1024
    #: With no confirmed Redis round trip for this long, claims may have been reaped.
    doubt_s: float = 5.0
    #: Queues to take jobs from, highest priority first.
    queues: tuple[str, ...] = (DEFAULT_QUEUE,)
    #: Those of :attr:`queues` holding fair tasks' jobs (moved from their flow keys' queues
    #: round-robin before each claim; see :mod:`worker.storage.fair`), and flow keys' weights.
    fair: tuple[str, ...] = ()
    flow_weights: tuple[tuple[str, int], ...] = ()
    #: Burst mode (``python -m worker run --burst``, arq's ``burst``): once nothing runs and no
    #: job is due in ``queues``, stop claiming, drain, and set :attr:`Consumer.emptied`.
    burst: bool = False
    #: How many recent failures and completions FINISH keeps indexed (and for how long).
    retention: Retention = DEFAULT_RETENTION
