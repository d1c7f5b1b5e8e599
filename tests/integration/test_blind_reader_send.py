"""A declared reader that cannot be read right before a consumed-retention delete goes holds that delete: the send
fails, is audited `failed` and tried again with backoff, and the controller goes on. Real broker,
real Redis, a Spark checkpoint on disk read by the controller's own reader; no Spark (batches are built by hand)."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client import CollectorRegistry

from compactd.control.controller import Controller
from compactd.control.metrics import Metrics
from compactd.control.readers import Readers
from compactd.kafka.config import KafkaConnection
from compactd.model import Segment
from compactd.sinks.audit import AuditLog
from compactd.sinks.kafka_admin import KafkaAdminSink
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState

H = 3_600_000
T0 = 1_800_000_000_000
BACKOFF = 5_000


def write_checkpoint(path: Path, topic: str, position: int) -> None:
    """A Spark query's checkpoint that has committed batch 0 after reading `topic`/0 up to `position` (Spark's
    layout: codec/spark_checkpoint.py)."""
    (path / "offsets").mkdir(parents=True)
    (path / "commits").mkdir()
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": T0, "conf": {}}
    (path / "offsets" / "0").write_text(f"v1\n{json.dumps(meta)}\n{json.dumps({topic: {'0': position}})}\n")
    (path / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def make_unreadable(path: Path) -> Path:
    """The committed batch's offset file cannot be read (a filesystem briefly unreachable). The tests run as root,
    whom no file mode stops: the file is moved aside and a directory takes its name (reading it fails, EISDIR)."""
    offsets = path / "offsets" / "0"
    aside = path / "offsets-0.aside"
    offsets.rename(aside)
    offsets.mkdir()
    return aside


def make_readable(path: Path, aside: Path) -> None:
    (path / "offsets" / "0").rmdir()
    aside.rename(path / "offsets" / "0")


def controller(cluster, rclient, clock: list[int], mono: list[float], layers: dict) -> tuple[Controller, str]:
    """A controller whose readers read on the test's monotonic clock: a plan reuses what was read for CACHE_S, the
    check right before a delete reads again after FRESH_S (control/readers.py)."""
    actions = cluster.name("actions")
    cluster.create(actions)
    state = RedisState(rclient)
    ctl = Controller(
        state,
        layers,
        KafkaAdminSink(KafkaConnection(cluster.bootstrap), state),
        AuditLog(KafkaConnection(cluster.bootstrap), actions),
        Metrics(CollectorRegistry()),
        clock=lambda: clock[0],
        readers=Readers(clock=lambda: clock[0], monotonic=lambda: mono[0]),
    )
    return ctl, actions


def old_segments(topic: str, closed: int, group_at: int | None = None) -> BatchChanges:
    """Two closed segments [0, 100) and [100, 200) of `topic`/0, closed at `closed`; a group at `group_at`."""
    c = BatchChanges()
    c.topic(topic).segments.extend([(0, Segment(0, 100, closed, 1, closed)), (0, Segment(100, 200, closed, 1, closed))])
    if group_at is not None:
        c.topic(topic).offsets.append(("billing", 0, group_at))
    return c


def outcomes(cluster, actions: str, topic: str) -> list[tuple[int, str, int]]:
    return [(a["before_offset"], a["status"], a["attempts"]) for a in cluster.read_all(actions) if a["topic"] == topic]


def test_a_blind_reader_at_send_time_holds_the_delete_from_a_batch(cluster, rclient, tmp_path) -> None:
    """The batch path (foreachBatch): the delete is planned on the readers as read for the batch, and at send time the
    checkpoint cannot be read. Before the fix DependencyUnavailable left `on_batch`: the streaming query failed."""
    topic = cluster.name("etl-read")
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    cluster.fill(topic, 300)
    ckpt = tmp_path / "etl-checkpoint"
    write_checkpoint(ckpt, topic, 250)
    clock, mono = [T0], [0.0]
    layers = {
        "global": {"dry.run": False, "action.backoff.ms": BACKOFF},
        f"topic:{topic}": {"consumed.retention.ms": H},
        "reader:etl": {"spark_checkpoint": str(ckpt)},
    }
    ctl, actions = controller(cluster, rclient, clock, mono, layers)
    assert ctl.readers is not None
    assert not any(h.blind for hs in ctl.readers.holds(layers).values() for h in hs)  # read: at 250
    aside = make_unreadable(ckpt)
    mono[0] += 2  # the plan reuses the read above, the send-time check reads again
    assert ctl.on_batch("s", 0, old_segments(topic, T0 - 2 * H, group_at=250)) == 1  # returns: the job goes on
    assert outcomes(cluster, actions, topic) == [(200, "failed", 1)]
    assert cluster.watermarks(topic) == (0, 300)
    (held,) = ctl.state.outbox()
    assert (held.before_offset, held.detail["try"], held.detail["retry_at"]) == (200, 1, T0 + BACKOFF)

    # a later batch goes on too; the delete is not due again before its backoff is over
    assert ctl.on_batch("s", 1, BatchChanges()) == 0
    assert len(outcomes(cluster, actions, topic)) == 1

    # the checkpoint can be read again: the delete goes once its backoff is over, up to the reader's position
    make_readable(ckpt, aside)
    clock[0] += BACKOFF
    mono[0] += 6
    ctl.tick()
    assert [s for _, s, _ in outcomes(cluster, actions, topic)] == ["failed", "sent"]
    assert cluster.watermarks(topic) == (200, 300)
    assert ctl.state.outbox() == []


def test_a_blind_reader_at_send_time_holds_the_delete_from_a_tick(cluster, rclient, tmp_path) -> None:
    """The tick path: a deadline passes, the delete is planned on the cached readers, the checkpoint cannot be read at
    send time. Before the fix the round ended before its outcomes were audited: a delete already sent that round on
    another topic stayed pending, unaudited, and was sent again."""
    forced, topic = cluster.name("a-forced"), cluster.name("b-etl-read")  # the outbox's order: `forced` goes first
    for t in (forced, topic):
        cluster.create(t, 1, {"cleanup.policy": "delete"})
        cluster.fill(t, 300)
    ckpt = tmp_path / "etl-checkpoint"
    write_checkpoint(ckpt, topic, 250)
    clock, mono = [T0], [0.0]
    layers = {
        "global": {"dry.run": False, "action.backoff.ms": BACKOFF},
        f"topic:{forced}": {"forced.retention.ms": H},
        f"topic:{topic}": {"consumed.retention.ms": H},
        "reader:etl": {"spark_checkpoint": str(ckpt)},
    }
    ctl, actions = controller(cluster, rclient, clock, mono, layers)
    both = old_segments(forced, T0 - H // 2)
    both.topic(topic).segments.extend(old_segments(topic, T0 - H // 2).topic(topic).segments)
    both.topic(topic).offsets.append(("billing", 0, 250))
    ctl.on_batch("s", 0, both)  # nothing old enough yet: deadlines in half an hour
    assert cluster.read_all(actions) == [] and ctl.state.outbox() == []

    aside = make_unreadable(ckpt)
    clock[0] += H // 2 + 1  # the segments are older than an hour
    mono[0] += 2
    ctl.tick()  # returns: the controller goes on
    assert outcomes(cluster, actions, forced) == [(200, "sent", 1)]  # carried out and audited once
    assert outcomes(cluster, actions, topic) == [(200, "failed", 1)]
    assert cluster.watermarks(forced) == (200, 300) and cluster.watermarks(topic) == (0, 300)
    assert [(r.topic, r.detail["try"]) for r in ctl.state.outbox()] == [(topic, 1)]

    # still blind when the backoff is over: failed again, the backoff doubles
    clock[0] += BACKOFF
    mono[0] += 6
    ctl.tick()
    assert outcomes(cluster, actions, topic) == [(200, "failed", 1), (200, "failed", 1)]
    (held,) = ctl.state.outbox()
    assert (held.detail["try"], held.detail["retry_at"]) == (2, clock[0] + 2 * BACKOFF)
    assert cluster.watermarks(topic) == (0, 300)

    make_readable(ckpt, aside)
    clock[0] += 2 * BACKOFF
    mono[0] += 6
    ctl.tick()
    assert [s for _, s, _ in outcomes(cluster, actions, topic)] == ["failed", "failed", "sent"]
    assert outcomes(cluster, actions, forced) == [(200, "sent", 1)]  # never sent again
    assert cluster.watermarks(topic) == (200, 300) and ctl.state.outbox() == []
