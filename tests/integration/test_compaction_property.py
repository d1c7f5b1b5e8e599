"""Property: whatever the history, the cluster and the runs do, the view is KIP-280 over what the source held.

Generated histories (keys reused, tombstones, null keys, headers present/absent/equal, timestamps out of order)
are appended between runs on the real broker; runs go through the real Redis and Spark and some die at a phase
boundary (after planning, after writing the view, after publishing). Between them the cluster acts: the
source's retention deletes a prefix (sometimes past the horizon), partitions are added, the topic is deleted and
created again; a run is paused past its lease while another runs. After every step:
- the published view holds exactly the winners of the records its lineage read (each generation: the previous view
  plus what the source held from the previous horizon or its log start; a new lineage: the source alone) — the
  reference model, `strategy.order_key` over those records, not the run's own reduction. A run that appends instead
  of rewriting adds the winners of what it read to the previous view; it appends exactly where the rule allows
  (the same lineage and rule, a rule that merges winners, a view not dirty enough, nothing written above it);
- no generation is published over a gap unless the run was told `accept_gap`; a new lineage starts on `rebuild`
  and on a re-created source;
- at most one run publishes each generation (the paused one never does);
- `--table` (view + tail) equals the model's live keys, or the read refuses when the tail has a gap;
- after a complete run nothing is left unpublished: the view topic is exactly the published ranges.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
import redis
from confluent_kafka import TopicPartition
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from compactd.compaction.manifest import appends_winners
from compactd.compaction.reduce import Record
from compactd.compaction.service import CHECKED, PHASES, Compactor, Overrides, RunFailed, RunOptions, ViewGap
from compactd.compaction.store import CompactionState
from compactd.compaction.strategy import Strategy, order_key, replaces
from compactd.compaction.view import CompactedReader, ViewGone, _records, table
from tests.support.compaction import history, last_record_wins, produce

PARTITIONS = 2
RATIO = 0.5  # compaction.view.dirty.ratio: its default


class Crash(BaseException):
    """A run dying at a phase boundary (BaseException: nothing in the run may catch it)."""


step = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 120), st.integers(3, 40)),
    st.tuples(st.just("run"), st.sampled_from([None, *PHASES[:2], PHASES[2]]), st.sampled_from(["", "", "accept"])),
    st.tuples(st.just("run"), st.just(None), st.sampled_from(["rebuild", "race", "late"])),
    st.tuples(st.just("retention"), st.integers(0, 3), st.integers(0, 100)),  # partition, % of the log to delete
    st.tuples(st.just("grow"), st.just(0), st.just(0)),
    st.tuples(st.just("recreate"), st.integers(1, 10), st.just(0)),
)
LIFECYCLE = [  # every kind of step at least once, whatever hypothesis draws
    ("run", None, ""),
    ("append", 60, 10),
    ("retention", 0, 100),  # past the horizon: the next run is refused
    ("run", None, ""),
    ("run", "published", "accept"),
    ("append", 30, 5),
    ("run", "written", ""),  # a dead run's writes above the view: the next run rewrites where it wrote
    ("run", None, ""),
    ("grow", 0, 0),
    ("append", 40, 10),
    ("run", None, "race"),
    ("append", 10, 5),
    ("run", None, "late"),
    ("recreate", 5, 0),
    ("run", None, "rebuild"),
]


class Model:
    """What the source holds and what the view's lineage has read, per partition."""

    def __init__(self, partitions: int) -> None:
        self.sent: dict[int, list[Record]] = {p: [] for p in range(partitions)}
        self.low: dict[int, int] = dict.fromkeys(range(partitions), 0)
        self.seen: dict[int, list[Record]] = {p: [] for p in range(partitions)}
        self.horizon: dict[int, int] = {}
        self.generation = 0
        self.lineage = 0
        self.view: dict[int, list[tuple]] = {}  # the published generation's view records, as the model builds them
        self.base: dict[int, int] = {}  # how many of them the last full rewrite wrote (the rest: appended deltas)

    def end(self, p: int) -> int:
        return self.sent[p][-1].offset + 1 if self.sent[p] else 0

    def gap(self) -> bool:
        return any(self.low[p] > h for p, h in self.horizon.items())

    def publish(self, new_lineage: bool, appended: tuple[int, ...], strategy: Strategy) -> None:
        """A generation built now: the source's records from the previous horizon (or the log start) to its end. A
        partition in `appended` gets the delta's winners after its previous view; the others, every winner."""
        self.generation += 1
        if new_lineage or not self.lineage:
            self.lineage += 1
            self.seen = {p: [] for p in self.sent}
            self.horizon = {}
            self.view, self.base = {}, {}
        for p, recs in self.sent.items():
            start = max(self.horizon.get(p, 0), self.low[p])
            delta = [r for r in recs if start <= r.offset]
            self.seen.setdefault(p, [])
            self.seen[p] += delta
            self.horizon[p] = self.end(p)
            if p in appended:
                self.view[p] = self.view[p] + winners(delta, strategy)
            else:
                self.view[p] = winners(self.seen[p], strategy)
                self.base[p] = len(self.view[p])

    def may_append(self, strategy: Strategy, ratio: float) -> set[int]:
        """The partitions a run may append to, by the model alone: the same lineage's view, a rule whose delta
        winners always beat the base's (`offset`), and appended records below `ratio` of the view. (Whether someone
        wrote above the view the broker tells: the caller checks the view topic's end.)"""
        if not self.generation or not appends_winners(strategy):
            return set()
        return {p for p, v in self.view.items() if len(v) - self.base[p] < ratio * len(v)}


def winners(records: list[Record], strategy: Strategy) -> list[tuple]:
    """The model: per key, the survivor of its records in log order under KIP-280's order key (and, with
    `tombstone: latest`, a tombstone that is a key's last record deletes it)."""
    best: dict[bytes, tuple[Any, Record]] = {}
    for r in records:
        if r.key is None:
            continue
        rank = order_key(strategy, r.offset, r.timestamp, r.headers)
        if r.key not in best or replaces(strategy, best[r.key][0], best[r.key][1].tombstone, rank, r.tombstone):
            best[r.key] = (rank, r)
    return sorted((r.offset, r.key, r.value) for _, r in best.values())


@pytest.mark.spark
@settings(
    max_examples=int(os.environ.get("COMPACTD_COMPACTION_EXAMPLES", "2")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=False,
)
@given(
    # (records a task reads in one pass, map MiB): one pass in the JVM; two passes in the JVM; no map fits, so the
    # Python tasks hand partial combines to Spark's reduce (the shuffle path)
    held=st.sampled_from([(250_000, 256), (7, 256), (7, 1)]),
    kind=st.sampled_from(["offset", "timestamp", "header"]),
    tombstone=st.sampled_from(["version", "latest"]),
    steps=st.lists(step, min_size=3, max_size=6),
    seed=st.integers(0, 10_000),
)
@example(held=(7, 1), kind="header", tombstone="version", steps=LIFECYCLE, seed=1)
def test_view_is_kip280_over_what_the_source_held_across_its_lifecycle(
    cluster, job_settings, redis_url, spark, held: tuple, kind: str, tombstone: str, steps: list, seed: int
) -> None:
    topic = cluster.name(f"prop{uuid.uuid4().hex[:8]}")  # hypothesis may run an example again (shrinking)
    cluster.create(topic, PARTITIONS)
    s = job_settings(compaction_task_records=held[0], compaction_task_map_mb=held[1])
    layers = {"global": {"compaction.view.grace.ms": 0, "compaction.strategy.tombstone": tombstone}}
    r = redis.Redis.from_url(redis_url)
    comp = Compactor(s, r, lambda: layers, lambda: spark)
    reader = CompactedReader(comp.conn, s.topics.compactions)
    strategy = Strategy.of(kind, "v", tombstone=tombstone)  # type: ignore[arg-type]
    overrides = Overrides(kind, "v")
    m = Model(PARTITIONS)
    steps = [("append", 80, 20), *steps, ("run", None, "accept")]  # something to compact, a complete run at the end
    for i, (what, n, mode) in enumerate(steps):
        where = steps[: i + 1]
        if what == "append":
            batch = history(seed + i, n, mode, start_ts=i * 1000, partitions=len(m.sent))
            for p, recs in produce(cluster, topic, batch, len(m.sent)).items():
                m.sent[p] += recs
            continue
        if what == "retention":  # the source's own retention (or anyone's deleteRecords) takes a prefix
            p = n % len(m.sent)
            upto = m.low[p] + (m.end(p) - m.low[p]) * mode // 100
            if upto > m.low[p]:
                for fut in cluster.admin.delete_records([TopicPartition(topic, p, upto)]).values():
                    fut.result(30)
                m.low[p] = upto
            continue
        if what == "grow":
            cluster.grow(topic, len(m.sent) + 1)
            m.sent[len(m.sent)], m.low[len(m.low)] = [], 0
            continue
        if what == "recreate":  # detectable without topic IDs: the new log ends below a horizon of the old one
            if max(m.horizon.values(), default=0) <= n:
                continue
            cluster.recreate(topic, len(m.sent))
            m.sent = {p: [] for p in m.sent}
            m.low = dict.fromkeys(m.sent, 0)
            batch = history(seed + i, n, 3, start_ts=i * 1000, partitions=len(m.sent))
            for p, recs in produce(cluster, topic, batch, len(m.sent)).items():
                m.sent[p] += recs
            m.horizon = {p: h + 1_000_000 for p, h in m.horizon.items()}  # the model's mark: another log now
            n, mode = None, ""  # and a run at once: appended to, the new log could outgrow the old one's horizons
        crash_at = n
        other_published: list[bool] = []

        def on_phase(
            phase: str, crash_at: str | None = crash_at, mode: str = mode, other: list[bool] = other_published
        ) -> None:
            # paused past its lease (before its checks, or after them: only the manifest's fence stops it then),
            # another run takes the topic and publishes
            if (mode, phase) in (("race", "written"), ("late", CHECKED)):
                r.delete(CompactionState(r, s.key_prefix)._key(topic, "lease"))
                comp.run(topic, overrides)
                other.append(True)
            if phase == crash_at:
                raise Crash(phase)

        recreated = any(h >= 1_000_000 for h in m.horizon.values())
        gap = m.gap() and not recreated and mode != "rebuild"
        before = comp.log.read(topic)
        may = set()
        if before is not None and before.generation > 0 and not recreated and mode != "rebuild":
            ends = {int(p): cluster.watermarks(before.view, int(p))[1] for p in before.partitions}
            may = {p for p in m.may_append(strategy, RATIO) if ends.get(p) == before.partitions[str(p)].view_end}
        try:
            out = comp.run(
                topic, overrides, on_phase, RunOptions(accept_gap=mode == "accept", rebuild=mode == "rebuild")
            )
            died = None
        except Crash as exc:
            died, out = str(exc), None
        except ViewGap:
            assert gap and mode != "accept", (where, m.low, m.horizon)
            died, out = "gap", None
        except RunFailed:
            assert mode in ("race", "late") and other_published, where  # the paused run lost: published nothing
            died, out = "fenced", None
        assert not (gap and mode != "accept" and died != "gap"), ("published over a gap", where)
        manifest = comp.log.read(topic)
        assert not (other_published and died in (None, "published")), where  # one publish a step at most
        if other_published:  # the run that took the topic meanwhile
            m.publish(recreated, manifest.appended, strategy)
        if died in (None, "published"):
            m.publish(recreated or mode == "rebuild", manifest.appended, strategy)
            # which partitions a run appends to is the rule's: the model's view, and the broker's for what lies above
            assert set(manifest.appended) == may & {int(p) for p in manifest.partitions}, (where, may)
        assert (manifest.generation if manifest else 0) == m.generation, (where, died)
        if out is not None:
            assert out["lineage"] == m.lineage, (where, out["lineage_why"])
        if manifest is None or manifest.generation == 0:
            continue
        assert manifest.lineage == m.lineage and {int(p): h for p, h in manifest.horizons().items()} == m.horizon
        # the published generation, read from the view topic itself, is the model of what its lineage read
        for p in m.sent:
            pv = manifest.partitions.get(str(p))
            got = [] if pv is None else [
                (rec.offset, rec.key, rec.value)
                for rec in _records(reader.conf, manifest.view, p, pv.view_start, pv.view_end, True)
            ]  # fmt: skip
            assert got == m.view.get(p, []), (p, where, died)
            # and read as a plain reader reads it (the last record of a key wins): the lineage's live keys
            plain = last_record_wins(Record(o, 0, k, v) for o, k, v in got)
            assert plain == {x.key: x.value for x in table(m.seen.get(p, []), strategy)}, (p, where, died)
        # the table: view + tail; refused when the source lost records past the horizon
        try:
            table_rows: dict[int, list[tuple]] = {p: [] for p in m.sent}
            for p, rec in reader.partition_records(topic, table_mode=True):
                table_rows[p].append((rec.offset, rec.key, rec.value))
        except ViewGone:
            assert m.gap(), where
            continue
        assert not m.gap(), ("read across a gap", where)
        for p in m.sent:
            tail = [x for x in m.sent[p] if x.offset >= m.horizon.get(p, 0)]
            want = [(x.offset, x.key, x.value) for x in table(m.seen.get(p, []) + tail, strategy)]
            assert table_rows[p] == want, (p, where)
        if died is None:  # a complete publish collected every older range: the view topic is the generation
            for p, pv in manifest.partitions.items():
                assert cluster.watermarks(manifest.view, int(p)) == (pv.view_start, pv.view_end), (p, where)
