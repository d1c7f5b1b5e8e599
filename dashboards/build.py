"""compactd's Grafana dashboards as code (grafana-foundation-sdk, Grafana 11.6 schema).

`python -m compactd.dashboards.build` (or `compactd dashboards build`) writes the JSON under `dashboards/json/`;
tests/unit/test_dashboards.py fails when the committed JSON is not what this module builds;
tests/e2e/test_prometheus_dashboards.py runs every panel query against a real Prometheus scraping a real job.

Three dashboards, one uid each: the overview (what is late, what could be freed, what compactd did, what comes
next), the partition drill-down (`topic`, `partition` variables) and the job's health. One module (~580 lines):
each panel is a few builder calls, and a dashboard reads best top to bottom in one place.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import stat, table, timeseries
from grafana_foundation_sdk.builders.prometheus import Dataquery as PromQuery
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh, VariableSort

JSON_DIR = Path(__file__).resolve().parent / "json"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
PER_PARTITION = (
    "compactd_compaction_delay_seconds|compactd_earliest_uncompacted_age_seconds|compactd_deletable_bytes|"
    "compactd_min_committed_offset|compactd_next_action_timestamp_seconds|compactd_partition_time_to_erasure_seconds"
)
ERASURE = (
    "KIP-534: a tombstone needs two cleaner passes, the first sets its delete horizon (delete.retention.ms), the next "
    "clean after it removes it; Kafka cleans again only when new records make the log dirty, and compactd bounds that "
    "clean by max.compaction.lag.ms. Below zero: overdue, most likely no record written since"
)


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    instant: bool = False


CLUSTER = 'cluster=~"$cluster"'


def scoped(expr: str) -> str:
    """Every compactd selector of `expr` limited to the dashboard's `cluster` variable (several jobs, one
    Prometheus): `m{a="b"}` → `m{cluster=~"$cluster",a="b"}`, `m` → `m{cluster=~"$cluster"}`."""

    def add(match: re.Match[str]) -> str:
        return f"{match.group(1)}{{{CLUSTER}," if match.group(2) else f"{match.group(1)}{{{CLUSTER}}}"

    return re.sub(r"\b(compactd_[a-z_]+)\b(\{)?", add, expr).replace(f"{{{CLUSTER},}}", f"{{{CLUSTER}}}")


def _target(q: Query, ref: str) -> PromQuery:
    t = PromQuery().expr(scoped(q.expr)).ref_id(ref).datasource(DATASOURCE)
    if q.legend:
        t = t.legend_format(q.legend)
    return t.instant() if q.instant else t.range()


def _with(panel, queries: list[Query], title: str, unit: str, w: int, h: int, description: str):
    panel = panel.title(title).description(description).unit(unit).span(w).height(h).datasource(DATASOURCE)
    for i, q in enumerate(queries):
        panel = panel.with_target(_target(q, chr(ord("A") + i)))
    return panel


def ts(title: str, queries: list[Query], unit: str = "short", w: int = 12, h: int = 8, description: str = ""):
    return _with(timeseries.Panel(), queries, title, unit, w, h, description)


def st(title: str, query: Query, unit: str = "short", w: int = 4, h: int = 4, description: str = ""):
    return _with(stat.Panel(), [query], title, unit, w, h, description)


def tbl(title: str, queries: list[Query], unit: str = "short", w: int = 12, h: int = 8, description: str = ""):
    return _with(table.Panel(), queries, title, unit, w, h, description)


def _base(uid: str, title: str, description: str) -> db.Dashboard:
    return (
        db.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["compactd", "kafka"])
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
        .with_variable(db.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(
            db.QueryVariable("cluster")
            .label("Kafka cluster")
            .datasource(DATASOURCE)
            .query({"query": "label_values(compactd_tracked_partitions, cluster)", "refId": "clusters"})
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .include_all(True)
            .all_value(".*")
        )
    )


def overview() -> db.Dashboard:
    d = _base(
        "compactd-overview",
        "compactd / overview",
        "Compaction lag against KIP-354's bound, what consumed retention would free, what compactd did and will do.",
    )
    d = d.with_row(db.Row("Now"))
    d = d.with_panel(
        st(
            "Max compaction delay",
            Query("max(compactd_max_compaction_delay_seconds)"),
            "s",
            description="KIP-354 max-compaction-delay-secs: how far the worst partition is past its lag",
        )
    )
    d = d.with_panel(
        st(
            "Deletable now (consumed)",
            Query('sum(compactd_cluster_deletable_bytes{retention="consumed"})'),
            "bytes",
            description="What consumed retention frees: read by every counted group, old enough",
        )
    )
    d = d.with_panel(
        st(
            "Deletable now (forced)",
            Query('sum(compactd_cluster_deletable_bytes{retention="forced"})'),
            "bytes",
            description="What forced (time) retention frees, whatever the groups did",
        )
    )
    d = d.with_panel(st("Partitions tracked", Query("sum(compactd_tracked_partitions)")))
    d = d.with_panel(
        st("Outbox", Query("sum(compactd_outbox_depth)"), description="Actions decided, not yet carried out")
    )
    d = d.with_panel(
        st(
            "DLQ records / 5m",
            Query("sum(increase(compactd_dlq_records_total[5m]))"),
            description="Rejected input; see the DLQ panel below",
        )
    )
    d = d.with_row(db.Row("Compaction (KIP-354)"))
    d = d.with_panel(
        ts(
            "Compaction delay, worst topics",
            [Query("topk(10, compactd_topic_compaction_delay_seconds)", "{{topic}}")],
            "s",
            description="Per topic: the largest delay of its partitions past max.compaction.lag.ms",
        )
    )
    d = d.with_panel(
        tbl(
            "Worst partitions",
            [Query("topk(20, compactd_compaction_delay_seconds)", "{{topic}}/{{partition}}", instant=True)],
            "s",
            description="Per-partition series exist for the top-N worst partitions only (metrics.top_n)",
        )
    )
    d = d.with_panel(
        ts(
            "Time to erasure (tombstones), latest topics",
            [Query("topk(10, compactd_topic_time_to_erasure_seconds)", "{{topic}}")],
            "s",
            description="Per topic: seconds until every tombstone it holds now is gone, if records keep arriving. "
            + ERASURE,
        )
    )
    d = d.with_panel(
        tbl(
            "Tombstones overdue or soonest gone",
            [Query("bottomk(20, compactd_partition_time_to_erasure_seconds)", "{{topic}}/{{partition}}", instant=True)],
            "s",
            description="Seconds until each partition's tombstones are gone, most overdue first (top-N soonest only)",
        )
    )
    d = compaction_service(d)
    d = d.with_row(db.Row("Consumed retention (KIP-68)"))
    d = d.with_panel(
        ts(
            "Deletable bytes, largest topics",
            [Query("topk(10, compactd_topic_deletable_bytes)", "{{topic}} {{retention}}")],
            "bytes",
            description="Bytes deleteRecords would free now, per topic and retention level",
        )
    )
    d = d.with_panel(
        tbl(
            "Most deletable partitions",
            [Query("topk(20, compactd_deletable_bytes)", "{{topic}}/{{partition}} {{retention}}", instant=True)],
            "bytes",
        )
    )
    d = d.with_row(db.Row("Actions"))
    d = d.with_panel(
        ts(
            "Actions",
            [Query(f"sum by (action, status) (rate(compactd_actions_total[{RATE}]))", "{{action}} {{status}}")],
            "ops",
            description="Every decision by final status; dry_run until dry.run is false",
        )
    )
    d = d.with_panel(
        ts(
            "DLQ",
            [Query(f"sum by (stream, reason) (rate(compactd_dlq_records_total[{RATE}]))", "{{stream}} {{reason}}")],
            "ops",
            description="Rejected input records by stream and reason",
        )
    )
    d = d.with_row(db.Row("Forecast"))
    d = d.with_panel(
        tbl(
            "Next actions",
            [
                Query(
                    "bottomk(20, compactd_next_action_timestamp_seconds) - time()",
                    "{{topic}}/{{partition}} {{rule}}",
                    instant=True,
                )
            ],
            "s",
            description="Seconds until each partition next crosses a threshold (lag or a retention), soonest first",
        )
    )
    d = d.with_panel(
        ts(
            "Next crossing per topic",
            [Query("topk(10, time() - compactd_topic_next_action_timestamp_seconds)", "{{topic}} {{rule}}")],
            "s",
            description="Negative: seconds until the topic's next crossing, by rule",
        )
    )
    return d


def last_figure(title: str, figure: str, unit: str, description: str):
    """A panel of one figure of the topics' last successful compaction run, per topic."""
    query = Query(f'max by (topic) (compactd_compaction_last{{figure="{figure}"}})', "{{topic}}")
    return ts(title, [query], unit, w=8, description=description)


def compaction_service(d: db.Dashboard) -> db.Dashboard:
    """The overview's row for the compaction service: its series exist per topic with `compaction.service` on."""
    d = d.with_row(db.Row("Compaction service"))
    d = d.with_panel(
        ts(
            "Runs per hour",
            [Query("sum by (topic, status) (increase(compactd_compaction_runs_total[1h]))", "{{topic}} {{status}}")],
            description="Runs of the last hour by topic and status: sent is a published generation; failed keeps the "
            "previous one (CompactdCompactionFailing), skipped found a run in progress, dry_run is dry.run",
        )
    )
    d = d.with_panel(
        ts(
            "Runs in progress",
            [Query("max by (topic) (compactd_compaction_running)", "{{topic}}")],
            description="1 while a run of the topic is in progress: how long runs take, and how many "
            "compaction.max.concurrent lets run at once",
        )
    )
    d = d.with_panel(
        ts(
            "Last run: keys and records",
            [
                Query(
                    'max by (topic, figure) (compactd_compaction_last{figure=~"keys|records_in|records_out"})',
                    "{{topic}} {{figure}}",
                )
            ],
            w=8,
            description="The last successful run: records read (the source beyond the horizon, and the previous "
            "generation when the run rewrote it), records written, live keys (an upper bound after delta runs)",
        )
    )
    d = d.with_panel(
        ts(
            "Last run: bytes",
            [
                Query(
                    'max by (topic, figure) (compactd_compaction_last{figure=~"bytes_in|bytes_out"})',
                    "{{topic}} {{figure}}",
                )
            ],
            "bytes",
            w=8,
            description="Bytes the last successful run read and wrote: a delta run writes the delta's winners, a "
            "rewrite the whole generation",
        )
    )
    d = d.with_panel(
        last_figure(
            "View appended by delta runs",
            "dirty_ratio",
            "percentunit",
            "The largest share of a partition's view range that delta runs appended since its last rewrite (readers "
            "read those records too); a run rewrites the partition at compaction.view.dirty.ratio",
        )
    )
    d = d.with_panel(
        last_figure(
            "Last run: duration",
            "seconds",
            "s",
            "How long the last successful run took: it bounds how soon after max.compaction.lag.ms the view can "
            "catch up",
        )
    )
    d = d.with_panel(
        ts(
            "Records beyond the horizon",
            [Query("max by (topic) (compactd_compaction_beyond_horizon_records)", "{{topic}}")],
            description="Source records not in the view yet: what the next run reads; a run starts when their bytes "
            "reach compaction.threshold.bytes or their age max.compaction.lag.ms",
        )
    )
    d = d.with_panel(
        ts(
            "Age beyond the horizon vs max lag",
            [
                Query("max by (topic) (compactd_compaction_beyond_horizon_age_seconds)", "{{topic}} age"),
                Query("max by (topic) (compactd_compaction_max_lag_seconds > 0)", "{{topic}} max.compaction.lag.ms"),
            ],
            "s",
            description="How long a record may have waited beyond the view's horizon, against the topic's max lag: "
            "above it for 15 minutes fires CompactdViewBehind",
        )
    )
    d = d.with_panel(
        ts(
            "Source retention vs the horizon",
            [
                Query("min by (topic) (compactd_compaction_retention_left_seconds)", "{{topic}} time left"),
                Query("max by (topic) (compactd_compaction_gap_records)", "{{topic}} offsets lost (gap)"),
            ],
            "s",
            description="Time left before the source's own retention.ms may delete records the view does not hold "
            "yet (a run starts at half of retention.ms), and the offsets already lost past the horizon: no run "
            "publishes over them until `compactd compact TOPIC --accept-gap` or `--rebuild` (CompactdViewGap)",
        )
    )
    return d


def partition() -> db.Dashboard:
    d = _base(
        "compactd-partition",
        "compactd / partition",
        "One topic and one of its partitions (partitions appear while they are in a top-N list).",
    )
    d = d.with_variable(
        db.QueryVariable("topic")
        .label("Topic")
        .datasource(DATASOURCE)
        .query({"query": f"label_values(compactd_topic_deletable_bytes{{{CLUSTER}}}, topic)", "refId": "topics"})
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
    )
    d = d.with_variable(
        db.QueryVariable("partition")
        .label("Partition")
        .datasource(DATASOURCE)
        .query(
            {
                "query": f'label_values({{__name__=~"{PER_PARTITION}",{CLUSTER},topic="$topic"}}, partition)',
                "refId": "parts",
            }
        )
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.NUMERICAL_ASC)
    )
    sel = 'topic="$topic",partition="$partition"'
    d = d.with_row(db.Row("Topic $topic"))
    d = d.with_panel(
        ts(
            "Topic compaction delay",
            [
                Query('compactd_topic_compaction_delay_seconds{topic="$topic"}', "delay"),
                Query('compactd_topic_earliest_uncompacted_age_seconds{topic="$topic"}', "oldest dirty record"),
            ],
            "s",
            w=8,
        )
    )
    d = d.with_panel(
        ts("Topic deletable", [Query('compactd_topic_deletable_bytes{topic="$topic"}', "{{retention}}")], "bytes", w=8)
    )
    d = d.with_panel(
        ts(
            "Topic deletable offsets",
            [Query('compactd_topic_deletable_offsets{topic="$topic"}', "{{retention}}")],
            "short",
            w=8,
        )
    )
    d = d.with_row(db.Row("Partition $topic/$partition"))
    d = d.with_panel(
        ts(
            "Compaction delay and dirty age",
            [
                Query(f"compactd_compaction_delay_seconds{{{sel}}}", "delay past max.compaction.lag.ms"),
                Query(f"compactd_earliest_uncompacted_age_seconds{{{sel}}}", "oldest dirty record"),
            ],
            "s",
            w=8,
        )
    )
    d = d.with_panel(
        ts("Deletable bytes", [Query(f"compactd_deletable_bytes{{{sel}}}", "{{retention}}")], "bytes", w=8)
    )
    d = d.with_panel(
        ts(
            "Minimum committed offset",
            [Query(f"compactd_min_committed_offset{{{sel}}}", "min committed (counted groups)")],
            "short",
            w=8,
            description="The lowest position over the groups that count; consumed retention never deletes past it",
        )
    )
    d = d.with_panel(
        tbl(
            "Next crossings",
            [Query(f"compactd_next_action_timestamp_seconds{{{sel}}} - time()", "{{rule}}", instant=True)],
            "s",
            w=12,
            h=6,
        )
    )
    d = d.with_panel(
        ts(
            "Time to erasure (tombstones)",
            [
                Query(f"compactd_partition_time_to_erasure_seconds{{{sel}}}", "this partition"),
                Query('compactd_topic_time_to_erasure_seconds{topic="$topic"}', "topic (its latest partition)"),
            ],
            "s",
            w=12,
            h=6,
            description="Seconds until the tombstones held now are gone, if records keep arriving. " + ERASURE,
        )
    )
    return d


def health() -> db.Dashboard:
    d = _base("compactd-health", "compactd / job health", "Is the Spark job keeping up, and is it allowed to act?")
    d = d.with_panel(
        st(
            "Offsets caught up",
            Query("min(compactd_offsets_caught_up)"),
            description="0 while __consumer_offsets is still being read or a state rebuild runs: deletes are on hold",
        )
    )
    d = d.with_panel(
        st(
            "Redis up",
            Query("min(compactd_redis_up)"),
            description="0 while Redis does not answer the job: batches wait and are retried",
        )
    )
    d = d.with_panel(
        st(
            "State rebuilding",
            Query("max(compactd_state_rebuilding)"),
            description="1 while a lost Redis state is rebuilt from the sources: deletes are on hold",
        )
    )
    d = d.with_panel(
        st(
            "Topics re-created (1h)",
            Query("sum(increase(compactd_topic_resets_total[1h]))"),
            description="Topics whose log was not the one compactd's state described (deleted and created again): "
            "their actions were skipped as stale state and their state reset; the job log's 'topic re-created:' line "
            "names each",
        )
    )
    d = d.with_panel(st("Since last batch", Query("time() - max(compactd_last_batch_timestamp_seconds)"), "s"))
    d = d.with_panel(st("Heartbeat age", Query("time() - max(compactd_last_tick_timestamp_seconds)"), "s"))
    d = d.with_panel(st("Outbox", Query("sum(compactd_outbox_depth)")))
    d = d.with_panel(
        st(
            "Held by caps",
            Query("sum(compactd_actions_held)"),
            description="Due actions held by actions.per.second or compaction.max.concurrent",
        )
    )
    d = d.with_panel(st("Redis keys", Query("sum(compactd_state_keys)")))
    d = d.with_panel(
        ts(
            "Batch duration (p50, p95)",
            [
                Query(f"histogram_quantile(0.5, sum by (le) (rate(compactd_batch_seconds_bucket[{RATE}])))", "p50"),
                Query(f"histogram_quantile(0.95, sum by (le) (rate(compactd_batch_seconds_bucket[{RATE}])))", "p95"),
                Query(
                    f"histogram_quantile(0.95, sum by (le) (rate(compactd_merge_seconds_bucket[{RATE}])))", "merge p95"
                ),
            ],
            "s",
            description="Driver time per micro-batch: merge into Redis, decide, act",
        )
    )
    d = d.with_panel(
        ts(
            "Source lag",
            [Query("sum by (topic) (compactd_source_lag_records)", "{{topic}}")],
            "short",
            description="Records in each source topic not yet processed by a completed batch",
        )
    )
    d = d.with_panel(
        ts(
            "Input records",
            [Query(f"sum by (stream, kind) (rate(compactd_input_records_total[{RATE}]))", "{{stream}} {{kind}}")],
            "ops",
        )
    )
    d = d.with_panel(
        ts(
            "Records per batch",
            [
                Query(
                    f"sum(rate(compactd_batch_records_sum[{RATE}])) / sum(rate(compactd_batch_records_count[{RATE}]))",
                    "records / batch",
                )
            ],
        )
    )
    d = d.with_panel(
        ts(
            "Outbox and held actions",
            [
                Query("sum(compactd_outbox_depth)", "outbox"),
                Query("sum(compactd_actions_held)", "held by caps"),
                Query("sum(compactd_deletes_behind_high_watermark)", "behind the high watermark"),
            ],
        )
    )
    d = d.with_panel(
        ts(
            "Config version per scope",
            [Query("max by (scope) (compactd_config_version)", "{{scope}}")],
            description="Applied config event version per scope",
        )
    )
    d = d.with_panel(ts("Redis state", [Query("sum(compactd_state_memory_bytes)", "used memory")], "bytes"))
    d = d.with_panel(
        ts(
            "Evaluations",
            [Query(f"sum by (trigger) (rate(compactd_partition_evaluations_total[{RATE}]))", "{{trigger}}")],
            "ops",
        )
    )
    return d


BUILDERS = {"overview": overview, "partition": partition, "health": health}


def render_json(builder: db.Dashboard) -> str:
    return JSONEncoder(sort_keys=True, indent=2).encode(builder.build()) + "\n"


def build_all() -> dict[str, str]:
    """File name → JSON text of every dashboard."""
    return {f"{name}.json": render_json(make()) for name, make in BUILDERS.items()}


def write_all(out: Path = JSON_DIR) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in build_all().items():
        (out / name).write_text(text)
        written.append(out / name)
    return written


def panel_queries(dashboard_json: dict) -> Iterator[tuple[str, str]]:
    """(panel title, expr) of every query of every panel, rows included."""
    for panel in dashboard_json.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []) or []:
                if target.get("expr"):
                    yield inner.get("title", ""), target["expr"]


def load(name: str) -> dict:
    return json.loads((JSON_DIR / f"{name}.json").read_text())


if __name__ == "__main__":
    for path in write_all():
        print(path)
