"""Segment events as the agent publishes them, for tests that feed the segments topic by hand."""

from __future__ import annotations

H = 3_600_000


def old_segments(topic: str, ends: list[int], now: int, partition: int = 0) -> list[dict]:
    """`segment_rolled` events of `topic`/`partition` for closed segments ending at `ends` (each starting where the one
    before ends, the first at 0): first batch three hours old, closed two hours ago, so due under any retention or
    lag below that."""
    starts = [0, *ends[:-1]]
    return [
        {
            "type": "segment_rolled",
            "topic": topic,
            "partition": partition,
            "base_offset": base,
            "end_offset": end,
            "first_batch_max_ts": now - 3 * H,
            "size_bytes": 1,
            "ts": now - 2 * H,
        }
        for base, end in zip(starts, ends, strict=True)
    ]


def consumed_retention_job(job_settings, cluster, topic: str, now: int, ends: tuple[int, ...] = (100, 200, 300, 400),
                           **overrides):  # fmt: skip
    """Settings of a job that deletes `topic` by consumed retention (an hour, dry run off), its groups read from
    Kafka's own `__consumer_offsets`; `topic`'s closed segments ending at `ends` are sent to its segments topic, two
    hours old. `overrides`: more settings (readers, cluster_check, ...)."""
    settings = job_settings(
        offsets_source="consumer_offsets",
        thresholds={"global": {"dry.run": False}, f"topic:{topic}": {"consumed.retention.ms": H}},
        **overrides,
    )
    cluster.send(settings.topics.segments, old_segments(topic, list(ends), now))
    return settings
