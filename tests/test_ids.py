"""The key prefix's Redis Cluster hash tag is parsed in one place, the way Redis Cluster does."""

from __future__ import annotations

import pytest

from worker.ids import hash_tag
from worker.storage.keys import Keys


@pytest.mark.parametrize(
    ("prefix", "tag"),
    [("{shop}:", "shop"), ("{a}{b}:", "a"), ("shop:", None), ("{}:", None), ("{shop:", None)],
)
def test_hash_tag(prefix: str, tag: str | None) -> None:
    assert hash_tag(prefix) == tag
    assert Keys(prefix=prefix).slot_tag == ("" if tag is None else f"{{{tag}}}")
