"""A compaction run against the real broker, Redis and Spark: the view equals KIP-280 over the whole history, the
incremental run reads only the previous generation and the delta, garbage goes after the grace, the CLI speaks the
contract."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis

from compactd.compaction.reduce import Record, reduce_partition
from compactd.compaction.service import Compactor, Overrides, RunFailed
from compactd.compaction.store import Lease, RunInProgress
from compactd.compaction.strategy import Strategy
from compactd.compaction.view import CompactedReader, table
from tests.support.compaction import (
    STATUS_KEYS,
    Event,
    history,
    last_record_wins,
    produce,
    produce_stamped,
    read_plain,
    run_killed_after_writing,
)
from tests.support.waiting import wait_for, wait_until


def make(
    job_settings, redis_url: str, spark, layers: dict[str, dict[str, Any]] | None = None, **overrides: Any
) -> Compactor:
    settings = job_settings(**overrides)
    r = redis.Redis.from_url(redis_url)
    return Compactor(settings, r, lambda: layers or {}, lambda: spark)


def view_of(comp: Compactor, topic: str, table_mode: bool = False) -> dict[int, list[Record]]:
    reader = CompactedReader(comp.conn, comp.settings.topics.compactions)
    out: dict[int, list[Record]] = {}
    for p, rec in reader.partition_records(topic, table_mode):
        out.setdefault(p, []).append(rec)
    return out


def strip(recs: list[Record]) -> list[tuple]:
    """What a reader compares: offset, key, value (headers minus compactd's tombstone stamp)."""
    return [(r.offset, r.key, r.value) for r in recs]


@pytest.mark.parametrize(
    ("task_records", "map_mb"),
    [(250_000, 256), (9, 256), (9, 1)],
    ids=["one-pass-jvm", "two-pass-jvm", "reduced-by-shuffle"],  # 1 MiB: no map fits, the Python path takes it
)
@pytest.mark.versions
def test_full_then_incremental_run_equals_the_model(
    cluster, job_settings, redis_url, spark, task_records, map_mb
) -> None:
    topic = cluster.name("orders")
    cluster.create(topic, 2)
    layers = {"global": {"compaction.view.grace.ms": 0}}
    comp = make(
        job_settings, redis_url, spark, layers, compaction_task_records=task_records, compaction_task_map_mb=map_mb
    )
    first = history(seed=1, n=400, keys=60)
    sent = produce(cluster, topic, first, partitions=2)

    out = comp.run(topic)
    assert out["status"] == "SUCCESS" and out["generation"] == 1
    assert out["records_in"] == 400
    assert out["bytes_in"] == sum(len(r.key or b"") + len(r.value or b"") for p in (0, 1) for r in sent[p])
    manifest = comp.log.read(topic)
    assert manifest is not None and manifest.generation == 1
    for p in (0, 1):
        model, _ = reduce_partition([], sent[p], Strategy(), now=out_now(manifest))
        got = view_of(comp, topic)[p]
        pv = manifest.partitions[str(p)]
        assert pv.horizon == len(sent[p])
        assert strip(got[: pv.records]) == strip(model)

    more = history(seed=2, n=100, keys=60, start_ts=10_000)
    sent2 = produce(cluster, topic, more, partitions=2)
    out2 = comp.run(topic)
    assert out2["generation"] == 2 and out2["appended"] == [0, 1]
    # a delta run: the delta alone is read, and its winners are appended after the previous generation
    assert out2["records_in"] == 100
    m2 = comp.log.read(topic)
    assert m2 is not None
    for p in (0, 1):
        base, _ = reduce_partition([], sent[p], Strategy(), now=out_now(manifest))
        delta, _ = reduce_partition([], sent2[p], Strategy(), now=out_now(m2))
        assert strip(view_of(comp, topic)[p]) == strip(base + delta)
        pv1, pv2 = manifest.partitions[str(p)], m2.partitions[str(p)]
        assert (pv2.view_start, pv2.base, pv2.view_end) == (pv1.view_start, pv1.view_end, pv1.view_end + len(delta))
        # the table is the live keys of the whole history
        assert strip(view_of(comp, topic, table_mode=True)[p]) == strip(table(sent[p] + sent2[p], Strategy()))
        assert cluster.watermarks(m2.view, p) == (pv2.view_start, pv2.view_end)  # nothing else in the view
    shares = [(v.view_end - v.base) / (v.view_end - v.view_start) for v in m2.partitions.values()]
    assert out2["dirty_ratio"] == round(max(shares), 4) and 0 < out2["dirty_ratio"] < 1

    layers["global"]["compaction.view.dirty.ratio"] = 0  # every run rewrites: the previous view and the delta read
    sent3 = produce(cluster, topic, history(seed=3, n=50, keys=60, start_ts=20_000), partitions=2)
    out3 = comp.run(topic)
    assert out3["generation"] == 3 and out3["appended"] == [] and out3["dirty_ratio"] == 0
    assert out3["records_in"] == m2.records_out + manifest.records_out + 50  # both generations' records, the delta
    m3 = comp.log.read(topic)
    assert m3 is not None
    for p in (0, 1):
        whole = sent[p] + sent2[p] + sent3[p]
        model, _ = reduce_partition([], whole, Strategy(), now=out_now(m3))
        assert strip(view_of(comp, topic)[p]) == strip(model)
        assert strip(view_of(comp, topic, table_mode=True)[p]) == strip(table(whole, Strategy()))
        # grace 0: the older generation is collected at once, the view starts where generation 3 does
        assert cluster.watermarks(m3.view, p) == (m3.partitions[str(p)].view_start, m3.partitions[str(p)].view_end)


def out_now(manifest) -> int:
    return manifest.started_at


def test_a_run_in_progress_holds_the_topic(cluster, job_settings, redis_url, spark) -> None:
    topic = cluster.name("held")
    cluster.create(topic, 1)
    comp = make(job_settings, redis_url, spark)
    lease = comp.state.take_lease(topic)
    try:
        with pytest.raises(RunInProgress, match="already running"):
            comp.run(topic)
    finally:
        lease.release()


def test_a_view_topic_compactd_did_not_create_fails_the_run(cluster, job_settings, redis_url, spark) -> None:
    topic = cluster.name("taken")
    cluster.create(topic, 1)
    cluster.create(f"{topic}.compacted", 1)
    comp = make(job_settings, redis_url, spark)
    with pytest.raises(RunFailed, match="compactd did not create it"):
        comp.run(topic)
    assert comp.status(topic)["status"] == "ERROR"


def test_status_line_speaks_the_contract(cluster, job_settings, redis_url, spark, monkeypatch) -> None:
    topic = cluster.name("status")
    cluster.create(topic, 1)
    comp = make(job_settings, redis_url, spark)
    assert comp.status(topic)["status"] == "NOT_RUN"
    produce(cluster, topic, history(seed=3, n=50, keys=10), partitions=1)
    # what a `compact status` from another process reads the instant the run lets go of the topic: a published run
    # must never read as one that died (the job's test saw ERROR there once)
    at_release: list[tuple] = []
    release = Lease.release

    def watched(lease: Lease) -> None:
        release(lease)
        st = comp.status(topic)
        at_release.append((st["status"], st["error"]))

    monkeypatch.setattr(Lease, "release", watched)
    t0 = time.time()
    comp.run(topic, Overrides(strategy="timestamp"))
    assert at_release == [("SUCCESS", None)]
    st = comp.status(topic)
    assert set(st) == STATUS_KEYS
    assert st["status"] == "SUCCESS" and st["generation"] == 1 and st["horizon"] == {"0": 50}
    assert 0 <= st["seconds"] <= time.time() - t0
    json.dumps(st)


def test_min_compaction_lag_keeps_young_records_beyond_the_horizon(cluster, job_settings, redis_url, spark) -> None:
    """The horizon stops before the first record younger than min.compaction.lag.ms, as the pure rule says, with
    timestamps out of order around the boundary."""
    from compactd.compaction.reduce import horizon
    from tests.support.compaction import Event

    topic = cluster.name("young")
    cluster.create(topic, 1)
    now = int(time.time() * 1000)
    ages = [600_000, 500_000, 400_000, 30_000, 500_000, 10_000, 450_000]  # young at offsets 3 and 5
    events = [Event(0, b"k%d" % (i % 3), b"v%d" % i, now - age) for i, age in enumerate(ages)]
    sent = produce(cluster, topic, events, partitions=1)[0]
    lag = 60_000
    comp = make(job_settings, redis_url, spark, {f"topic:{topic}": {"min.compaction.lag.ms": lag}})
    out = comp.run(topic)
    expected = horizon(0, len(sent), [(r.offset, r.timestamp) for r in sent], out_now(comp.log.read(topic)), lag)
    assert expected == 3
    assert out["horizon"] == {"0": expected}
    # the view holds the winners below it; the young records and everything after are read from the tail
    view = view_of(comp, topic)[0]
    model, _ = reduce_partition([], sent[:expected], Strategy(), now=0)
    assert strip(view[: len(model)]) == strip(model)
    assert strip(view[len(model) :]) == strip(sent[expected:])


FILLER = 60_000


def transactional(cluster, topic: str) -> Any:
    """`topic`, created with one partition, and a transactional producer of it, ready."""
    from confluent_kafka import Producer

    cluster.create(topic, 1)
    tx = Producer(cluster.conn.client("producer", {"transactional.id": f"{topic}-tx"}))
    tx.init_transactions(30)
    return tx


@pytest.mark.parametrize("map_mb", [256, 1], ids=["jvm", "python"])
def test_compactds_own_headers_on_source_records_mean_nothing(cluster, job_settings, redis_url, spark, map_mb):
    """Issue 64, item 9: a source mirrored from a view (MirrorMaker 2 copies headers) carries `compactd.deleted_at`
    and `compactd.timestamp`. Only the view's own records may mean anything by them: a source tombstone stamped
    `deleted_at: 1` was taken as expired at once and never written, so the view's older record of the key, read by
    a plain consumer, brought the key back. Before the fix the jvm case printed: {b'x': b'v1'} for x."""
    topic = cluster.name(f"mirrored{map_mb}")
    cluster.create(topic, 1)
    cluster.send_raw(topic, b"v1", b"x")
    cluster.flush()
    comp = make(job_settings, redis_url, spark, compaction_task_records=9, compaction_task_map_mb=map_mb)
    assert comp.run(topic)["generation"] == 1
    mirrored = [("compactd.deleted_at", b"1"), ("compactd.timestamp", b"5"), ("compactd.offset", b"77")]
    cluster.producer.produce(topic, key=b"x", value=None, partition=0, headers=mirrored)
    cluster.producer.produce(topic, key=b"y", value=b"vy", partition=0, headers=mirrored)
    for i in range(FILLER if map_mb == 1 else 0):  # more keys than a 1 MiB map holds: the Python path
        cluster.send_raw(topic, b"v", b"k%d" % i)
    cluster.flush()
    out = comp.run(topic)
    assert out["generation"] == 2 and out["tombstones"] >= 1, out
    held = last_record_wins(read_plain(cluster, f"{topic}.compacted")[0])
    assert b"x" not in held, held.get(b"x")  # the delete reads as a delete
    view = {r.key: r for r in view_of(comp, topic)[0] if r.key in (b"x", b"y")}
    assert view[b"y"].offset == 2 and view[b"y"].timestamp > 5  # its own offset and timestamp, not the headers'


@pytest.mark.parametrize("map_mb", [256, 1], ids=["jvm", "python"])
def test_a_users_read_uncommitted_never_lets_an_aborted_record_win(cluster, job_settings, redis_url, spark, map_mb):
    """Issue 64, item 10: the user's `kafka: {isolation.level: read_uncommitted}` (for their own reasons) overrode
    compactd's read_committed on the Python read path (a task whose key map does not fit, map_mb 1): the aborted
    record, the key's highest offset, won. The compaction always reads committed data, on either path. Before the
    fix the python case printed: [(b'a', b'aborted')] == [(b'a', b'committed')]."""
    topic = cluster.name(f"txnu{map_mb}")
    tx = transactional(cluster, topic)
    tx.begin_transaction()
    tx.produce(topic, key=b"a", value=b"committed", partition=0)
    for i in range(FILLER):  # more keys than a 1 MiB map holds: the partition overflows to the Python path
        tx.produce(topic, key=b"k%d" % i, value=b"v", partition=0)
    tx.commit_transaction(60)
    tx.begin_transaction()
    tx.produce(topic, key=b"a", value=b"aborted", partition=0)
    tx.flush(30)  # on the log before the abort (an abort purges what librdkafka has not sent yet)
    tx.abort_transaction(30)
    # the aborted record and both markers are there (the coordinator writes the abort's marker after it answers)
    wait_for("the abort's marker written", lambda: cluster.watermarks(topic)[1] == FILLER + 4, 30)
    comp = make(
        job_settings, redis_url, spark, compaction_task_records=9, compaction_task_map_mb=map_mb,
        kafka={"isolation.level": "read_uncommitted"},
    )  # fmt: skip
    assert comp.run(topic)["status"] == "SUCCESS"
    for table_mode in (False, True):
        won = [(r.key, r.value) for r in view_of(comp, topic, table_mode)[0] if r.key == b"a"]
        assert won == [(b"a", b"committed")], (table_mode, won)


@pytest.mark.versions
@pytest.mark.parametrize("task_records", [250_000, 1], ids=["one-pass", "two-pass"])
def test_aborted_records_never_win_and_an_open_transaction_holds_the_horizon(
    cluster, job_settings, redis_url, spark, task_records
) -> None:
    topic = cluster.name(f"txn{task_records}")
    tx = transactional(cluster, topic)
    tx.begin_transaction()
    tx.produce(topic, key=b"a", value=b"committed", partition=0)
    tx.commit_transaction(30)
    tx.begin_transaction()
    tx.produce(topic, key=b"a", value=b"aborted", partition=0)
    tx.produce(topic, key=b"b", value=b"aborted", partition=0)
    tx.flush(30)  # on the log before the abort: an abort purges what librdkafka has not sent (none reached it before)
    tx.abort_transaction(30)
    # a commit marker, the two aborted records, the abort marker: the coordinator writes a marker a moment after the
    # call returns (a 3.6 broker in ZooKeeper mode took longer than the run that followed: the version matrix in CI)
    wait_until("the abort marker written", lambda: cluster.watermarks(topic)[1], lambda high: high == 5)
    comp = make(job_settings, redis_url, spark, compaction_task_records=task_records)
    comp.run(topic)
    assert [(r.key, r.value) for r in view_of(comp, topic)[0]] == [(b"a", b"committed")]

    tx.begin_transaction()  # left open: its records are beyond the last stable offset
    tx.produce(topic, key=b"a", value=b"open", partition=0)
    tx.flush(30)
    out = comp.run(topic)
    assert out["generation"] == 2
    assert [(r.key, r.value) for r in view_of(comp, topic, table_mode=True)[0]] == [(b"a", b"committed")]
    tx.commit_transaction(30)
    wait_until("the commit marker written", lambda: cluster.stable_end(topic), lambda end: end == 7)
    comp.run(topic)
    assert [(r.key, r.value) for r in view_of(comp, topic, table_mode=True)[0]] == [(b"a", b"open")]


def test_a_reader_reads_across_a_generation_switch_without_gap_or_duplicate(
    cluster, job_settings, redis_url, spark
) -> None:
    """A compacted read takes the manifest once: a generation published while it reads changes nothing for it (the
    old one stays for compaction.view.grace.ms, and the source is not deleted below its horizon meanwhile)."""
    topic = cluster.name("switch")
    cluster.create(topic, 2)
    comp = make(job_settings, redis_url, spark)  # default grace: 5 minutes
    sent = produce(cluster, topic, history(seed=21, n=200, keys=25), partitions=2)
    comp.run(topic)
    reader = CompactedReader(comp.conn, comp.settings.topics.compactions)
    reading = reader.partition_records(topic)
    got = [next(reading) for _ in range(5)]  # mid-read of generation 1
    more = produce(cluster, topic, history(seed=22, n=60, keys=25, start_ts=3_000), partitions=2)
    assert comp.run(topic)["generation"] == 2  # published while the reader is inside generation 1
    got += list(reading)
    per_partition: dict[int, list[tuple]] = {0: [], 1: []}
    for p, rec in got:
        per_partition[p].append((rec.offset, rec.key, rec.value))
    for p in (0, 1):
        offsets = [o for o, _, _ in per_partition[p]]
        assert offsets == sorted(set(offsets))  # in order, nothing twice
        # what a reader of generation 1 must see: its winners, then the source from its horizon to where the
        # source ended when the read began (nothing appended later, nothing of generation 2)
        model, _ = reduce_partition([], sent[p], Strategy(), now=0)
        assert per_partition[p] == strip(model)
        assert more[p] and comp.log.read(topic).horizon(p) == len(sent[p]) + len(more[p])  # type: ignore[union-attr]
    # and a read begun now reads generation 2: generation 1's winners, then those of the delta appended to them
    after: dict[int, list[tuple]] = {0: [], 1: []}
    for p, rec in reader.partition_records(topic):
        after[p].append((rec.offset, rec.key, rec.value))
    for p in (0, 1):
        appended = reduce_partition([], more[p], Strategy(), now=0)[0]
        assert after[p] == strip(reduce_partition([], sent[p], Strategy(), now=0)[0] + appended)


@pytest.mark.versions
@pytest.mark.parametrize("kind", ["header", "timestamp"])
def test_a_plain_reader_of_the_view_reads_each_keys_kip280_winner_after_every_run(
    cluster, job_settings, redis_url, spark, kind: str
) -> None:
    """Issue 49: the view is a Kafka topic, and tools that are not compactd (a KTable, a Connect sink, ksqlDB) read
    the last record of a key as its value. After every run, a plain consumer of the view topic from its log start
    must read each key's KIP-280 winner over the whole source, and no key whose winner is a tombstone. Late records
    ranked below the base's winners (lower versions, older timestamps, some for deleted keys) are what a delta run
    appended whether or not they won: 57 of 279 keys read a wrong value and 8 deleted keys came back."""
    topic = cluster.name(f"plain{kind}")
    cluster.create(topic, 4)
    comp = make(job_settings, redis_url, spark, {"global": {"compaction.view.grace.ms": 0}})
    strategy, overrides = Strategy.of(kind, "v"), Overrides(kind, "v")  # type: ignore[arg-type]
    sent = produce(cluster, topic, history(seed=11, n=1200, keys=90, partitions=4), partitions=4)

    def late(round_: int) -> list[Event]:
        """For every key of every partition, a record ranked below what it had: a lower version, an older time."""
        out = []
        for p, recs in sent.items():
            oldest = min(r.timestamp for r in recs)
            for key in sorted({r.key for r in recs if r.key is not None}):
                version = (-99 + round_).to_bytes(8, "big", signed=True)
                out.append(Event(p, key, b"late%d" % round_, oldest - 10_000 + round_, (("v", version),)))
        return out

    def check(generation: int) -> None:
        manifest = comp.log.read(topic)
        assert manifest is not None and manifest.generation == generation
        plain = read_plain(cluster, manifest.view)
        for p in range(4):
            want = {r.key: r.value for r in table(sent[p], strategy)}
            got = last_record_wins(plain[p])
            wrong = sorted(k for k in want if got.get(k) != want[k])
            back = sorted(k for k in got if k not in want)
            assert not wrong and not back, (kind, generation, p, f"wrong winners {wrong}, deleted keys back {back}")

    assert comp.run(topic, overrides)["generation"] == 1
    check(1)
    for p, recs in produce(cluster, topic, late(1), partitions=4).items():
        sent[p] += recs
    second = comp.run(topic, overrides)
    check(2)
    assert second["generation"] == 2 and second["appended"] == []  # a delta's winner may lose: the run rewrites

    for p, recs in produce(cluster, topic, late(2), partitions=4).items():
        sent[p] += recs

    run_killed_after_writing(comp, topic, overrides)
    assert comp.run(topic, overrides)["generation"] == 3  # over the dead run's writes
    check(3)


@pytest.mark.parametrize(("task_records", "map_mb"), [(250_000, 256), (9, 1)], ids=["jvm", "shuffle"])
def test_a_winner_stamped_0_keeps_its_timestamp_in_the_view(
    cluster, job_settings, redis_url, spark, task_records: int, map_mb: int
) -> None:
    """Issue 49, item 9: a record stamped 0 (a Java producer's choice; librdkafka cannot write 0, it means "now")
    written into the view as "now" outranks, under `timestamp`, every newer source record produced before the run.
    The view keeps its winner's own timestamp (header `compactd.timestamp` where the record cannot carry it)."""
    topic = cluster.name("zero")
    cluster.create(topic, 1, {"retention.ms": "-1"})  # records of 1970 are kept
    comp = make(job_settings, redis_url, spark, {"global": {"compaction.view.grace.ms": 0}},
                compaction_task_records=task_records, compaction_task_map_mb=map_mb)  # fmt: skip
    strategy, overrides = Strategy.of("timestamp"), Overrides("timestamp")
    keys = [(0, b"k%d" % i, b"zero%d" % i, 0) for i in range(12)]
    sent = produce_stamped(cluster, topic, keys)[0]
    assert [r.timestamp for r in read_plain(cluster, topic)[0]] == [0] * 12  # the broker holds 0
    assert comp.run(topic, overrides)["generation"] == 1
    now = int(time.time() * 1000)
    sent += produce(cluster, topic, [Event(0, b"k%d" % i, b"new%d" % i, now - 60_000 + i) for i in range(6)], 1)[0]
    assert comp.run(topic, overrides)["generation"] == 2
    manifest = comp.log.read(topic)
    assert manifest is not None
    want = {r.key: r.value for r in table(sent, strategy)}
    assert want[b"k0"] == b"new0" and want[b"k11"] == b"zero11"
    assert last_record_wins(read_plain(cluster, manifest.view)[0]) == want
    got = {r.key: (r.value, r.timestamp) for r in view_of(comp, topic, table_mode=True)[0]}
    assert got == {r.key: (r.value, r.timestamp) for r in table(sent, strategy)}


def test_a_source_kafkas_cleaner_compacts_is_refused_in_one_line(cluster, job_settings, redis_url, spark) -> None:
    """Issue 64, item 7 (reproduced as a user would): K with header v=10 at offset 0, then K v=5 at offset 1, on a
    topic whose `cleanup.policy` is compact; Kafka's cleaner removed offset 0 (it keeps the highest offset per key).
    Before: the run exited SUCCESS and published K = v5, where KIP-280's winner is v10 (and a tombstone the cleaner
    dropped let a deleted key read live again). A source Kafka's cleaner compacts is refused, in one line naming the
    setting, and nothing is published."""
    import struct

    from confluent_kafka import Consumer, TopicPartition

    from tests.support.waiting import wait_until

    topic = cluster.name("cleaned")
    cluster.create(topic, 1, {"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01"})
    for v in (10, 5):
        cluster.producer.produce(topic, key=b"K", value=b"v%d" % v, partition=0, headers=[("v", struct.pack(">q", v))])
        cluster.flush()
    for key in (
        b"a",
        b"b",
        b"c",
    ):  # each rolls the segment before it (segment.ms): K's two records leave the active one
        time.sleep(0.3)
        cluster.send_raw(topic, b"x", key)
        cluster.flush()

    def first_offset() -> int:
        c = Consumer(cluster.conn.client("consumer", forced={"group.id": f"first-{time.time_ns()}"}))
        try:
            c.assign([TopicPartition(topic, 0, 0)])
            msgs = [m for m in c.consume(1, timeout=5.0) if m.error() is None]
            return msgs[0].offset() if msgs else -1
        finally:
            c.close()

    wait_until("Kafka's cleaner removed K v10 at offset 0", first_offset, lambda first: first >= 1, 90)
    comp = make(job_settings, redis_url, spark)
    with pytest.raises(RunFailed) as failed:
        comp.run(topic, Overrides("header", "v"))
    line = str(failed.value)
    assert "\n" not in line and "cleanup.policy=compact" in line and f"cleanup.policy=delete on {topic}" in line, line
    assert comp.status(topic)["status"] == "ERROR"
    assert comp.log.read(topic) is None  # nothing published


@pytest.mark.parametrize("map_mb", [256, 1], ids=["jvm", "python"])
def test_a_source_that_allows_large_records_is_compacted(cluster, job_settings, redis_url, spark, map_mb) -> None:
    """Issue 64, item 6 (reproduced): a source with `max.message.bytes` 2 MiB and 1 MiB values. Before, the view was
    created with the broker's default (1 MiB) and every run failed (`RecordTooLargeException`); now the view takes the
    source's size plus compactd's headers (created so, and corrected when the source's grows), and so do the run's
    producers, on both paths. Before the fix the jvm case printed: RunFailed ... RecordTooLargeException."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import ConfigResource, ResourceType

    topic = cluster.name(f"large{map_mb}")
    cluster.create(topic, 1, {"max.message.bytes": str(2 << 20)})
    big = {b"k%d" % i: bytes([65 + i]) * (1 << 20) for i in range(3)}
    producer = Producer(cluster.conn.client("producer", {"message.max.bytes": 3 << 20}))
    for key, value in big.items():
        producer.produce(topic, value, key, partition=0)
    for i in range(FILLER if map_mb == 1 else 0):  # more keys than a 1 MiB map holds: the Python path
        producer.produce(topic, b"v", b"f%d" % i, partition=0)
    assert producer.flush(60) == 0
    comp = make(job_settings, redis_url, spark, compaction_task_records=9, compaction_task_map_mb=map_mb)
    out = comp.run(topic)
    assert out["status"] == "SUCCESS", out
    held = last_record_wins(read_plain(cluster, f"{topic}.compacted")[0])
    assert {k: held.get(k) for k in big} == big
    res = ConfigResource(ResourceType.TOPIC, f"{topic}.compacted")
    config = cluster.admin.describe_configs([res])[res].result(30)
    assert int(config["max.message.bytes"].value) > 2 << 20


def test_a_run_that_keeps_failing_backs_off_says_why_and_leaves_no_writes(
    cluster, job_settings, redis_url, spark, caplog
) -> None:
    """Issue 64, item 6: a run that cannot succeed was started every 5 s for good, each attempt's writes kept in the
    view (`retention.ms` -1, nothing collected before generation 1), where a plain reader read them as the topic's
    state. Now the trigger waits twice as long after each failure in a row (a gauge says how long, one line says
    why), and what a failed run wrote before the first generation is collected."""
    import logging

    from prometheus_client import CollectorRegistry

    from compactd.compaction.trigger import CompactionTrigger
    from compactd.control.metrics import Metrics

    topic = cluster.name("failing")
    cluster.create(topic, 1)
    cluster.send_raw(topic, b"v", b"k")
    cluster.flush()
    layers = {"global": {"dry.run": False}, f"topic:{topic}": {"compaction.service": True}}
    comp = make(job_settings, redis_url, spark, layers)
    view = f"{topic}.compacted"

    def dies(phase: str) -> None:
        if phase == "written":
            assert cluster.watermarks(view) == (0, 1)  # its write, which a plain reader reads as the topic's state
            raise RuntimeError("the run died after writing, before publishing")

    with pytest.raises(RunFailed):
        comp.run(topic, on_phase=dies)
    assert cluster.watermarks(view) == (1, 1)  # collected (before: kept for ever)
    cluster.alter(topic, {"cleanup.policy": "compact"})  # every run now fails, in one line
    metrics = Metrics(CollectorRegistry())
    published: list = []
    t = CompactionTrigger(comp, metrics, lambda: layers, lambda: [topic], published.append, comp.clock)
    with caplog.at_level(logging.WARNING, logger="compactd.compaction"):
        t.tick(now=True)
        assert topic in t.running, [r.getMessage() for r in caplog.records]
        t.running[topic].join(120)
        t.tick(now=True)  # within the backoff: no second run
        assert not t.running.get(topic) or not t.running[topic].is_alive()
    assert [(r.action, r.status) for r in published] == [("compact_view", "failed")]
    assert published[0].detail["tries"] == 1 and published[0].detail["retry_in_s"] == 5.0
    assert metrics.registry.get_sample_value("compactd_compaction_backoff_seconds", {"topic": topic}) == 5.0
    lines = [r.getMessage() for r in caplog.records if topic in r.getMessage() and "failed" in r.getMessage()]
    assert len(lines) == 1 and "next try in 5 s" in lines[0] and "cleanup.policy=compact" in lines[0], lines
    assert cluster.watermarks(view) == (1, 1)


@pytest.mark.parametrize("map_mb", [256, 1], ids=["jvm", "python"])
def test_a_partition_written_again_under_the_view_is_rebuilt_keeping_the_view_below_the_cut(
    cluster, job_settings, redis_url, spark, map_mb, monkeypatch
) -> None:
    """Issue 64, item 5, the rebuild on both paths (tests/e2e/test_replicated_cluster.py makes the unclean election
    on three nodes; here the log reads that find it are stood in for): the source was written again from `base+10`
    under a later leader epoch, and its log start is `base+20`. The run reads the view's records of source offsets
    below the cut (min of the two) and the source from its log start: a0-a9 from the view, a10-a19 (the view's
    only copy, of the lost epoch) gone, a20-a29 and b0-b9 from the source."""
    from confluent_kafka import TopicPartition

    topic = cluster.name(f"rewritten{map_mb}")
    cluster.create(topic, 1)
    now = int(time.time() * 1000)
    filler = [Event(0, b"f%d" % i, b"f", now - 90_000) for i in range(FILLER if map_mb == 1 else 0)]
    sent = produce(cluster, topic, filler + [Event(0, b"a%d" % i, b"a", now - 60_000 + i) for i in range(30)], 1)[0]
    base = len(filler)
    comp = make(job_settings, redis_url, spark, {"global": {"compaction.view.grace.ms": 0}},
                compaction_task_map_mb=map_mb)  # fmt: skip
    assert comp.run(topic)["generation"] == 1
    for fut in cluster.admin.delete_records([TopicPartition(topic, 0, base + 20)]).values():
        fut.result(30)
    sent += produce(cluster, topic, [Event(0, b"b%d" % i, b"b", now + i) for i in range(10)], 1)[0]
    monkeypatch.setattr(comp, "written_again", lambda t, published, epochs: {0: base + 39})
    monkeypatch.setattr(type(comp.cluster.log), "first_record_after", lambda self, *a: (base + 10, False))
    out = comp.run(topic)
    assert out["generation"] == 2, out
    got = [(r.offset, r.key, r.value) for r in view_of(comp, topic, table_mode=True)[0]]
    want = [
        (r.offset, r.key, r.value)
        for r in table([r for r in sent if not base + 10 <= r.offset < base + 20], Strategy())
    ]
    assert got == want
    assert not any(k.startswith(b"a1") and len(k) == 3 for _, k, _ in got)  # a10-a19
