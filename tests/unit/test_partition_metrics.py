"""Per-partition metrics: what the forecast computes, and what a scrape shows (top-N, per topic, cluster)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from compactd.control.metrics import Metrics
from compactd.control.partition_metrics import PartitionMetrics
from compactd.model import PartitionView, Segment
from compactd.policy.forecast import partition_stats
from compactd.policy.thresholds import Thresholds

H = 3_600_000
NOW = 1_800_000_000_000


def view(min_committed: int | None = 250, **kw) -> PartitionView:
    segments = (
        Segment(0, 100, NOW - 9 * H, 1000, NOW - 8 * H),
        Segment(100, 200, NOW - 7 * H, 2000, NOW - 6 * H),
        Segment(200, 300, NOW - 2 * H, 4000, NOW - 30 * 60_000),
    )
    return PartitionView("orders", 0, segments, None, 0, min_committed, 1 if min_committed is not None else 0, **kw)


def test_stats_say_how_late_how_much_and_what_next() -> None:
    th = Thresholds.model_validate(
        {"max.compaction.lag.ms": 4 * H, "consumed.retention.ms": H, "forced.retention.ms": 7 * H}
    )
    st = partition_stats(view(), th, NOW)
    assert st.compaction_delay_ms(NOW) == 5 * H  # oldest dirty record 9 h old, 4 h allowed
    assert (st.consumed_offsets, st.consumed_bytes) == (200, 3000)  # both old segments are read by every group
    assert (st.forced_offsets, st.forced_bytes) == (100, 1000)  # only the 8 h old one is past 7 h
    # next: the 100-200 segment passes forced retention in 1 h; nothing left for consumed retention (the 200-300
    # segment is past the minimum); compaction is already overdue, so no future crossing
    assert dict(st.next_at) == {"forced_retention": NOW + H + 1}
    unknown = partition_stats(view(min_committed=None), th, NOW)
    assert (unknown.consumed_offsets, unknown.min_committed) == (0, None)


def series(registry: CollectorRegistry, prefix: str = "compactd_") -> list[str]:
    text = generate_latest(registry).decode()
    return [ln for ln in text.splitlines() if ln.startswith(prefix)]


def test_top_n_per_metric_and_aggregates_always() -> None:
    pm = PartitionMetrics(top_n=2, clock=lambda: NOW)
    registry = CollectorRegistry()
    registry.register(pm)
    th = Thresholds.model_validate({"max.compaction.lag.ms": H, "consumed.retention.ms": H})
    for p, age_h in enumerate([2, 5, 3, 9]):
        v = PartitionView(
            "t", p, (Segment(0, 10 * (p + 1), NOW - age_h * H, 100 * (p + 1), NOW - age_h * H),), None, 0, 500, 1
        )
        pm.update(("t", p), partition_stats(v, th, NOW))
    get = registry.get_sample_value
    assert get("compactd_max_compaction_delay_seconds") == 8 * 3600
    assert get("compactd_topic_compaction_delay_seconds", {"topic": "t"}) == 8 * 3600
    delays = [ln for ln in series(registry, "compactd_compaction_delay_seconds{")]
    assert len(delays) == 2 and 'partition="3"' in delays[0] and 'partition="1"' in delays[1]
    assert get("compactd_topic_deletable_bytes", {"topic": "t", "retention": "consumed"}) == 1000
    assert get("compactd_cluster_deletable_bytes", {"retention": "consumed"}) == 1000
    assert get("compactd_deletable_bytes", {"topic": "t", "partition": "3", "retention": "consumed"}) == 400
    assert get("compactd_deletable_bytes", {"topic": "t", "partition": "0", "retention": "consumed"}) is None
    # partition 3 is compacted and everything deleted: it leaves every top-N list, another takes its place
    pm.update(("t", 3), partition_stats(PartitionView("t", 3, (), None, 40, 500, 1), th, NOW))
    assert get("compactd_compaction_delay_seconds", {"topic": "t", "partition": "3"}) is None
    assert get("compactd_compaction_delay_seconds", {"topic": "t", "partition": "2"}) == 2 * 3600
    pm.forget(("t", 1))
    assert get("compactd_tracked_partitions") == 3


def test_ten_thousand_partitions_stay_a_few_hundred_series() -> None:
    metrics = Metrics(CollectorRegistry(), top_n=100)
    metrics.partitions.clock = lambda: NOW
    th = Thresholds.model_validate(
        {"max.compaction.lag.ms": H, "consumed.retention.ms": H, "forced.retention.ms": 2 * H}
    )
    for i in range(10_000):
        topic, p = f"topic-{i % 20}", i // 20
        seg = Segment(0, 100, NOW - (2 + i % 7) * H, 1000 + i, NOW - (1 + i % 5) * H)
        v = PartitionView(topic, p, (seg, Segment(100, 200, NOW - H // 2, 10, NOW - H // 4)), None, 0, 100, 1)
        metrics.partitions.update((topic, p), partition_stats(v, th, NOW))
    lines = series(metrics.registry)
    per_partition = [ln for ln in lines if 'partition="' in ln]
    # every partition is overdue, deletable, has a next action and a tombstone deadline: each per-partition metric
    # is cut at 100
    assert 100 < len(per_partition) <= 7 * 100
    assert len(lines) < 1100, len(lines)  # 1,050: 930 before the tombstone deadline's 100 + 20 series
    assert all('group="' not in ln and 'grp="' not in ln for ln in lines)  # no label names a group


def test_every_sample_carries_the_cluster_name() -> None:
    metrics = Metrics(top_n=10, cluster="eu-west")
    metrics.actions.labels("compact", "max_compaction_lag", "sent").inc()
    metrics.partitions.update(
        ("t", 0), partition_stats(view(), Thresholds.model_validate({"max.compaction.lag.ms": H}), NOW)
    )
    lines = series(metrics.registry)
    assert lines and all('cluster="eu-west"' in ln for ln in lines)
    get = metrics.registry.get_sample_value
    assert (
        get(
            "compactd_actions_total",
            {"action": "compact", "reason": "max_compaction_lag", "status": "sent", "cluster": "eu-west"},
        )
        == 1
    )


def test_time_to_erasure_is_per_partition_most_overdue_first_and_per_topic_the_latest() -> None:
    """`compactd_partition_time_to_erasure_seconds`: deadline - now at scrape time, negative once passed, for the
    top-N soonest (the most overdue first); the topic's figure is its latest partition, when all its tombstones go."""
    clock = [NOW]
    pm = PartitionMetrics(top_n=2, clock=lambda: clock[0])
    registry = CollectorRegistry()
    registry.register(pm)
    th = Thresholds.model_validate({"max.compaction.lag.ms": 60_000, "delete.retention.ms": H})
    seg = (Segment(0, 100, NOW - 2 * H, 10, NOW - 2 * H),)
    for p, seen in enumerate([NOW - 2 * H, NOW - 3 * H, NOW, NOW - H // 2]):  # when each partition's clean was seen
        pm.update(("t", p), partition_stats(PartitionView("t", p, seg, 100, 0, None, 0, seen), th, NOW))
    pm.update(("t", 4), partition_stats(PartitionView("t", 4, seg, 100, 0, None, 0, None), th, NOW))  # unknown
    pm.update(("u", 0), partition_stats(PartitionView("u", 0, seg, 100, 0, None, 0, NOW), Thresholds(), NOW))  # no lag
    get = registry.get_sample_value
    # deadline = seen + delete.retention.ms + max.compaction.lag.ms
    assert get("compactd_partition_time_to_erasure_seconds", {"topic": "t", "partition": "1"}) == -2 * 3600 + 60
    assert get("compactd_partition_time_to_erasure_seconds", {"topic": "t", "partition": "0"}) == -3600 + 60
    assert len(series(registry, "compactd_partition_time_to_erasure_seconds{")) == 2  # top-N: the most overdue
    assert get("compactd_topic_time_to_erasure_seconds", {"topic": "t"}) == 3600 + 60  # partition 2, the latest
    assert get("compactd_topic_time_to_erasure_seconds", {"topic": "u"}) is None
    clock[0] += 3600_000  # an hour on: the same deadlines, an hour closer
    assert get("compactd_topic_time_to_erasure_seconds", {"topic": "t"}) == 60
