"""Property: whatever the history and wherever runs die, the view is KIP-280 over the whole history.

Generated histories (keys reused, tombstones, null keys, headers present/absent/equal, timestamps out of order)
are appended between runs on the real broker; runs go through the real Redis and Spark and some die at a phase
boundary (after planning, after writing the view, after publishing). After every step:
- the published view holds exactly the winners of every source record below its horizon (the reference model:
  `strategy.order_key` over the whole history, not the run's own reduction);
- `--table` (view + tail) equals the model's live keys over the whole history;
- a run that died before publishing left the previous generation published and readable;
- after a complete run nothing is left unpublished: the view topic is exactly the published ranges.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compactd.compaction.reduce import Record
from compactd.compaction.service import PHASES, Compactor, Overrides
from compactd.compaction.strategy import Strategy, order_key
from compactd.compaction.view import CompactedReader, table
from tests.support.compaction import history, produce

PARTITIONS = 2


class Crash(BaseException):
    """A run dying at a phase boundary (BaseException: nothing in the run may catch it)."""


def winners(records: list[Record], strategy: Strategy, below: int) -> list[tuple]:
    """The model: per key, the record with the largest KIP-280 order key among those below the horizon."""
    best: dict[bytes, tuple[Any, Record]] = {}
    for r in records:
        if r.key is None or r.offset >= below:
            continue
        rank = order_key(strategy, r.offset, r.timestamp, r.headers)
        if r.key not in best or rank > best[r.key][0]:
            best[r.key] = (rank, r)
    return sorted((r.offset, r.key, r.value) for _, r in best.values())


step = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 120), st.integers(3, 40)),
    st.tuples(st.just("run"), st.sampled_from([None, *PHASES[:2], PHASES[2]]), st.just(0)),
)


@pytest.mark.spark
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False)
@given(
    held=st.sampled_from([250_000, 7]),  # 7: tasks hand partial combines to Spark's reduce (the shuffle path)
    kind=st.sampled_from(["offset", "timestamp", "header"]),
    steps=st.lists(step, min_size=3, max_size=6),
    seed=st.integers(0, 10_000),
)
def test_view_is_kip280_over_the_whole_history_across_killed_runs(
    cluster, job_settings, redis_url, spark, held: int, kind: str, steps: list, seed: int
) -> None:
    topic = cluster.name(f"prop{uuid.uuid4().hex[:8]}")  # hypothesis may run an example again (shrinking)
    cluster.create(topic, PARTITIONS)
    s = job_settings(compaction_task_records=held)
    layers = {"global": {"compaction.view.grace.ms": 0}}
    comp = Compactor(s, redis.Redis.from_url(redis_url), lambda: layers, lambda: spark)
    reader = CompactedReader(comp.conn, s.topics.compactions)
    strategy = Strategy.of(kind, "v")  # type: ignore[arg-type]
    overrides = Overrides(kind, "v")
    sent: dict[int, list[Record]] = {p: [] for p in range(PARTITIONS)}
    published = 0
    steps = [("append", 80, 20), *steps, ("run", None, 0)]  # something to compact, and a complete run at the end
    for i, (what, n, keys) in enumerate(steps):
        if what == "append":
            for p, recs in produce(cluster, topic, history(seed + i, n, keys, start_ts=i * 1000), PARTITIONS).items():
                sent[p] += recs
            continue
        crash_at = n

        def on_phase(phase: str, crash_at: str | None = crash_at) -> None:
            if phase == crash_at:
                raise Crash(phase)

        try:
            comp.run(topic, overrides, on_phase)
            died = None
        except Crash as exc:
            died = str(exc)
        manifest = comp.log.read(topic)
        if died in (None, "published"):
            published += 1
        assert (manifest.generation if manifest else 0) == published, (steps[: i + 1], died)
        if manifest is None or manifest.generation == 0:
            continue
        # the published generation (view only: the records before each horizon) is the model
        view: dict[int, list[tuple]] = {p: [] for p in range(PARTITIONS)}
        for p, rec in reader.partition_records(topic):
            if rec.offset < manifest.horizon(p):
                view[p].append((rec.offset, rec.key, rec.value))
        for p in range(PARTITIONS):
            assert view[p] == winners(sent[p], strategy, manifest.horizon(p)), (p, steps[: i + 1], died)
        # the table: view + tail, live keys of the whole history
        got: dict[int, list[tuple]] = {p: [] for p in range(PARTITIONS)}
        for p, rec in reader.partition_records(topic, table_mode=True):
            got[p].append((rec.offset, rec.key, rec.value))
        for p in range(PARTITIONS):
            assert got[p] == [(r.offset, r.key, r.value) for r in table(sent[p], strategy)], (p, steps[: i + 1])
        if died is None:  # a complete publish collected every older range: the view topic is the generation
            for p in range(PARTITIONS):
                pv = manifest.partitions[str(p)]
                assert cluster.watermarks(manifest.view, p) == (pv.view_start, pv.view_end), (p, steps[: i + 1])
