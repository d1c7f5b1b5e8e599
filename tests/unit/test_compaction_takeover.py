"""compaction.retention.takeover, the pure part: when a topic's retention is taken over, and how the taken retention
becomes forced retention in the thresholds."""

from __future__ import annotations

from compactd.compaction.manifest import Manifest, ViewPartition
from compactd.compaction.takeover import Takeover, overlay, wanted
from compactd.policy.thresholds import resolve

DAY = 86_400_000
ON = {"compaction.service": True, "compaction.retention.takeover": True, "dry.run": False}
PUBLISHED = Manifest("t", "t.compacted", 2, partitions={"0": ViewPartition(10, 0, 3)})


def th(**extra: object):
    return resolve({"topic:t": {**ON, **extra}}, "t")


def test_a_topic_is_taken_over_only_with_a_published_view_of_its_log_a_delete_policy_and_known_segments() -> None:
    assert wanted(th(), PUBLISHED, False, "delete", True) is None
    assert wanted(th(), PUBLISHED, False, "compact, delete", True) is None
    assert "off" in wanted(th(**{"compaction.retention.takeover": False}), PUBLISHED, False, "delete", True)
    assert "off" in wanted(th(**{"compaction.service": False}), PUBLISHED, False, "delete", True)
    assert "dry.run" in wanted(th(**{"dry.run": True}), PUBLISHED, False, "delete", True)
    assert "no generation" in wanted(th(), None, False, "delete", True)
    assert "no generation" in wanted(th(), Manifest("t", "t.compacted", 0), False, "delete", True)
    assert "another log" in wanted(th(), PUBLISHED, True, "delete", True)
    assert "deletes nothing" in wanted(th(), PUBLISHED, False, "compact", True)
    assert "no segment events" in wanted(th(), PUBLISHED, False, "delete", False)


def test_the_taken_retention_is_forced_retention_the_lower_of_the_two_in_every_scope_that_sets_it() -> None:
    tk = Takeover("t", "604800000", 7 * DAY, 0)
    layers = {"global": {"forced.retention.ms": 30 * DAY}, "partition:t/1": {"forced.retention.ms": DAY}}
    out = overlay(layers, [tk])
    assert resolve(out, "t").forced_retention_ms == 7 * DAY
    assert resolve(out, "t", 1).forced_retention_ms == DAY  # a partition's own, shorter, stays
    assert resolve(out, "other").forced_retention_ms == 30 * DAY  # other topics untouched
    assert resolve(overlay({"topic:t": {"forced.retention.ms": DAY}}, [tk]), "t").forced_retention_ms == DAY
    assert resolve(overlay({}, [tk]), "t").forced_retention_ms == 7 * DAY
    longer = overlay({"partition:t/2": {"forced.retention.ms": 60 * DAY}}, [tk])
    assert resolve(longer, "t", 2).forced_retention_ms == 7 * DAY
    assert layers == {"global": {"forced.retention.ms": 30 * DAY}, "partition:t/1": {"forced.retention.ms": DAY}}


def test_a_takeover_round_trips_through_its_ledger_record() -> None:
    tk = Takeover("t", None, 7 * DAY, 123)
    assert Takeover.from_json(tk.to_json()) == tk
    assert Takeover.from_json({"topic": "t"}) is None  # not ours: ignored
