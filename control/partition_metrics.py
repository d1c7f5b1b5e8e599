"""Per-partition and per-topic metrics, computed at scrape time from what the controller last evaluated.

The controller hands each evaluated partition's `PartitionStats` to `update`; nothing here reads Redis. A scrape
turns them into series: per-topic aggregates always, per-partition series only for the `top_n` worst partitions of
each metric (largest delay, oldest dirty record, most deletable bytes, soonest next action, soonest or most overdue
tombstone erasure): at most 7 x top_n per-partition series (deletable bytes has one per retention level); deletable
offsets are per topic only. A partition that leaves a top-N list leaves the scrape with it. Consumer groups never
become label values.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from compactd.clock import now_ms
from compactd.model import PartitionRef
from compactd.policy.forecast import PartitionStats


def _top(n: int, scored: Iterable[tuple[float, PartitionRef]]) -> list[tuple[float, PartitionRef]]:
    return heapq.nlargest(n, scored, key=lambda item: item[0])


class PartitionMetrics(Collector):
    def __init__(self, top_n: int = 100, clock: Callable[[], int] = now_ms) -> None:
        self.top_n = top_n
        self.clock = clock
        self._stats: dict[PartitionRef, PartitionStats] = {}
        self._lock = threading.Lock()

    def update(self, key: PartitionRef, stats: PartitionStats) -> None:
        with self._lock:
            self._stats[key] = stats

    def update_many(self, items: Iterable[tuple[PartitionRef, PartitionStats]]) -> None:
        """`update` for a chunk, under one lock."""
        with self._lock:
            self._stats.update(items)

    def forget(self, key: PartitionRef) -> None:
        with self._lock:
            self._stats.pop(key, None)

    def __len__(self) -> int:
        return len(self._stats)

    def __contains__(self, key: object) -> bool:
        return key in self._stats

    def describe(self) -> list[Any]:
        return []  # series come and go with the top-N lists: nothing fixed to declare

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self.clock()
        with self._lock:
            items = list(self._stats.items())
        yield from self._cluster(items, now)
        yield from self._per_topic(items, now)
        yield from self._per_partition(items, now)

    # ---- cluster ----

    def _cluster(self, items: list[tuple[PartitionRef, PartitionStats]], now: int) -> Iterator[GaugeMetricFamily]:
        delay = max((st.compaction_delay_ms(now) for _, st in items), default=0)
        yield GaugeMetricFamily(
            "compactd_max_compaction_delay_seconds",
            "KIP-354 max-compaction-delay-secs over every tracked partition: max(now - earliest - lag, 0)",
            value=delay / 1000,
        )
        yield GaugeMetricFamily("compactd_tracked_partitions", "Partitions compactd has evaluated", value=len(items))
        fam = GaugeMetricFamily(
            "compactd_cluster_deletable_bytes",
            "Bytes deletable now over every tracked partition, by retention level",
            labels=["retention"],
        )
        fam.add_metric(["consumed"], sum(st.consumed_bytes for _, st in items))
        fam.add_metric(["forced"], sum(st.forced_bytes for _, st in items))
        yield fam

    # ---- per topic ----

    def _per_topic(self, items: list[tuple[PartitionRef, PartitionStats]], now: int) -> Iterator[GaugeMetricFamily]:
        delay: dict[str, int] = {}
        age: dict[str, int] = {}
        offsets: dict[tuple[str, str], int] = {}
        size: dict[tuple[str, str], int] = {}
        nxt: dict[tuple[str, str], int] = {}
        erased: dict[str, int] = {}
        for (topic, _), st in items:
            if st.erasure_at is not None:
                erased[topic] = max(erased.get(topic, st.erasure_at), st.erasure_at)
            delay[topic] = max(delay.get(topic, 0), st.compaction_delay_ms(now))
            if st.earliest_ts is not None:
                age[topic] = max(age.get(topic, 0), now - st.earliest_ts)
            for level, n, b in (
                ("consumed", st.consumed_offsets, st.consumed_bytes),
                ("forced", st.forced_offsets, st.forced_bytes),
            ):
                offsets[(topic, level)] = offsets.get((topic, level), 0) + n
                size[(topic, level)] = size.get((topic, level), 0) + b
            for rule, at in st.next_at:
                if at < nxt.get((topic, rule), 2**63):
                    nxt[(topic, rule)] = at
        yield _family(
            "compactd_topic_compaction_delay_seconds",
            "Largest compaction delay of the topic",
            ["topic"],
            [((t,), v / 1000) for t, v in sorted(delay.items())],
        )
        yield _family(
            "compactd_topic_earliest_uncompacted_age_seconds",
            "Age of the topic's oldest dirty record",
            ["topic"],
            [((t,), v / 1000) for t, v in sorted(age.items())],
        )
        yield _family(
            "compactd_topic_deletable_offsets",
            "Offsets deletable now, summed over the topic",
            ["topic", "retention"],
            sorted(offsets.items()),
        )
        yield _family(
            "compactd_topic_deletable_bytes",
            "Bytes deletable now, summed over the topic",
            ["topic", "retention"],
            sorted(size.items()),
        )
        yield _family(
            "compactd_topic_next_action_timestamp_seconds",
            "Soonest next threshold crossing of the topic (epoch seconds), by rule",
            ["topic", "rule"],
            [(k, v / 1000) for k, v in sorted(nxt.items())],
        )
        yield _family(
            "compactd_topic_time_to_erasure_seconds",
            "Seconds until every tombstone the topic holds now is gone, if records keep arriving (its latest "
            "partition; negative: overdue)",
            ["topic"],
            [((t,), (at - now) / 1000) for t, at in sorted(erased.items())],
        )

    # ---- per partition, top-N ----

    def _per_partition(self, items: list[tuple[PartitionRef, PartitionStats]], now: int) -> Iterator[GaugeMetricFamily]:
        n = self.top_n
        by_key = dict(items)
        delays = _top(n, [(d, k) for k, st in items if (d := st.compaction_delay_ms(now)) > 0])
        yield _family(
            "compactd_compaction_delay_seconds",
            "KIP-354 delay of a partition past max.compaction.lag.ms (top-N worst)",
            ["topic", "partition"],
            [((k[0], str(k[1])), d / 1000) for d, k in delays],
        )
        ages = _top(n, [(now - st.earliest_ts, k) for k, st in items if st.earliest_ts is not None])
        yield _family(
            "compactd_earliest_uncompacted_age_seconds",
            "Age of the partition's oldest uncompacted record (top-N oldest)",
            ["topic", "partition"],
            [((k[0], str(k[1])), a / 1000) for a, k in ages],
        )
        scored = [
            (max(st.consumed_bytes, st.forced_bytes), k) for k, st in items if st.consumed_offsets or st.forced_offsets
        ]
        keys = [k for _, k in _top(n, scored)]
        yield _family(
            "compactd_deletable_bytes",
            "Bytes deletable now (top-N partitions)",
            ["topic", "partition", "retention"],
            _levels(keys, by_key),
        )
        yield _family(
            "compactd_min_committed_offset",
            "Minimum committed offset of the counted groups (partitions of the deletable top-N)",
            ["topic", "partition"],
            [((k[0], str(k[1])), by_key[k].min_committed) for k in keys if by_key[k].min_committed is not None],
        )
        crossings = [(at, (k[0], str(k[1]), rule)) for k, st in items for rule, at in st.next_at]
        soonest = heapq.nsmallest(n, crossings, key=lambda item: item[0])
        yield _family(
            "compactd_next_action_timestamp_seconds",
            "When the partition next crosses a threshold (epoch seconds; top-N soonest)",
            ["topic", "partition", "rule"],
            [(labels, at / 1000) for at, labels in soonest],
        )
        # the most overdue first: a bound that has passed is a topic no write made Kafka clean again (rules.erasure)
        erasures = heapq.nsmallest(
            n, [(st.erasure_at, k) for k, st in items if st.erasure_at is not None], key=lambda item: item[0]
        )
        yield _family(
            "compactd_partition_time_to_erasure_seconds",
            "Seconds until the tombstones the partition holds now are gone (KIP-534's second cleaner pass), if records "
            "keep arriving; negative: overdue (top-N soonest)",
            ["topic", "partition"],
            [((k[0], str(k[1])), (at - now) / 1000) for at, k in erasures],
        )


def _levels(keys: list[PartitionRef], by_key: dict[PartitionRef, PartitionStats]) -> Iterator[Any]:
    for key in keys:
        st = by_key[key]
        for level, offsets, size in (
            ("consumed", st.consumed_offsets, st.consumed_bytes),
            ("forced", st.forced_offsets, st.forced_bytes),
        ):
            if offsets:
                yield (key[0], str(key[1]), level), size


def _family(name: str, doc: str, labels: list[str], samples: Iterable[tuple[Any, float]]) -> GaugeMetricFamily:
    fam = GaugeMetricFamily(name, doc, labels=labels)
    for values, value in samples:
        fam.add_metric(list(values), value)
    return fam
