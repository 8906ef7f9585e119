"""Queue shard prefixes: one per slot range (a typical cluster's masters), stable, home first."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from worker.storage.shards import shard_of, shard_prefixes, slot_of_prefix


@pytest.mark.parametrize("prefix", ["{shop}:", "{bench}:", "{a}:", "{x}:w:", "{billing.eu}:"])
@pytest.mark.parametrize("n", [2, 3, 4, 6])
def test_each_shard_has_its_own_slot_range_and_keys_share_the_shard_slot(
    prefix: str, n: int
) -> None:
    prefixes = shard_prefixes(prefix, n)
    assert prefixes[0] == prefix and len(set(prefixes)) == n
    ranges = [slot_of_prefix(p) * n // 16384 for p in prefixes]
    assert sorted(ranges) == list(range(n))
    for p in prefixes:
        assert key_slot(f"{p}queue".encode()) == key_slot(f"arq:job:{p}abc".encode())
        assert "#" not in prefix and (p == prefix or "#" in p)


def test_one_shard_is_the_unsharded_layout_and_bad_input_is_refused() -> None:
    assert shard_prefixes("worker:", 1) == ("worker:",)
    with pytest.raises(ValueError, match="hash-tagged"):
        shard_prefixes("worker:", 2)
    with pytest.raises(ValueError, match=r"1\.\.64"):
        shard_prefixes("{a}:", 65)


def test_shard_of_is_stable_and_spreads() -> None:
    assert shard_of("arq-id-1", 1) == 0
    assert shard_of("order:42", 3) == shard_of("order:42", 3)
    counts = [0, 0, 0]
    for i in range(3000):
        counts[shard_of(f"job-{i}", 3)] += 1
    assert min(counts) > 800, counts


def test_the_setting_allows_exactly_the_shards_the_layout_can_make() -> None:
    from worker.settings import Settings
    from worker.storage.shards import MAX_SHARDS

    assert Settings.model_fields["queue_shards"].metadata[-1].le == MAX_SHARDS  # type: ignore[attr-defined]
