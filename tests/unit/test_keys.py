"""One formatter and parser of `<topic>/<partition>`, used by events, records, Redis and scopes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compactd.errors import ConfigError
from compactd.keys import parse_partition_key, partition_key
from compactd.policy.thresholds import parse_scope
from compactd.state.keys import RedisKeys

TOPIC = st.text(alphabet="abcXYZ019._-", min_size=1, max_size=40)


@given(TOPIC, st.integers(min_value=0, max_value=2**31 - 1))
def test_round_trip(topic: str, partition: int) -> None:
    assert parse_partition_key(partition_key(topic, partition)) == (topic, partition)
    assert parse_partition_key(partition_key(topic, partition).encode()) == (topic, partition)
    assert parse_scope(f"partition:{partition_key(topic, partition)}") == ("partition", topic, partition)


@pytest.mark.parametrize("bad", ["orders", "orders/", "/3", "orders/-1", "orders/x"])
def test_malformed_keys_are_config_errors(bad: str) -> None:
    with pytest.raises(ConfigError):
        parse_partition_key(bad)


def test_every_per_topic_key_shares_the_topic_hash_tag() -> None:
    k = RedisKeys("cd")
    per_topic = [
        k.partition_records("t", 1),
        k.layout("t"),
        k.counted_groups("t"),
        k.groups("t"),
        k.partitions("t"),
        k.group_ids("t"),
        k.offset_buckets("t"),
        k.offset_bucket("t", "3", 0),
    ]
    assert all(key.startswith("cd:{t}:") for key in per_topic)
    assert {k.records, k.outbox, k.last, k.nudge} == {f"cd:{{act}}:{n}" for n in ("rec", "outbox", "last", "nudge")}
