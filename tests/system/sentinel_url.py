"""The Sentinel tests' fixtures, imported by the test modules that use them: ``sentinels``
(1 primary + 1 replica + 3 Sentinels, failure detected after 2 s) and ``on_sentinels``, which
makes ``redis_url`` (and so ``spawn``) the set's ``redis+sentinel://`` URL; a module may define
its own ``sentinels`` (another shape) and still import ``on_sentinels``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.topology import SentinelSet


@pytest.fixture(name="redis_url")
def on_sentinels(sentinels: SentinelSet) -> str:
    """Overrides conftest's ``redis_url``: ``spawn`` starts its processes on the Sentinel set."""
    return sentinels.url()


@pytest.fixture
def sentinels() -> Iterator[SentinelSet]:
    """1 primary + 1 replica + 3 Sentinels, failure detected after 2 s
    (tests/system/test_failover.py:
    1 s judged a loaded CI machine's live primary down)."""
    with SentinelSet(replicas=1, down_after_ms=2000, failover_timeout_ms=3000) as s:
        yield s
