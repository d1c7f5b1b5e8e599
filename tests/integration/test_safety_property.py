"""The deleteRecords safety property, generated: real Redis, the real controller, random histories.

Histories interleave commits (forwards and rewinds), new groups, members assigned without a commit, offset and
group deletes, segment rolls, the cluster answering deletes, config changes (groups.exclude, retention), sends that
fail, time passing, process restarts, and Redis losing the whole state (a restart without persistence, a
FLUSHALL) followed by the rebuild from the sources. After every step the property is checked against an
independent model:

- no delete_records for consumed retention targets an offset above the minimum committed offset of the counted
  groups, neither when it is decided (queued) nor when it reaches the sink;
- every action the sink reports sent was handed to the sink exactly once (retries happen only after a failure),
  between two losses of the Redis state (a lost outbox cannot remember what it sent).

COMPACTD_PROPERTY_EXAMPLES raises the number of generated histories (default 40 in each mode; the soak runs thousands).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from compactd.control.controller import Controller
from compactd.control.health import StateGuard
from compactd.control.metrics import Metrics
from compactd.model import ActionRecord, Segment
from compactd.sinks.recording import RecordingSink
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState

H = 3_600_000
T0 = 1_800_000_000_000
TOPIC = "orders"
PARTS = (0, 1)
GROUPS = ("billing", "batch-etl")
EXAMPLES = int(os.environ.get("COMPACTD_PROPERTY_EXAMPLES", "40"))


@dataclass
class Model:
    """What the history says, kept apart from compactd's own state: the oracle."""

    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    assigned: set[str] = field(default_factory=set)
    exclude: str = ""
    ends: dict[int, int] = field(default_factory=lambda: dict.fromkeys(PARTS, 0))

    def counted(self) -> set[str]:
        holding = {g for g, _ in self.offsets} | self.assigned
        return {g for g in holding if not (self.exclude and re.fullmatch(self.exclude, g))}

    def min_committed(self, partition: int) -> int | None:
        counted = self.counted()
        if not counted or any((g, partition) not in self.offsets for g in counted):
            return None
        return min(self.offsets[(g, partition)] for g in counted)


class Checked(RedisState):
    """RedisState that checks every queued delete against the model at the moment it is queued, unless the delete
    gate is closed (a rebuild replaying history decides from a past state; the gate makes those `skipped`, and the
    sink-side check still holds)."""

    model: Model
    violations: list[str]
    gate: Any

    def enqueue(self, *recs: ActionRecord) -> None:
        for rec in recs:
            if self.gate():
                check(rec, self.model, "decided", self.violations)
        super().enqueue(*recs)


def check(rec: ActionRecord, model: Model, when: str, violations: list[str]) -> None:
    if rec.action != "delete_records" or rec.reason != "consumed_retention":
        return
    floor = model.min_committed(rec.partition)
    if floor is None or (rec.before_offset or 0) > floor:
        violations.append(f"{when}: delete before {rec.before_offset} on p{rec.partition}, min committed {floor}")


commit = st.tuples(st.just("commit"), st.sampled_from(GROUPS), st.sampled_from(PARTS), st.integers(0, 400))
roll = st.tuples(st.just("roll"), st.sampled_from(PARTS), st.integers(1, 150))
# commits and rolls are most of a real history; the rest are rarer events, each drawn about as often as the other
step = st.one_of(
    commit,
    commit,
    commit,
    roll,
    roll,
    st.tuples(st.just("sink_down"), st.booleans()),
    st.tuples(st.just("sink_down"), st.booleans()),
    st.tuples(st.just("time"), st.integers(1, 10 * H)),
    st.tuples(st.just("time"), st.integers(1, 10 * H)),
    st.tuples(st.just("offset_delete"), st.sampled_from(GROUPS), st.sampled_from(PARTS)),
    st.tuples(st.just("group_delete"), st.sampled_from(GROUPS)),
    st.tuples(st.just("assign"), st.sampled_from(GROUPS), st.booleans()),
    st.tuples(st.just("answer"), st.sampled_from(PARTS)),
    st.tuples(st.just("exclude"), st.sampled_from(["", "batch-.*", "billing"])),
    st.tuples(st.just("retention"), st.sampled_from([0, H, 100 * H])),
    st.tuples(
        st.just("restart"),
    ),
    st.tuples(st.just("redis_lost"), st.sampled_from(PARTS)),
)


# Every history starts where deletes are possible: segments rolled, every group read past the first ones.
PROLOGUE: list[tuple[Any, ...]] = [
    *(("roll", p, 100) for p in PARTS),
    *(("roll", p, 100) for p in PARTS),
    *(("commit", g, p, 150) for g in GROUPS for p in PARTS),
]


@pytest.mark.parametrize("slices", [0, 2], ids=["evaluated-here", "in-slices"])
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(step, min_size=5, max_size=40), st.data())
def test_no_delete_past_the_minimum_and_sent_exactly_once(
    rclient: redis.Redis, slices: int, history: list[tuple[Any, ...]], data: st.DataObject
) -> None:
    rclient.flushall()
    model, violations = Model(), []
    clock, down, final = [T0], [False], [False]
    sent_calls: Counter[str] = Counter()

    def answer(rec: ActionRecord) -> ActionRecord:
        check(rec, model, "sent", violations)
        # besides outages, any single request may time out (about one in three)
        if down[0] or (not final[0] and data.draw(st.integers(0, 2), label="timeout") == 0):
            return rec.with_status("failed", error="broker unavailable")
        sent_calls[f"{rec.id}/{rec.detail.get('try', 0)}"] += 1
        event(f"sent {rec.action} {rec.reason}" + (" after a retry" if rec.detail.get("try") else ""))
        return rec.with_status("sent")

    sink = RecordingSink(answer)
    layers: dict[str, dict[str, Any]] = {"global": {"dry.run": False, "consumed.retention.ms": H}}
    checkpoint = Path(tempfile.mkdtemp(prefix="compactd-property-"))
    guard = StateGuard(RedisState(rclient), checkpoint, checkpoint / "spark")
    assert guard.loss_at_start("s") is None
    gate_open = [True]  # the application's gate: closed from a detected loss until the rebuild has caught up
    merged: list[BatchChanges] = []  # every batch merged so far: what the sources hold, for a rebuild to read again

    def new_controller() -> Controller:
        state = Checked(rclient)
        state.model, state.violations, state.gate = model, violations, lambda: gate_open[0]
        return Controller(
            state,
            layers,
            sink,
            None,
            Metrics(CollectorRegistry()),
            clock=lambda: clock[0],
            deletes_allowed=lambda: gate_open[0] and guard.intact(),
            slices=slices,
        )

    ctl, batch_id = new_controller(), 0
    for op in PROLOGUE + history:
        batch = BatchChanges()
        tc = batch.topic(TOPIC)
        kind = op[0]
        if kind == "commit":
            model.offsets[(op[1], op[2])] = op[3]
            tc.offsets.append((op[1], op[2], op[3]))
        elif kind == "offset_delete":
            model.offsets.pop((op[1], op[2]), None)
            tc.offsets.append((op[1], op[2], None))
        elif kind == "group_delete":
            model.offsets = {k: v for k, v in model.offsets.items() if k[0] != op[1]}
            model.assigned.discard(op[1])
            batch.group_deletes = [op[1]]
        elif kind == "assign":
            (model.assigned.add if op[2] else model.assigned.discard)(op[1])
            batch.assignments[op[1]] = {TOPIC: list(PARTS)} if op[2] else {}
        elif kind == "roll":
            p, size = op[1], op[2]
            start = model.ends[p]
            model.ends[p] = start + size
            tc.segments.append((p, Segment(start, start + size, clock[0] - 20 * H, 1, clock[0] - 10 * H)))
        elif kind == "answer":  # the cluster carried a sent delete out: the log start moves
            rec = ctl.state.records([(TOPIC, op[1])])[(TOPIC, op[1])]
            done = [r for r in rec if r.action == "delete_records" and r.status == "sent"]
            if done and done[0].before_offset is not None:
                tc.log_start.append((op[1], done[0].before_offset))
        elif kind in ("exclude", "retention"):
            if kind == "exclude":
                model.exclude = op[1]
                layers["global"]["groups.exclude"] = [op[1]] if op[1] else []
            else:
                layers["global"]["consumed.retention.ms"] = op[1]
            ctl.set_layers(layers)
            ctl.evaluate(ctl.recount_groups(), "config")
            continue
        elif kind == "sink_down":
            down[0] = op[1]
            continue
        elif kind == "time":
            clock[0] += op[1]
            ctl.tick()
            continue
        elif kind == "restart":
            ctl = new_controller()
            ctl.tick()
            continue
        elif kind == "redis_lost":
            rclient.flushall()
            # the outbox and the audit trail of what was sent went with it: a delete may be decided and sent again
            # (harmless, deleteRecords below the log start changes nothing); exactly-once holds between losses
            sent_calls.clear()
            ctl.tick()  # the deadline ticker meets the empty Redis before anything notices
            resent = BatchChanges()  # the agent re-sends a segment, a batch merges it into what is left
            for _, seg in [x for b in merged for x in b.topic(TOPIC).segments if x[0] == op[1]][-1:]:
                resent.topic(TOPIC).segments.append((op[1], seg))
            ctl.on_batch("s", batch_id, resent)
            batch_id += 1
            assert guard.loss_now("s") is not None
            gate_open[0] = False
            guard.begin_rebuild({})
            for n, again in enumerate(merged):  # the sources read again from their start, under a new stream id
                ctl.on_batch("rebuilt", n, again)
            gate_open[0] = True
            guard.rebuild_done()
            ctl.evaluate_all()
            assert not violations, violations
            continue
        ctl.on_batch("s", batch_id, batch)
        merged.append(batch)
        guard.merged_batch("s", batch_id)
        batch_id += 1
        assert not violations, violations
        for p in PARTS:  # compactd's own view agrees with the model
            assert ctl.state.view(TOPIC, p).min_committed == model.min_committed(p), (p, model)
    down[0] = final[0] = False
    final[0] = True
    clock[0] += 10 * H
    ctl.tick()  # what failed is retried once the cluster is back
    assert not violations, violations
    assert all(n == 1 for n in sent_calls.values()), sent_calls
    completed_sent = [r for r in RedisState(rclient).last_actions().values() if r.status == "sent"]
    assert all(sent_calls[f"{r.id}/{r.detail.get('try', 0)}"] == 1 for r in completed_sent)
