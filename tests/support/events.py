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
