"""Prometheus metrics of the driver.

Labels of these metrics are bounded (kinds, reasons, statuses, source topics, scopes). Per-topic and per-partition
series come from `partition_metrics.PartitionMetrics` (top-N); consumer groups never become label values. Every series
whose label values are known in advance (`compactd.labels`) is exported at 0 from start-up, the source topics' from
the job's start (`init_source_topics`): `increase()` then sees a counter's first increment.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from compactd import labels
from compactd.control.partition_metrics import PartitionMetrics


class ClusterRegistry(CollectorRegistry):
    """A registry whose every sample carries `cluster="<name>"`: jobs for several Kafka clusters can share one
    Prometheus and one set of dashboards."""

    def __init__(self, cluster: str = "default") -> None:
        super().__init__()
        self.cluster = cluster

    def collect(self) -> Iterator[Metric]:
        for family in super().collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            labelled.samples = [
                Sample(s.name, {**s.labels, "cluster": self.cluster}, s.value, s.timestamp, s.exemplar)
                for s in family.samples
            ]
            yield labelled


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None, top_n: int = 100, cluster: str = "default") -> None:
        registry = registry if registry is not None else ClusterRegistry(cluster)
        self.registry = registry
        self.partitions = PartitionMetrics(top_n)
        registry.register(self.partitions)
        self.input_records = Counter(
            "compactd_input_records", "Decoded input records by stream and kind", ["stream", "kind"], registry=registry
        )
        self.dlq_records = Counter(
            "compactd_dlq_records", "Rejected input records sent to the DLQ", ["stream", "reason"], registry=registry
        )
        self.actions = Counter(
            "compactd_actions",
            "Action records by action, reason and final status",
            ["action", "reason", "status"],
            registry=registry,
        )
        self.batches = Counter("compactd_batches", "Micro-batches merged", ["outcome"], registry=registry)
        self.batch_seconds = Histogram(
            "compactd_batch_seconds",
            "Time to merge, decide and act on one micro-batch",
            registry=registry,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.evaluations = Counter(
            "compactd_partition_evaluations", "Partitions evaluated by the policy", ["trigger"], registry=registry
        )
        self.merge_seconds = Histogram(
            "compactd_merge_seconds",
            "Time to merge one micro-batch into Redis (the Lua scripts of every topic it touches)",
            registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.batch_records = Histogram(
            "compactd_batch_records",
            "Input records per micro-batch",
            registry=registry,
            buckets=(0, 10, 100, 1_000, 10_000, 100_000, 500_000, 1_000_000),
        )
        self.last_batch = Gauge(
            "compactd_last_batch_timestamp_seconds",
            "When the last micro-batch finished (epoch seconds)",
            registry=registry,
        )
        self.last_tick = Gauge(
            "compactd_last_tick_timestamp_seconds",
            "When the driver's deadline ticker last ran (epoch seconds): the job's heartbeat",
            registry=registry,
        )
        self.trigger_interval = Gauge(
            "compactd_trigger_interval_seconds", "The configured trigger interval", registry=registry
        )
        self.source_lag = Gauge(
            "compactd_source_lag_records",
            "Records in each source topic not yet processed: latest offsets minus the last completed batch's end",
            ["topic"],
            registry=registry,
        )
        self.source_records_lost = Counter(
            "compactd_source_records_lost",
            "Records of a source topic deleted (retention, deleteRecords) before the stream read them",
            ["topic"],
            registry=registry,
        )
        self.offsets_caught_up = Gauge(
            "compactd_offsets_caught_up",
            "1 when deletes are allowed: __consumer_offsets read to where it ended at start, no state rebuild pending",
            registry=registry,
        )
        self.state_losses = Counter(
            "compactd_state_losses",
            "Times Redis did not hold the state the checkpoint assumes (flushed, restarted empty, lost writes)",
            registry=registry,
        )
        self.topic_resets = Counter(
            "compactd_topic_resets",
            "Times a topic's state was reset because its log is not the one the state described (re-created topic, or "
            "a log truncated below it)",
            registry=registry,
        )
        self.topics_forgotten = Counter(
            "compactd_topics_forgotten", "Topics deleted from the cluster whose state was dropped", registry=registry
        )
        self.readers = Gauge(
            "compactd_reader",
            "1 per reader that commits no group offsets (share groups, declared Spark checkpoints and pins), named, "
            "with its kind and state: counting, blind (its position cannot be read: it holds its topics), expired "
            "(a pin past its lease: it no longer counts), starting (a checkpoint with no batch committed), invalid",
            ["reader", "kind", "state"],
            registry=registry,
        )
        self.groups_unlisted = Gauge(
            "compactd_groups_unlisted",
            "Groups compactd counts on the topic that the cluster does not list (no Describe ACL, or deleted), as of "
            "the last delete checked against the cluster",
            ["topic"],
            registry=registry,
        )
        self.state_rebuilding = Gauge(
            "compactd_state_rebuilding",
            "1 while a lost state is rebuilt from the sources (deletes held)",
            registry=registry,
        )
        self.redis_outages = Counter(
            "compactd_redis_outages", "Times Redis stopped answering while the job ran", registry=registry
        )
        self.redis_up = Gauge("compactd_redis_up", "0 while Redis does not answer the job, else 1", registry=registry)
        self.state_keys = Gauge("compactd_state_keys", "Keys in compactd's Redis database", registry=registry)
        self.state_bytes = Gauge("compactd_state_memory_bytes", "Redis used_memory", registry=registry)
        self.outbox_depth = Gauge("compactd_outbox_depth", "Actions decided and not yet carried out", registry=registry)
        self.actions_held = Gauge(
            "compactd_actions_held",
            "Due actions the last dispatch held back (actions.per.second, compaction.max.concurrent, a failed send)",
            registry=registry,
        )
        self.deletes_behind_hw = Gauge(
            "compactd_deletes_behind_high_watermark",
            "Deletes the last dispatch held because they go past the partition's high watermark on the log the state "
            "describes: a follower is catching up (a gap lasting 120 s counts as a truncated log: the topic is reset)",
            registry=registry,
        )
        self.config_events = Counter(
            "compactd_config_events",
            "Config events by result: applied, replayed, rejected",
            ["result"],
            registry=registry,
        )
        self.config_version = Gauge(
            "compactd_config_version",
            "Version of the config applied per scope (scopes are few)",
            ["scope"],
            registry=registry,
        )
        # the compaction service, per topic with the service on (few by design: label values are those topics)
        self.compaction_runs = Counter(
            "compactd_compaction_runs",
            "Compaction runs of the service by topic and status",
            ["topic", "status"],
            registry=registry,
        )
        self.compaction_running = Gauge(
            "compactd_compaction_running",
            "1 while a compaction run of the topic is in progress",
            ["topic"],
            registry=registry,
        )
        self.compaction_backoff = Gauge(
            "compactd_compaction_backoff_seconds",
            "After failed runs of the topic in a row: how long the trigger waits before it tries again (0: none)",
            ["topic"],
            registry=registry,
        )
        self.compaction_last = Gauge(
            "compactd_compaction_last",
            "The last successful run: keys, records_in, records_out, bytes_in, bytes_out, seconds, generation, "
            "dirty_ratio (the largest share of a partition's view range that delta runs appended)",
            ["topic", "figure"],
            registry=registry,
        )
        self.compaction_beyond_records = Gauge(
            "compactd_compaction_beyond_horizon_records",
            "Source records beyond the view's published horizon (not in the view yet)",
            ["topic"],
            registry=registry,
        )
        self.compaction_beyond_age = Gauge(
            "compactd_compaction_beyond_horizon_age_seconds",
            "How long a record may have waited beyond the view's horizon (0 when none is)",
            ["topic"],
            registry=registry,
        )
        self.compaction_gap_records = Gauge(
            "compactd_compaction_gap_records",
            "Source offsets lost past the view's published horizon (the source's own retention): no run publishes "
            "until `compactd compact TOPIC --accept-gap` or `--rebuild`",
            ["topic"],
            registry=registry,
        )
        self.compaction_retention_left = Gauge(
            "compactd_compaction_retention_left_seconds",
            "Until the source's own retention.ms may delete records beyond the view's horizon (a run starts at half "
            "of retention.ms; absent where the topic has no time retention)",
            ["topic"],
            registry=registry,
        )
        self.compaction_max_lag = Gauge(
            "compactd_compaction_max_lag_seconds",
            "max.compaction.lag.ms of a topic with the service on (the alert compares the age with it; 0 = none)",
            ["topic"],
            registry=registry,
        )
        self._compaction_topics: set[str] = set()
        self._init_known_series()

    def _init_known_series(self) -> None:
        """A labelled series exists only once `.labels()` made it: make each known one now, at 0."""
        for stream, reasons in labels.DLQ_REASONS.items():
            for reason in reasons:
                self.dlq_records.labels(stream, reason)
        for stream, kinds in labels.INPUT_KINDS.items():
            for kind in kinds:
                self.input_records.labels(stream, kind)
        for action, reason, status in labels.ACTION_OUTCOMES:
            self.actions.labels(action, reason, status)
        for outcome in labels.BATCH_OUTCOMES:
            self.batches.labels(outcome)
        for result in labels.CONFIG_RESULTS:
            self.config_events.labels(result)
        for trigger in labels.EVALUATION_TRIGGERS:
            self.evaluations.labels(trigger)

    def init_source_topics(self, topics: Iterable[str]) -> None:
        """Source lag per topic from the job's start (0 until the first sample): the topics are only known then."""
        for topic in topics:
            self.source_lag.labels(topic)

    def compaction_topics(self, topics: Iterable[str]) -> None:
        """The topics with the compaction service on, at each check. A new one's run and in-progress series are
        scraped at 0 from now (`increase()` sees its first run); one turned off loses its horizon gauges, which
        nothing updates any more (a frozen age past the max lag would keep CompactdViewBehind firing)."""
        on = set(topics)
        for topic in self._compaction_topics - on:
            for gauge in (
                self.compaction_beyond_records,
                self.compaction_beyond_age,
                self.compaction_max_lag,
                self.compaction_gap_records,
                self.compaction_retention_left,
                self.compaction_backoff,
            ):
                with contextlib.suppress(KeyError):
                    gauge.remove(topic)
        for topic in on - self._compaction_topics:
            for status in labels.ACTION_STATUSES["compact_view"]:
                self.compaction_runs.labels(topic, status)
            self.compaction_running.labels(topic)
            self.compaction_gap_records.labels(topic)
            self.compaction_backoff.labels(topic)
        self._compaction_topics = on

    def serve(self, port: int) -> None:
        if port:
            start_http_server(port, registry=self.registry)


_default: dict[str, Metrics] = {}


def default_metrics(cluster: str = "default", top_n: int = 100) -> Metrics:
    """One set per process and cluster: metric names may be registered once per registry (the first call's `top_n`
    holds for the process)."""
    if cluster not in _default:
        _default[cluster] = Metrics(cluster=cluster, top_n=top_n)
    return _default[cluster]
