"""The consumer, in parts: fetch loop, one-job executor, batched completer, claims and guard.

:class:`Consumer` (:mod:`.consumer`) assembles them; features attach through
:class:`worker.core.jobdefs.JobHook`. This module only re-exports.
"""

from worker.consumer.config import ConsumerConfig
from worker.consumer.consumer import Consumer
from worker.consumer.envelope import BadJob, validate
from worker.consumer.guard import ClaimGuard

__all__ = ["BadJob", "ClaimGuard", "Consumer", "ConsumerConfig", "validate"]
