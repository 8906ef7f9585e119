"""The Redis Cluster hash tag of a key prefix is parsed in one place (``ids.hash_tag``), and
the settings' Cluster check and the job ids' slot tag agree on it (``{}`` is no tag)."""

from __future__ import annotations

import pytest

from worker.core.ids import hash_tag
from worker.storage.keys import Keys


@pytest.mark.parametrize(
    ("prefix", "tag"),
    [("{shop}:", "shop"), ("{shop}", "shop"), ("{}:", None), ("shop:", None), ("{shop", None)],
)
def test_one_hash_tag_for_settings_and_job_ids(prefix: str, tag: str | None) -> None:
    assert hash_tag(prefix) == tag
    assert Keys(prefix).slot_tag == ("" if tag is None else f"{{{tag}}}")
