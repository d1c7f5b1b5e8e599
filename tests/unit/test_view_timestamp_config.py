"""The view's timestamp settings in the terms of the broker it is created on: Kafka 2.8 to 3.5 refuse a topic config
they do not know, and bound a timestamp both ways with one setting (the 2.8 line of the version matrix failed every
view creation with "Unknown topic config name: message.timestamp.before.max.ms" before)."""

from __future__ import annotations

from compactd.compaction.cluster import VIEW_TIMESTAMP_CONFIG, view_timestamp_config

NEWEST = {"message.timestamp.type", "message.timestamp.before.max.ms", "message.timestamp.after.max.ms"}


def test_a_broker_with_kip_937s_bounds_gets_both_and_nothing_else() -> None:
    assert view_timestamp_config(NEWEST | {"message.timestamp.difference.max.ms"}) == VIEW_TIMESTAMP_CONFIG
    assert view_timestamp_config(()) == VIEW_TIMESTAMP_CONFIG  # nothing described: the newest broker's terms


def test_a_broker_before_3_6_gets_its_one_bound_and_no_name_it_does_not_know() -> None:
    old = {"message.timestamp.type", "message.timestamp.difference.max.ms", "max.message.bytes"}
    got = view_timestamp_config(old)
    assert got == {"message.timestamp.type": "CreateTime", "message.timestamp.difference.max.ms": str(2**63 - 1)}
    assert set(got) <= old
