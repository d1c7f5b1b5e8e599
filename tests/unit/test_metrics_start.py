"""Metrics present from the start: every series whose label values are known in advance is scraped at 0 before
anything happens, so `increase()` and the alerts see the first increment; and every DLQ reason the decoders can
emit is one of those known values."""

from __future__ import annotations

import json
from typing import get_args

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from compactd import labels
from compactd.codec.config_events import MAX_CONFIG_EVENT_BYTES, digest, parse_config_event
from compactd.codec.offsets import OffsetValue, encode_offset_key, encode_offset_value
from compactd.control.metrics import Metrics
from compactd.errors import Rejected
from compactd.model import ActionKind, Reason, Status
from compactd.policy.runtime_config import AppliedLayer, apply_event
from compactd.streaming.decode import Decoder
from tests.unit.test_config_events import INVALID_EVENTS, event
from tests.unit.test_decode import REJECTIONS

Scrape = dict[tuple[str, frozenset[tuple[str, str]]], float]
D = Decoder("seg", "com", max_event_bytes=200, offsets_topic="__consumer_offsets", config_topic="cfg")


def scrape(metrics: Metrics) -> Scrape:
    """The registry as Prometheus reads it: the text format, parsed back (the `cluster` label dropped)."""
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, frozenset((k, v) for k, v in s.labels.items() if k != "cluster")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(scraped: Scrape, name: str, **lbl: str) -> float | None:
    return scraped.get((name, frozenset(lbl.items())))


def test_every_known_series_is_scraped_at_zero_before_anything_happens() -> None:
    scraped = scrape(Metrics(top_n=10))
    for reason in (labels.NULL_VALUE, labels.OVERSIZED, labels.MALFORMED_JSON, labels.UNKNOWN_TYPE):
        assert sample(scraped, "compactd_dlq_records_total", stream="commits", reason=reason) == 0
    for stream, reasons in labels.DLQ_REASONS.items():
        for reason in reasons:
            assert sample(scraped, "compactd_dlq_records_total", stream=stream, reason=reason) == 0, (stream, reason)
    for stream, kinds in labels.INPUT_KINDS.items():
        for kind in kinds:
            assert sample(scraped, "compactd_input_records_total", stream=stream, kind=kind) == 0, (stream, kind)
    for action, reason, status in labels.ACTION_OUTCOMES:
        got = sample(scraped, "compactd_actions_total", action=action, reason=reason, status=status)
        assert got == 0, (action, reason, status)
    assert sample(scraped, "compactd_actions_total", action="restore_config", reason="compacted", status="sent") == 0
    for outcome in labels.BATCH_OUTCOMES:
        assert sample(scraped, "compactd_batches_total", outcome=outcome) == 0
    for result in labels.CONFIG_RESULTS:
        assert sample(scraped, "compactd_config_events_total", result=result) == 0
    for trigger in labels.EVALUATION_TRIGGERS:
        assert sample(scraped, "compactd_partition_evaluations_total", trigger=trigger) == 0


def test_action_series_cover_every_action_and_reason_and_only_final_statuses() -> None:
    """A new action or reason in `compactd.model` must get its series; "pending" is never a final status."""
    actions = {a for a, _, _ in labels.ACTION_OUTCOMES}
    reasons = {r for _, r, _ in labels.ACTION_OUTCOMES}
    statuses = {s for _, _, s in labels.ACTION_OUTCOMES}
    assert actions == set(get_args(ActionKind))
    assert reasons == set(get_args(Reason))
    assert statuses == set(get_args(Status)) - {"pending"}
    assert len(set(labels.ACTION_OUTCOMES)) == len(labels.ACTION_OUTCOMES)


def test_source_lag_of_each_source_topic_is_scraped_from_the_jobs_start() -> None:
    metrics = Metrics(CollectorRegistry(), top_n=10)
    assert not [k for k in scrape(metrics) if k[0] == "compactd_source_lag_records"]  # topics unknown until start
    metrics.init_source_topics(["compactd.segments", "__consumer_offsets", "compactd.config"])
    scraped = scrape(metrics)
    for topic in ("compactd.segments", "__consumer_offsets", "compactd.config"):
        assert sample(scraped, "compactd_source_lag_records", topic=topic) == 0


def test_a_sampled_value_survives_a_second_initialisation() -> None:
    """`default_metrics` is one per process: a second job start must not reset what the first one measured."""
    metrics = Metrics(CollectorRegistry(), top_n=10)
    metrics.init_source_topics(["t"])
    metrics.source_lag.labels("t").set(42)
    metrics.init_source_topics(["t"])
    assert sample(scrape(metrics), "compactd_source_lag_records", topic="t") == 42


def test_a_topic_with_the_compaction_service_is_scraped_from_its_first_check_and_forgotten_when_off() -> None:
    """Runs at 0 from the topic's first check (`increase()` sees the first run, CompactdCompactionFailing the first
    failure); turned off, its horizon gauges go (a frozen age would keep CompactdViewBehind firing), its runs stay."""
    metrics = Metrics(CollectorRegistry(), top_n=10)
    metrics.compaction_topics(["accounts"])
    scraped = scrape(metrics)
    for status in labels.ACTION_STATUSES["compact_view"]:
        assert sample(scraped, "compactd_compaction_runs_total", topic="accounts", status=status) == 0, status
    assert sample(scraped, "compactd_compaction_running", topic="accounts") == 0
    metrics.compaction_runs.labels("accounts", "failed").inc()
    metrics.compaction_beyond_age.labels("accounts").set(7200)
    metrics.compaction_max_lag.labels("accounts").set(3600)
    metrics.compaction_topics(["accounts"])  # a later check resets nothing
    assert sample(scrape(metrics), "compactd_compaction_runs_total", topic="accounts", status="failed") == 1
    metrics.compaction_topics(["orders"])
    scraped = scrape(metrics)
    assert sample(scraped, "compactd_compaction_beyond_horizon_age_seconds", topic="accounts") is None
    assert sample(scraped, "compactd_compaction_max_lag_seconds", topic="accounts") is None
    assert sample(scraped, "compactd_compaction_runs_total", topic="accounts", status="failed") == 1
    assert sample(scraped, "compactd_compaction_runs_total", topic="orders", status="sent") == 0


def config_rejection(value: bytes | None, secrets: tuple[str, ...] = (), applied: dict | None = None) -> str:
    """What `control.runtime_config.RuntimeConfig.apply` does to a config record: parse, then apply."""
    try:
        parsed, raw = parse_config_event(value, secrets)
        apply_event(parsed, digest(raw), {}, applied or {})
    except Rejected as exc:
        return exc.reason
    raise AssertionError("accepted")


def rejected_rows() -> list[tuple[str, str]]:
    """(stream, reason) of each kind of bad input the unit tests feed the decoders, on every stream it can reach."""
    out = []
    for topic, value, _ in REJECTIONS:  # JSON events: on the segments and the commits topic alike
        for src in ("seg", "com") if topic in ("seg", "com") else (topic,):
            row = D.row(src, value)
            if row.get("error") is not None:  # a segment event is rejected on the commits topic only
                out.append((row["stream"], row["error"]))
    offset_key = encode_offset_key("billing", "orders", 2)
    for key, value in (
        (None, b"\x00\x03"),
        (offset_key, b"\x00\x03\x00"),
        (offset_key, encode_offset_value(OffsetValue(2, -5, "", 1))),
        (b"\x00", None),
    ):
        row = D.row("__consumer_offsets", value, key)
        out.append((row["stream"], row["error"]))
    stream = D.row("cfg", b"{}")["stream"]  # config records pass the decoder and are validated on the driver
    applied = {"topic:orders": AppliedLayer({"max.compaction.lag.ms": 1}, 3, 1, ())}
    for value, secrets, layers in [
        *((ev if isinstance(ev, bytes) else json.dumps(ev).encode(), (), None) for ev, _ in INVALID_EVENTS),
        (None, (), None),
        (b"x" * (MAX_CONFIG_EVENT_BYTES + 1), (), None),
        (json.dumps(event()).encode(), ("secret",), None),  # unsigned while secrets are set
        (json.dumps(event(version=2)).encode(), (), applied),  # not newer than the applied version 3
    ]:
        out.append((stream, config_rejection(value, secrets, layers)))
    return out


def test_every_dlq_reason_the_decoders_emit_is_scraped_from_start_up() -> None:
    emitted = set(rejected_rows())
    known = {(stream, reason) for stream, reasons in labels.DLQ_REASONS.items() for reason in reasons}
    assert emitted <= known, emitted - known
    assert emitted == known, known - emitted  # and each known reason really occurs: no series that never moves


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["seg", "com", "__consumer_offsets"]), st.none() | st.binary(max_size=300), st.binary())
def test_random_bytes_are_rejected_only_with_known_reasons(topic: str, value: bytes | None, key: bytes) -> None:
    row = D.row(topic, value, key)
    if row.get("error") is not None:
        assert row["error"] in labels.DLQ_REASONS[row["stream"]]
