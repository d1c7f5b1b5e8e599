"""Prometheus metrics of the driver. Labels are bounded (kinds, reasons, statuses): never group or partition."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class Metrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
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
        self.max_compaction_delay = Gauge(
            "compactd_max_compaction_delay_seconds",
            "KIP-354 max-compaction-delay-secs over all tracked partitions: max(now - earliest - lag, 0) / 1000",
            registry=registry,
        )
        self.outbox_depth = Gauge("compactd_outbox_depth", "Actions decided and not yet carried out", registry=registry)
        self.actions_held = Gauge(
            "compactd_actions_held",
            "Due actions the last dispatch held back (actions.per.second, compaction.max.concurrent, a failed send)",
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

    def serve(self, port: int) -> None:
        if port:
            start_http_server(port, registry=self.registry)


_default: Metrics | None = None


def default_metrics() -> Metrics:
    """One set per process: prometheus_client refuses to register the same names twice."""
    global _default
    if _default is None:
        _default = Metrics()
    return _default
