"""The deleteRecords safety property over the admin source, generated: real Redis, the real controller, the admin
agent's own poll logic (agent/admin_poll.py), random cluster histories.

The cluster is a model: groups commit (forwards and back) and are deleted and come back, records are written,
deletes are carried out. compactd sees it only through the agent's polls, which miss every commit made between two
polls, fail as a whole (nothing published, the poll's state put back as `run_admin_agent` does), or fail for one
group (its offsets stand). Between polls compactd's state lags the cluster; the check before each delete
(`cluster_check`, reading the cluster's committed offsets then; strict on this source) is what holds a delete a
rewind made unsafe, or one the state allows only because it still counts a group the cluster deleted.

Checked after every step:
- no consumed-retention delete reaches the sink past the minimum committed offset of the groups the cluster has on
  that partition at that moment (a group without an offset there means no delete);
- after a poll that read every group, compactd's minimum is never above the cluster's (missed commits, a failed poll
  or a group still in its grace only make it lower or unknown).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import Any

import redis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from compactd.agent.admin_poll import AdminPoll, Event
from compactd.control.controller import Controller
from compactd.control.metrics import Metrics
from compactd.kafka.groups import GroupCheck
from compactd.model import ActionRecord, Segment
from compactd.settings import Settings
from compactd.sinks.recording import RecordingSink
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState

S = 1000
T0 = 1_800_000_000_000
TOPIC = "orders"
PARTS = (0, 1)
GROUPS = ("billing", "batch-etl", "search")
GRACE_MS = 60 * S
RETENTION_MS = 30 * S
EXAMPLES = int(os.environ.get("COMPACTD_PROPERTY_EXAMPLES", "60"))


@dataclass
class Cluster:
    """The cluster as it is: the oracle. compactd never reads it but through the agent's polls and the check."""

    offsets: dict[str, dict[int, int]] = field(default_factory=dict)  # live group -> partition -> committed
    start: dict[int, int] = field(default_factory=lambda: dict.fromkeys(PARTS, 0))
    end: dict[int, int] = field(default_factory=lambda: dict.fromkeys(PARTS, 0))

    def min_committed(self, p: int) -> int | None:
        if not self.offsets or any(p not in parts for parts in self.offsets.values()):
            return None
        return min(parts[p] for parts in self.offsets.values())


def changes(events: list[Event]) -> BatchChanges:
    """The agent's events as the job merges them (the decoder and the reduction do this on the real path)."""
    batch = BatchChanges()
    tc = batch.topic(TOPIC)
    for ev in events:
        kind = ev["type"]
        if kind == "offset_commit":
            tc.offsets.append((ev["group"], ev["partition"], ev["offset"]))
        elif kind == "offset_delete":
            tc.offsets.append((ev["group"], ev["partition"], None))
        elif kind == "group_delete":
            batch.group_deletes.append(ev["group"])
        elif kind == "segment_rolled":
            seg = Segment(ev["base_offset"], ev["end_offset"], ev["first_batch_max_ts"], 1, ev["ts"])
            tc.segments.append((ev["partition"], seg))
        elif kind == "log_start":
            tc.log_start.append((ev["partition"], ev["log_start_offset"]))
    return batch


step = st.one_of(
    st.tuples(st.just("commit"), st.sampled_from(GROUPS), st.sampled_from(PARTS), st.integers(-60, 120)),
    st.tuples(st.just("commit"), st.sampled_from(GROUPS), st.sampled_from(PARTS), st.integers(-60, 120)),
    st.tuples(st.just("write"), st.sampled_from(PARTS), st.integers(1, 80)),
    st.tuples(st.just("poll"), st.sampled_from(["ok", "ok", "ok", "fails", "one_group_fails"])),
    st.tuples(st.just("poll"), st.sampled_from(["ok", "ok", "ok", "fails", "one_group_fails"])),
    st.tuples(st.just("time"), st.integers(1, 90).map(lambda s: s * S)),
    st.tuples(st.just("group_delete"), st.sampled_from(GROUPS)),
)

# every history starts with groups reading two bursts of records the agent has seen
PROLOGUE: list[tuple[Any, ...]] = [
    *(("write", p, 100) for p in PARTS),
    ("poll", "ok"),
    ("time", 10 * S),
    ("poll", "ok"),
    *(("commit", g, p, 100) for g in GROUPS for p in PARTS),
    ("poll", "ok"),
]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(step, min_size=5, max_size=40))
def test_no_delete_past_the_clusters_minimum_whatever_the_polls_missed(
    rclient: redis.Redis, history: list[tuple[Any, ...]]
) -> None:
    rclient.flushall()
    cluster, clock, violations = Cluster(), [T0], []
    sent = [0]

    def answer(rec: ActionRecord) -> ActionRecord:
        if rec.action == "delete_records" and rec.before_offset is not None:
            floor = cluster.min_committed(rec.partition)
            if rec.reason == "consumed_retention" and (floor is None or rec.before_offset > floor):
                violations.append(f"sent delete before {rec.before_offset} on p{rec.partition}, cluster min {floor}")
            if rec.before_offset > cluster.end[rec.partition]:
                violations.append(f"sent delete before {rec.before_offset} past the log end {cluster.end}")
            cluster.start[rec.partition] = max(cluster.start[rec.partition], rec.before_offset)
            sent[0] += 1
            event("delete sent")
        return rec.with_status("sent")

    state = RedisState(rclient)

    def check(topic: str, fresh: bool) -> GroupCheck:
        """The cluster's answer to ListGroups + OffsetFetch at this moment (ClusterGroupOffsets with no cache)."""
        committed = {g: dict(parts) for g, parts in cluster.offsets.items()}
        return GroupCheck.of_offsets(committed, frozenset(set(state.groups(topic)) - committed.keys()))

    ctl = Controller(
        state,
        {"global": {"dry.run": False, "consumed.retention.ms": RETENTION_MS}},
        RecordingSink(answer),
        None,
        Metrics(CollectorRegistry()),
        clock=lambda: clock[0],
        cluster_offsets=check,
        strict_groups=Settings(offsets_source="admin").strict_groups,  # as the job wires it for this source
    )
    poll = AdminPoll(slice_ms=20 * S, group_grace_ms=GRACE_MS)
    batch_id = 0
    for op in PROLOGUE + history:
        kind = op[0]
        if kind == "commit":
            group, p, move = op[1], op[2], op[3]
            parts = cluster.offsets.setdefault(group, {})
            parts[p] = min(max(parts.get(p, 0) + move, cluster.start[p]), cluster.end[p])  # back, forth, or new
            if move < 0:
                event("a group rewinds")
        elif kind == "write":
            cluster.end[op[1]] += op[2]
        elif kind == "group_delete":
            if cluster.offsets.pop(op[1], None) is not None:
                event("a group is deleted (it may come back with its next commit)")
        elif kind == "time":
            clock[0] += op[1]
            ctl.tick()
        elif kind == "poll":
            before = copy.deepcopy(poll)
            now = clock[0]
            listed = set(cluster.offsets)
            failing = sorted(listed)[:1] if op[1] == "one_group_fails" else []
            fetched: dict[str, Any] = {
                g: RuntimeError("COORDINATOR_NOT_AVAILABLE")
                if g in failing
                else {(TOPIC, p): o for p, o in parts.items()}
                for g, parts in cluster.offsets.items()
            }
            events = poll.offsets(now, listed, fetched)
            events += poll.logs_seen(
                now, {(TOPIC, p): cluster.start[p] for p in PARTS}, {(TOPIC, p): cluster.end[p] for p in PARTS}
            )
            if op[1] == "fails":  # the publish failed: nothing reached the job, the next poll says it again
                poll = before
                event("a poll fails")
            else:
                ctl.on_batch("s", batch_id, changes(events))
                batch_id += 1
                if op[1] == "ok":
                    for p in PARTS:
                        mine, truth = state.view(TOPIC, p).min_committed, cluster.min_committed(p)
                        if mine is not None and truth is not None and mine > truth:
                            violations.append(f"after a full poll: state min {mine} above the cluster's {truth}")
        assert not violations, (op, violations)
    clock[0] += 10 * RETENTION_MS
    ctl.tick()
    assert not violations, violations
