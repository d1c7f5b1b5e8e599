"""Which incarnation of a topic the state describes: the evidence that it describes another one (pure).

A topic deleted and created again under the same name starts a new log at offset 0. Kafka 2.8+ gives each
incarnation a topic ID (KIP-516); brokers that report none (the all-zero ID) still leave evidence in the log itself:
a log end below an offset compactd holds for the partition, or a log start below the one it holds (a log start only
ever rises within one log, as long as the broker does not crash: Kafka checkpoints a deleteRecords' log start every
`log.flush.start.offset.checkpoint.interval.ms`, and a broker killed before that starts again with the older one, so
where the topic ID is known and unchanged, a log start going back is that, not a new log). Acting on a state that
describes another log deletes what no rule made due (issue 26: a re-created topic lost all its new records), so any
of these means: reset the topic's state, act on nothing.
"""

from __future__ import annotations

import msgspec

from compactd.model import PartitionView

STALE = "stale state"  # how the `why` of an action skipped because its state describes another log begins
ZERO_ID = "AAAAAAAAAAAAAAAAAAAAAA"  # the all-zero topic ID, base64 as the Admin API prints it: "no ID"


class LogFacts(msgspec.Struct, frozen=True):
    """What the cluster says of a partition right now: the topic's ID (None: the broker reports none) and the
    partition's log start (low watermark) and log end (high watermark)."""

    topic_id: str | None
    low: int
    high: int


def known_id(topic_id: str | None) -> str | None:
    """A topic ID worth comparing: None for a broker that reports none."""
    return None if not topic_id or topic_id == ZERO_ID else topic_id


def identity_changed(
    view: PartitionView, facts: LogFacts, stored_id: str | None, before_offset: int | None = None
) -> str | None:
    """Why the state of `view` cannot describe the log the cluster holds now (None: nothing says so).

    `stored_id`: the topic ID recorded when compactd first saw the topic; `before_offset`: the offset a delete
    would go to (a delete aimed past the log end can only come from stale state; it is never clamped)."""
    now_id = known_id(facts.topic_id)
    if now_id is not None and stored_id is not None and now_id != stored_id:
        return f"topic ID {stored_id} is now {now_id}"
    if before_offset is not None and before_offset > facts.high:
        return f"a delete to offset {before_offset} is past the log end {facts.high}"
    ends = [s.end_offset for s in view.segments]
    held = max([view.log_start, view.cleaned_up_to or 0, *ends])
    if facts.high < held:
        return f"the log ends at {facts.high}, below offset {held} compactd holds"
    same_log = now_id is not None and stored_id is not None  # and equal: a different ID returned above
    if facts.low < view.log_start and not same_log:
        return f"the log starts at {facts.low}, below the log start {view.log_start} compactd holds"
    return None
