"""Dashboards as code: the committed JSON is what the code builds, it round-trips through the SDK, and every
query names metrics compactd exports."""

from __future__ import annotations

import json
import re

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard
from prometheus_client import CollectorRegistry, generate_latest

from compactd.control.metrics import Metrics
from compactd.dashboards.build import BUILDERS, JSON_DIR, build_all, load, panel_queries
from compactd.model import PartitionView, Segment
from compactd.policy.forecast import partition_stats
from compactd.policy.thresholds import Thresholds


def test_committed_json_is_what_the_code_builds() -> None:
    built = build_all()
    assert sorted(p.name for p in JSON_DIR.glob("*.json")) == sorted(built)
    for name, text in built.items():
        assert (JSON_DIR / name).read_text() == text, f"{name} is stale: run `compactd dashboards build`"


def test_dashboards_round_trip_through_the_sdk_and_are_complete() -> None:
    uids = set()
    for name in BUILDERS:
        board = load(name)
        again = json.loads(JSONEncoder(sort_keys=True).encode(Dashboard.from_json(board)))
        assert again == board
        uids.add(board["uid"])
        for panel in board["panels"]:
            if panel["type"] == "row":
                continue
            assert panel["title"] and panel["datasource"]["uid"] == "${datasource}"
            refs = [t["refId"] for t in panel["targets"]]
            assert refs and all(refs) and len(set(refs)) == len(refs), panel["title"]
    assert uids == {"compactd-overview", "compactd-partition", "compactd-health"}
    variables = [v["name"] for v in load("partition")["templating"]["list"]]
    assert variables == ["datasource", "cluster", "topic", "partition"]


def exported_names() -> set[str]:
    """Every metric name a job exports, with one partition evaluated so the per-partition families appear."""
    metrics = Metrics(CollectorRegistry())
    metrics.input_records.labels("segments", "segment_rolled").inc()
    metrics.dlq_records.labels("segments", "malformed_json").inc()
    metrics.actions.labels("compact", "max_compaction_lag", "sent").inc()
    metrics.evaluations.labels("batch").inc()
    metrics.batches.labels("merged").inc()
    metrics.source_lag.labels("compactd.segments").set(0)
    metrics.config_version.labels("global").set(1)
    now = 1_800_000_000_000
    th = Thresholds.model_validate(
        {"max.compaction.lag.ms": 1, "consumed.retention.ms": 1, "forced.retention.ms": 10**9}
    )
    segs = (Segment(0, 10, now - 10_000, 5, now - 10_000), Segment(10, 20, now, 5, now))
    metrics.partitions.update(("t", 0), partition_stats(PartitionView("t", 0, segs, None, 0, 20, 1), th, now))
    text = generate_latest(metrics.registry).decode()
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE"):
            _, _, name, kind = line.split()
            names.add(name)
            if kind == "counter":
                names.add(f"{name}_total")
            if kind == "histogram":
                names.update(f"{name}_{s}" for s in ("bucket", "sum", "count"))
    return names


def test_every_query_names_metrics_compactd_exports() -> None:
    names = exported_names()
    for name in BUILDERS:
        for title, expr in panel_queries(load(name)):
            for metric in set(re.findall(r"\bcompactd_[a-z_]+", expr)):
                assert metric in names, f"{name} / {title}: {metric} is not exported"
