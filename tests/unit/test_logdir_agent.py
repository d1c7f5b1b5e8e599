"""Kafka log directories built byte by byte: segment headers with real CRCs, checkpoints, the agent's events."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactd.agent.agent import SegmentAgent
from compactd.agent.logdir import CheckpointError, SegmentError, first_batch, read_checkpoint, scan_log_dir
from compactd.app.cli import main
from tests.support.examples import examples
from tests.support.segments import encode_batch_v2, encode_message_v1, write_checkpoint

T = 1_763_800_000_000


def segment(pdir: Path, base: int, content: bytes, mtime_ms: int | None = None) -> Path:
    pdir.mkdir(parents=True, exist_ok=True)
    path = pdir / f"{base:020d}.log"
    path.write_bytes(content)
    if mtime_ms is not None:
        os.utime(path, ns=(mtime_ms * 1_000_000, mtime_ms * 1_000_000))
    return path


def test_batch_v2_header_layout_and_crc() -> None:
    b = encode_batch_v2(100, T, T + 5, records=3)
    assert len(b) == 61 and b[16] == 2
    assert struct.unpack_from(">qi", b, 0) == (100, 61 - 12)
    assert struct.unpack_from(">qq", b, 27) == (T, T + 5)
    import crc32c

    assert struct.unpack_from(">I", b, 17)[0] == crc32c.crc32c(b[21:])


def test_scan_reads_first_batch_and_skips_active_and_transient(tmp_path: Path) -> None:
    p = tmp_path / "orders-0"
    segment(p, 0, encode_batch_v2(0, T, T + 10) + encode_batch_v2(5, T + 99, T + 999), mtime_ms=T + 500)
    segment(p, 10, encode_message_v1(10, T + 20) + encode_message_v1(11, T + 30))  # legacy magic 1
    segment(p, 20, encode_message_v1(20, None), mtime_ms=T + 700)  # magic 0: mtime stands in
    segment(p, 30, b"")  # active
    (p / f"{40:020d}.log.cleaned").write_bytes(b"x")
    (p / f"{50:020d}.log.deleted").write_bytes(b"x")
    segment(tmp_path / "orders-1-delete", 0, encode_batch_v2(0, T, T))
    segment(tmp_path / "clicks-2", 7, encode_batch_v2(7, T, T + 1))
    segs = {(s.topic, s.partition, s.base_offset): s for s in scan_log_dir(tmp_path)}
    assert set(segs) == {("orders", 0, 0), ("orders", 0, 10), ("orders", 0, 20), ("orders", 0, 30), ("clicks", 2, 7)}
    assert (segs[("orders", 0, 0)].magic, segs[("orders", 0, 0)].first_batch_max_ts) == (2, T + 10)
    assert segs[("orders", 0, 0)].end_offset == 10 and segs[("orders", 0, 0)].mtime_ms == T + 500
    assert (segs[("orders", 0, 10)].magic, segs[("orders", 0, 10)].first_batch_max_ts) == (1, T + 20)
    assert (segs[("orders", 0, 20)].magic, segs[("orders", 0, 20)].first_batch_max_ts) == (0, T + 700)
    assert segs[("orders", 0, 30)].active and segs[("clicks", 2, 7)].active


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (encode_batch_v2(0, T, T)[:40], "truncated"),
        (encode_batch_v2(0, T, T)[:60] + b"\x00", "crc mismatch"),
        (encode_batch_v2(0, T, T, payload=b"abc")[:-1], "truncated first batch"),
        (encode_message_v1(0, T)[:-1] + b"?", "crc mismatch"),
        (b"\x00" * 16 + b"\x07" + b"\x00" * 50, "unknown magic 7"),
        (b"\x00" * 8 + struct.pack(">i", -5) + b"\x00\x00\x00\x00\x02" + b"\x00" * 50, "implausible"),
    ],
)
def test_corrupt_headers_are_reported_not_raised(tmp_path: Path, content: bytes, error: str) -> None:
    p = tmp_path / "t-0"
    segment(p, 0, content)
    segment(p, 100, b"")
    seg = scan_log_dir(tmp_path)[0]
    assert seg.error is not None and error in seg.error and seg.first_batch_max_ts is None


def test_checkpoints(tmp_path: Path) -> None:
    path = tmp_path / "cleaner-offset-checkpoint"
    write_checkpoint(path, {("orders", 0): 1200, ("my-topic", 11): 5})
    assert path.read_text() == "0\n2\nmy-topic 11 5\norders 0 1200\n"
    assert read_checkpoint(path) == {("orders", 0): 1200, ("my-topic", 11): 5}
    assert read_checkpoint(tmp_path / "missing") == {}
    path.write_text("")  # what a broker that has cleaned nothing yet leaves: Kafka creates the file empty
    assert read_checkpoint(path) == {}
    path.write_text("0\n3\norders 0 1\n")
    with pytest.raises(CheckpointError, match="3 entries"):
        read_checkpoint(path)
    path.write_text("1\n0\n")
    with pytest.raises(CheckpointError, match="version-0"):
        read_checkpoint(path)


def test_each_closed_segment_carries_the_leader_epoch_of_its_last_offset(tmp_path: Path) -> None:
    """`leader-epoch-checkpoint` (version 0, count, `epoch start_offset`): epoch 0 from offset 0, 3 from 15, 4 from
    30. A segment's report carries the epoch its last offset was written in; the active one is never reported; a
    checkpoint that cannot be read leaves the epochs unknown, never guessed. A new epoch for an offset already
    reported (the log written again) is reported again."""
    p = tmp_path / "orders-0"
    for base in (0, 10, 20, 40):
        segment(p, base, encode_batch_v2(base, T, T + 1), mtime_ms=T)
    (p / "leader-epoch-checkpoint").write_text("0\n3\n0 0\n3 15\n4 30\n")
    agent = SegmentAgent([tmp_path], clock=lambda: T + 1000)
    got = {e["base_offset"]: e.get("last_epoch") for e in agent.scan() if e["type"] == "segment_rolled"}
    assert got == {0: 0, 10: 3, 20: 4}
    (p / "leader-epoch-checkpoint").write_text("0\n3\n0 0\n3 15\n5 25\n")  # from 25 on, written again in 5
    assert {e["base_offset"]: e.get("last_epoch") for e in agent.scan()} == {20: 5}
    for broken in ("", "1\n1\n0 0\n", "0\n2\n0 0\n", "0\n1\nx 0\n"):
        (p / "leader-epoch-checkpoint").write_text(broken)
        assert all(s.last_epoch is None for s in scan_log_dir(tmp_path)), broken


def test_agent_publishes_changes_once(tmp_path: Path) -> None:
    p = tmp_path / "orders-0"
    segment(p, 0, encode_batch_v2(0, T, T + 1), mtime_ms=T + 100)
    segment(p, 10, encode_batch_v2(10, T + 2, T + 3))
    agent = SegmentAgent([tmp_path], clock=lambda: T + 1000)
    first = agent.scan()
    assert first == [
        {
            "type": "segment_rolled",
            "topic": "orders",
            "partition": 0,
            "base_offset": 0,
            "end_offset": 10,
            "first_batch_max_ts": T + 1,
            "size_bytes": 61,
            "ts": T + 100,
        }
    ]
    assert agent.scan() == []  # nothing republished
    segment(p, 20, encode_batch_v2(20, T + 4, T + 5))  # 10 is closed now
    write_checkpoint(tmp_path / "cleaner-offset-checkpoint", {("orders", 0): 10})
    kinds = [(e["type"], e.get("base_offset", e.get("cleaned_up_to"))) for e in agent.scan()]
    assert kinds == [("segment_rolled", 10), ("compacted", 10)]
    (p / f"{0:020d}.log").unlink()  # retention removed the oldest segment
    assert agent.scan() == [
        {"type": "log_start", "topic": "orders", "partition": 0, "log_start_offset": 10, "ts": T + 1000}
    ]
    write_checkpoint(tmp_path / "log-start-offset-checkpoint", {("orders", 0): 15})
    assert [e["log_start_offset"] for e in agent.scan()] == [15]
    # a corrupt segment is reported once, never published, never fatal
    segment(p, 30, b"")
    (p / f"{20:020d}.log").write_bytes(encode_batch_v2(20, T, T)[:50])
    assert agent.scan() == [] and agent.scan() == [] and agent.errors == 1


def test_everything_on_disk_is_published_again_every_full_interval(tmp_path: Path) -> None:
    """A full re-announce: a state compactd rebuilt (the segments topic's retention dropped old events) or reset (the
    topic was created again) learns every segment on disk within full_every_ms."""
    p = tmp_path / "orders-0"
    for base in (0, 10, 20):
        segment(p, base, encode_batch_v2(base, T, T + 1))
    write_checkpoint(tmp_path / "cleaner-offset-checkpoint", {("orders", 0): 10})
    write_checkpoint(tmp_path / "log-start-offset-checkpoint", {("orders", 0): 5})
    clock = [T]
    agent = SegmentAgent([tmp_path], clock=lambda: clock[0], full_every_ms=60_000)
    everything = sorted(e["type"] for e in agent.scan())
    assert everything == ["compacted", "log_start", "segment_rolled", "segment_rolled"]
    clock[0] += 59_999
    assert agent.scan() == []
    clock[0] += 1
    assert sorted(e["type"] for e in agent.scan()) == everything
    assert agent.scan() == []


def test_a_tiered_topics_log_start_is_the_checkpoints_below_its_local_tier(tmp_path: Path) -> None:
    """Kafka keeps a tiered topic (KIP-405) in log-start-offset-checkpoint whatever its local segments: measured on
    Kafka 4.4 with LocalTieredStorage, the file said 0 while the local tier began at 36. The log start is the file's,
    not the oldest local segment (before: the larger of the two, which read the remote tier as deleted)."""
    p = tmp_path / "clicks-0"
    for base in (36, 45):
        segment(p, base, encode_batch_v2(base, T, T + 1))
    segment(p, 54, b"")
    write_checkpoint(tmp_path / "log-start-offset-checkpoint", {("clicks", 0): 0})
    agent = SegmentAgent([tmp_path], clock=lambda: T)
    assert [e for e in agent.scan() if e["type"] == "log_start"] == []  # 0: nothing to move
    write_checkpoint(tmp_path / "log-start-offset-checkpoint", {("clicks", 0): 20})  # DeleteRecords in the remote tier
    assert [e["log_start_offset"] for e in agent.scan() if e["type"] == "log_start"] == [20]


def test_each_replica_the_broker_holds_is_reported_led_or_not_when_its_log_changes(tmp_path: Path) -> None:
    """`replica_log`: this broker's replica of every partition on disk, a follower's too (its cleaner erases on its
    own), named by the node id, with the partition's replica assignment; only on a change."""
    for topic in ("orders", "clicks"):
        segment(tmp_path / f"{topic}-0", 0, encode_batch_v2(0, T, T + 1))
        segment(tmp_path / f"{topic}-0", 10, b"")
    write_checkpoint(tmp_path / "cleaner-offset-checkpoint", {("orders", 0): 10})
    assignment = {("orders", 0): (1, 2, 3), ("clicks", 0): (2, 3, 1)}
    agent = SegmentAgent([tmp_path], clock=lambda: T, leads=lambda: {("orders", 0)}, node=2,
                         assignment=assignment.get)  # fmt: skip
    reports = [e for e in agent.scan() if e["type"] == "replica_log"]
    assert reports == [
        {"type": "replica_log", "topic": "clicks", "partition": 0, "replica": 2, "replicas": [2, 3, 1],
         "local_log_start": 0, "ts": T},
        {"type": "replica_log", "topic": "orders", "partition": 0, "replica": 2, "replicas": [1, 2, 3],
         "cleaned_up_to": 10, "local_log_start": 0, "ts": T},
    ]  # fmt: skip
    assert [e for e in agent.scan() if e["type"] == "replica_log"] == []
    write_checkpoint(tmp_path / "cleaner-offset-checkpoint", {("orders", 0): 10, ("clicks", 0): 10})
    assignment[("orders", 0)] = (1, 3, 4)  # moved away: its directory here is about to go
    assert [(e["topic"], e.get("cleaned_up_to")) for e in agent.scan() if e["type"] == "replica_log"] == [
        ("clicks", 10)
    ]
    no_node = SegmentAgent([tmp_path], clock=lambda: T)
    assert [e for e in no_node.scan() if e["type"] == "replica_log"] == []  # no node id to name the replica by


def test_segments_inspect_cli(tmp_path: Path, capsys) -> None:
    segment(tmp_path / "orders-0", 0, encode_batch_v2(0, T, T + 1))
    segment(tmp_path / "orders-0", 5, b"")
    assert main(["segments", "inspect", str(tmp_path)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [
        (r["topic"], r["partition"], r["base_offset"], r["magic"], r["first_batch_max_ts"], r["size_bytes"])
        for r in rows
    ] == [("orders", 0, 0, 2, T + 1, 61), ("orders", 0, 5, None, None, 0)]
    assert main(["segments", "inspect", str(tmp_path / "nope")]) == 2


def test_segment_deleted_between_listing_and_reading_is_skipped(tmp_path: Path) -> None:
    p = tmp_path / "orders-0"
    segment(p, 0, encode_batch_v2(0, T, T + 1))
    # a dangling entry is what a reader sees when retention deletes the file after the directory listing
    (p / f"{10:020d}.log").symlink_to(tmp_path / "gone.log")
    segment(p, 20, b"")
    assert [s.base_offset for s in scan_log_dir(tmp_path)] == [0, 20]
    assert [e["base_offset"] for e in SegmentAgent([tmp_path]).scan() if e["type"] == "segment_rolled"] == [0]


@settings(max_examples=examples(3000))
@given(st.binary(max_size=300))
def test_fuzz_segment_header_decoder_only_raises_segment_error(data: bytes) -> None:
    try:
        magic, ts = first_batch(data, lambda total: data[:total])
    except SegmentError:
        return
    assert magic in (0, 1, 2) and (ts is None or isinstance(ts, int))


@given(
    st.integers(0, 2**62), st.integers(-1, 2**62), st.integers(-1, 2**62), st.integers(1, 1000), st.binary(max_size=64)
)
def test_batch_header_round_trip(base: int, base_ts: int, max_ts: int, records: int, payload: bytes) -> None:
    raw = encode_batch_v2(base, base_ts, max_ts, records, payload)
    assert first_batch(raw[:61], lambda total: raw[:total]) == (2, max_ts)
