"""Which incarnation of a topic the state describes: the evidence that it describes another one (pure).

A topic deleted and created again under the same name starts a new log at offset 0. Kafka 2.8+ gives each
incarnation a topic ID (KIP-516); brokers that report none (the all-zero ID) still leave evidence in the log itself:
a log end below an offset compactd holds for the partition, or a log start below the one it holds (a log start only
ever rises within one log, as long as the broker does not crash: Kafka checkpoints a deleteRecords' log start every
`log.flush.start.offset.checkpoint.interval.ms`, and a broker killed before that starts again with the older one, so
where the topic ID is known and unchanged, a log start going back is that, not a new log). Acting on a state that
describes another log deletes what no rule made due (before: a re-created topic lost all its new records), so any
of these means: reset the topic's state, act on nothing.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping, Sequence

import msgspec

from compactd.model import PartitionView, Segment

STALE = "stale state"  # how the `why` of an action skipped because its state describes another log begins
TRUNCATED = "the log was truncated"  # a reset's `why` for a log cut below what the state holds, under the same ID
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


def topic_id_bytes(topic_id: str | None) -> bytes | None:
    """The 16 bytes of a topic ID, whichever way it is written: base64 as Kafka's tools and the Admin API print it
    (URL-safe or not, unpadded), or a UUID string as compactd's `__consumer_offsets` codec gives a commit's ID. None
    for no ID, the all-zero one, or text that is neither."""
    if not topic_id:
        return None
    raw: bytes | None = None
    if len(topic_id) == 22:
        try:
            raw = base64.b64decode(topic_id.replace("-", "+").replace("_", "/") + "==", validate=True)
        except ValueError:
            raw = None
    if raw is None:
        try:
            raw = uuid.UUID(topic_id).bytes
        except ValueError:
            return None
    return None if len(raw) != 16 or raw == bytes(16) else raw


def other_incarnation(commit_id: str | None, stored_id: str | None) -> bool:
    """A commit that names a topic ID (OffsetCommitValue v4, Kafka 4.1+) other than the one the topic's state is bound
    to was made on another incarnation of the topic: its offset says nothing of this log and never counts for it. A
    commit without an ID, or a topic whose ID compactd has not recorded, gives no evidence either way."""
    a, b = topic_id_bytes(commit_id), topic_id_bytes(stored_id)
    return a is not None and b is not None and a != b


def held_offset(view: PartitionView) -> int:
    """The highest offset the state holds for the partition: its log start, what its cleaner cleaned, its segments'
    ends."""
    return max([view.log_start, view.cleaned_up_to or 0, *(s.end_offset for s in view.segments)])


def same_log(facts: LogFacts, stored_id: str | None) -> bool:
    """The cluster and the state both name a topic ID, and it is the same: this log, whatever its watermarks say."""
    now_id = known_id(facts.topic_id)
    return now_id is not None and now_id == stored_id


def identity_changed(
    view: PartitionView, facts: LogFacts, stored_id: str | None, before_offset: int | None = None
) -> str | None:
    """Why the state of `view` cannot describe the log the cluster holds now (None: nothing says so).

    `stored_id`: the topic ID recorded when compactd first saw the topic; `before_offset`: the offset a delete
    would go to (a delete aimed past the log end can only come from stale state; it is never clamped).

    Where both IDs are known and equal, the watermarks are no evidence of another log: on a replicated partition the
    high watermark trails the leader's log end, where segments roll, while a follower catches up
    (`behind_high_watermark` says what then waits)."""
    now_id = known_id(facts.topic_id)
    if now_id is not None and stored_id is not None and now_id != stored_id:
        return f"topic ID {stored_id} is now {now_id}"
    if same_log(facts, stored_id):
        return None
    if before_offset is not None and before_offset > facts.high:
        return f"a delete to offset {before_offset} is past the log end {facts.high}"
    held = held_offset(view)
    if facts.high < held:
        return f"the log ends at {facts.high}, below offset {held} compactd holds"
    if facts.low < view.log_start:
        return f"the log starts at {facts.low}, below the log start {view.log_start} compactd holds"
    return None


def behind_high_watermark(view: PartitionView, facts: LogFacts, before_offset: int | None = None) -> str | None:
    """On the log the state describes (same topic ID): why the high watermark is below what compactd holds (None: it
    is not). The leader's segments roll at its log end, and the high watermark (what every in-sync replica holds)
    trails it while a follower catches up, up to `replica.lag.time.max.ms`; a failover with `acks=1` or an unclean
    leader election truncates the log below it instead. Which of the two only time tells: a delete past the high
    watermark waits, and a gap that lasts is a truncation (control/identity.py)."""
    if before_offset is not None and before_offset > facts.high:
        return f"a delete to offset {before_offset} is past the high watermark {facts.high}"
    held = held_offset(view)
    if facts.high < held:
        return f"the high watermark {facts.high} is below offset {held} compactd holds"
    return None


def commit_outlived(group: str, offset: int, epoch: int, high: int, below: tuple[int, int] | None = None) -> str | None:
    """Why group `group`'s commit at `offset` no longer vouches for the records below it (None: nothing says so).

    A commit says "read everything below `offset`" of the log as it was then. An unclean leader election (or a
    failover after `acks=1` writes) truncates the log under the same topic ID and writes the offsets again: the
    commit may then sit past the log's end, or the records below it may be new ones the group never read. A
    consumed-retention delete up to it would delete them. `epoch`: the commit's leader epoch (KIP-320, the epoch of
    the last record the group read; -1 when the committer gave none, which leaves only the log end as evidence);
    `high`: the high watermark now; `below`: (offset, leader epoch) of the last record below `offset` in the log
    now, however far back (kafka/topics.py searches down to the log start: issue 64 found the 64 offsets it read
    before empty on a compacted log, and that was taken as no evidence), None when the log holds none. A record
    written in a later epoch than the commit's was written after the group read that offset; one with no epoch
    says nothing, and holds."""
    if offset > high:
        return (
            f"group {group}'s committed offset {offset} is past the log end {high}: the log was truncated under the "
            "commit (an unclean leader election?), and the records written since are not read"
        )
    if epoch < 0 or below is None:
        return None  # no epoch to judge by, or no record below the commit: a delete up to it removes nothing
    at, written_in = below
    if written_in < 0:  # unknown => skip: nothing says the record is the one the group read
        return (
            f"the record at offset {at}, below group {group}'s committed offset {offset}, carries no leader epoch "
            f"to tell whether the log was written again under the commit (epoch {epoch}): held until the group "
            "commits under the leader of now"
        )
    if written_in > epoch:
        return (
            f"the record at offset {at}, below group {group}'s committed offset {offset}, was written in leader "
            f"epoch {written_in}, after the commit (epoch {epoch}): the log was truncated and written again under "
            "it (an unclean leader election?)"
        )
    return None


def report_outlived(
    below: tuple[int, int] | None, segments: Sequence[Segment], epochs: Mapping[int, int]
) -> str | None:
    """Why the segment reports a delete was decided by no longer describe the log under it (None: nothing says so).

    A segment's report carries the leader epoch of its last record (`segment_rolled`'s `last_epoch`, from the
    reporting broker's leader-epoch-checkpoint): every record the segment held was written in that epoch or an
    earlier one. An unclean leader election (or a failover after `acks=1` writes) truncates the log under the same
    topic ID and writes the offsets again in a later epoch, while the old leader's reports stay in the state with
    their old close times: a forced-retention delete by them would delete records no rule made due. `below`:
    (offset, leader epoch) of the last record below the delete in the log now; `epochs`: base offset -> last epoch
    of the reported segments that have one. A record written in a later epoch than a segment that holds its offset
    is a record that segment never held."""
    if below is None:
        return None
    at, written_in = below
    for s in segments:
        epoch = epochs.get(s.base_offset)
        if epoch is not None and s.base_offset <= at < s.end_offset and written_in > epoch:
            return (
                f"the record at offset {at}, below the delete, was written in leader epoch {written_in}, after the "
                f"segment [{s.base_offset}, {s.end_offset}) that holds it was reported (its last record's epoch "
                f"{epoch}): the log was written again under the report (an unclean leader election?)"
            )
    return None


def written_after(epoch_read: int, below: tuple[int, int] | None) -> bool:
    """Whether `below`, (offset, leader epoch) of a record in the log now, was written after a reader read the log
    under leader epoch `epoch_read` (every record it read was written in that epoch or an earlier one). Then an
    unclean leader election truncated the log under that reader and a new leader wrote it again. -1 on either side
    cannot say (a record without an epoch, magic 0/1: neither could Kafka's replication before KIP-101)."""
    return below is not None and epoch_read >= 0 and below[1] > epoch_read


def view_outlived(epoch_read: int, before: int, below: tuple[int, int] | None) -> str | None:
    """Why a delete before `before`, capped by a compacted view, must not go (None: it may): `below`, the last record
    below it now, was written after the view read the partition under leader epoch `epoch_read`, so the view may
    not hold it, nor anything the log was written again with from there. Held until a run rebuilds the view."""
    if not written_after(epoch_read, below):
        return None
    assert below is not None
    return (
        f"the record at {below[0]}, below the delete's {before}, was written under leader epoch {below[1]}, after "
        f"the compacted view read the partition under epoch {epoch_read}: an unclean leader election wrote the log "
        "again under the view; held until a run rebuilds it"
    )
