"""`compactd agent --admin`, the pure part: two consecutive answers of the Admin API become the job's events."""

from __future__ import annotations

from compactd.agent.admin_poll import AdminPoll
from compactd.codec.events import OFFSET_EVENTS, SEGMENT_EVENTS

S = 1000
T = ("orders", 0)


def kinds(events: list[dict]) -> list[tuple]:
    return [(e["type"], e.get("group"), e.get("partition"), e.get("offset")) for e in events]


def test_commits_changed_since_the_last_poll_become_events_and_an_error_deletes_nothing() -> None:
    poll = AdminPoll(slice_ms=60 * S, group_grace_ms=30 * S)
    first = poll.offsets(0, {"a", "b"}, {"a": {T: 10, ("orders", 1): 5}, "b": {T: 7}})
    assert kinds(first) == [
        ("offset_commit", "a", 0, 10),
        ("offset_commit", "a", 1, 5),
        ("offset_commit", "b", 0, 7),
    ]
    assert poll.offsets(S, {"a", "b"}, {"a": {T: 10, ("orders", 1): 5}, "b": {T: 7}}) == []  # nothing changed
    moved = poll.offsets(2 * S, {"a", "b"}, {"a": {T: 12}, "b": RuntimeError("GROUP_AUTHORIZATION_FAILED")})
    assert kinds(moved) == [("offset_commit", "a", 0, 12), ("offset_delete", "a", 1, None)]
    assert poll.committed["b"] == {T: 7}  # unreadable: its offsets stand
    for ev in first + moved:
        OFFSET_EVENTS.validate_python(ev)  # the contract's events, as the job validates them


def test_a_group_is_deleted_only_after_the_grace_and_one_listed_again_was_never_gone() -> None:
    poll = AdminPoll(slice_ms=60 * S, group_grace_ms=30 * S)
    poll.offsets(0, {"a", "b"}, {"a": {T: 1}, "b": {T: 2}})
    assert poll.offsets(10 * S, {"a"}, {"a": {T: 1}}) == []  # b missing from one answer
    assert poll.offsets(20 * S, {"a", "b"}, {"a": {T: 1}, "b": {T: 2}}) == []  # and back
    assert poll.offsets(30 * S, {"a"}, {"a": {T: 1}}) == []
    assert poll.offsets(59 * S, {"a"}, {"a": {T: 1}}) == []
    gone = poll.offsets(60 * S, {"a"}, {"a": {T: 1}})
    assert kinds(gone) == [("group_delete", "b", None, None)]
    assert "b" not in poll.committed
    OFFSET_EVENTS.validate_python(gone[0])


def test_groups_are_filtered_before_anything_is_fetched() -> None:
    poll = AdminPoll(60 * S, 30 * S, counts=lambda g: not g.startswith("console-"))
    assert poll.groups_to_fetch({"billing", "console-1", "analytics"}) == ["analytics", "billing"]


def test_offsets_written_between_polls_become_closed_slices_never_older_than_their_records() -> None:
    poll = AdminPoll(slice_ms=60 * S, group_grace_ms=0)
    first = poll.logs_seen(0, {T: 0}, {T: 100})
    assert [(e["type"], e.get("base_offset"), e.get("end_offset"), e["ts"]) for e in first] == [
        ("segment_rolled", 0, 100, 0),  # what the log held: as old as this poll at most
        ("log_start", None, None, 0),
    ]
    assert poll.logs_seen(30 * S, {T: 0}, {T: 150}) == []  # the open slice [100, 150): younger than slice_ms
    assert poll.logs_seen(50 * S, {T: 0}, {T: 180}) == []
    closed = poll.logs_seen(70 * S, {T: 0}, {T: 200})  # open since the poll at 0: spans slice_ms now
    assert [(e["base_offset"], e["end_offset"], e["first_batch_max_ts"], e["ts"]) for e in closed] == [
        (100, 200, 0, 70 * S)
    ]
    assert poll.logs_seen(80 * S, {T: 0}, {T: 230}) == []
    quiet = poll.logs_seen(90 * S, {T: 0}, {T: 230})  # the partition went quiet: its slice closes, last write at 80
    assert [(e["base_offset"], e["end_offset"], e["first_batch_max_ts"], e["ts"]) for e in quiet] == [
        (200, 230, 70 * S, 80 * S)
    ]
    assert poll.logs_seen(500 * S, {T: 0}, {T: 230}) == []  # quiet: nothing per poll
    moved = poll.logs_seen(510 * S, {T: 120}, {T: 230})
    assert [(e["type"], e["log_start_offset"]) for e in moved] == [("log_start", 120)]
    for ev in first + closed + quiet + moved:
        SEGMENT_EVENTS.validate_python(ev)


def test_a_log_that_ends_or_starts_lower_is_another_log_and_a_gone_partition_is_forgotten() -> None:
    poll = AdminPoll(slice_ms=60 * S, group_grace_ms=0)
    poll.logs_seen(0, {T: 50}, {T: 100})
    again = poll.logs_seen(10 * S, {T: 0}, {T: 20})  # re-created: starts over as first seen
    assert [(e["type"], e.get("base_offset"), e.get("end_offset")) for e in again] == [
        ("segment_rolled", 0, 20),
        ("log_start", None, None),
    ]
    assert poll.logs_seen(20 * S, {}, {}, watched={T}) == []  # not answered this poll: kept
    assert T in poll.logs
    poll.logs_seen(30 * S, {}, {}, watched=set())
    assert T not in poll.logs


def test_a_restarted_agent_resumes_from_what_it_published_so_a_group_gone_meanwhile_is_deleted_after_the_grace() -> (
    None
):
    first = AdminPoll(slice_ms=60 * S, group_grace_ms=30 * S)
    published = first.offsets(0, {"a", "b"}, {"a": {T: 10, ("orders", 1): 5}, "b": {T: 7}})
    published += first.offsets(10 * S, {"a", "b"}, {"a": {T: 12}, "b": {T: 7}})  # a's partition 1 offset deleted
    published += [{"type": "offset_commit", "group": "c", "topic": "orders", "partition": 0, "offset": 3, "ts": 5 * S}]
    published += [{"type": "group_delete", "group": "c", "ts": 9 * S}, {"type": "segment_rolled", "ts": 1}]
    again = AdminPoll(slice_ms=60 * S, group_grace_ms=30 * S)
    assert again.resume(reversed(published)) == 2  # any order: applied by time
    assert again.committed == {"a": {T: 12}, "b": {T: 7}}
    assert again.offsets(100 * S, {"a"}, {"a": {T: 12}}) == []  # nothing changed for a; b missing since now
    assert kinds(again.offsets(130 * S, {"a"}, {"a": {T: 12}})) == [("group_delete", "b", None, None)]
