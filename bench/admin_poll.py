"""One poll of `compactd agent --admin` at scale: Admin API requests and seconds per poll, against Apache Kafka.

Starts its own Apache Kafka broker and builds the cluster a poll reads: PARTITIONS partitions (topics of
TOPIC_PARTITIONS each), a few records on a sample of them (so ListOffsets answers non-zero ends), and GROUPS consumer
groups that each hold committed offsets on GROUP_PARTITIONS partitions of one topic. The offsets are written with
AlterConsumerGroupOffsets, one request per group, all in flight (no member ever joins: 1,000 real consumers would
take longer than the polls measured); a consumer committing without joining is the fallback where the broker
refuses it.

Then POLLS scans of one AdminAgent with one AdminPoll (slice and grace as the CLI's defaults, the real clock): the
first publishes everything, and before each later one MOVED groups move their commits and APPENDED partitions get a
record (a slice opens, and closes at the next poll once quiet). Nothing is published: `scan` only, its events
counted and compared with what the changes made should give. Per poll: seconds (and where they go, the agent's
steps timed from subclasses), Admin API calls as the agent counts them (PollStats.calls) and the requests librdkafka
actually sent, by type (its statistics; OffsetFetch, which an admin client's statistics leave out, as the group reader
counts them), events, groups, partitions, and the `copy.deepcopy` of the AdminPoll state that `run_admin_agent` takes
before each poll. Also the setup's seconds and the process's peak RSS.

The default scale: 1,000 groups, 10,000 partitions (setup_seconds in the output says what each step took).
Prints one JSON object; progress goes to stderr.
Usage: python bench/admin_poll.py [--groups 1000] [--partitions 10000] [--polls 3] (small: --groups 20 --partitions 200)
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from compactd.agent.admin_agent import AdminAgent, PollStats
from compactd.agent.admin_poll import AdminPoll, Event
from compactd.kafka.config import KafkaConnection
from compactd.kafka.groups import GroupReader
from compactd.local.broker import kafka_broker, kafka_version
from compactd.model import PartitionOffsets

log = logging.getLogger("compactd.bench")
TP = tuple[str, int]


# -- where a poll's seconds go: the agent's steps, timed from subclasses (the code timed is the agent's own)
class Phases:
    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()

    def timed(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds[name] += time.perf_counter() - t0


PHASES = Phases()  # module-level: the AdminPoll is deep-copied, its timer must not be


class TimedReader(GroupReader):
    def list_groups(self) -> set[str]:
        return PHASES.timed("list_groups", super().list_groups)

    def fetch(self, groups: Any) -> dict[str, PartitionOffsets | Exception]:
        return PHASES.timed("offset_fetch", super().fetch, groups)


class TimedAgent(AdminAgent):
    def __init__(self, conn: KafkaConnection, poll: AdminPoll, timeout_s: float) -> None:
        super().__init__(conn, poll, timeout_s=timeout_s)
        self.groups = TimedReader(conn, timeout_s)

    def partitions(self) -> list[tuple[str, int]]:
        return PHASES.timed("metadata", super().partitions)

    def _offsets(self, parts: list[tuple[str, int]], spec: Any) -> dict[tuple[str, int], int]:
        name = "list_offsets_" + type(spec).__name__.removesuffix("Spec").lower()
        return PHASES.timed(name, super()._offsets, parts, spec)


class TimedPoll(AdminPoll):
    def offsets(self, now: int, listed: set[str], fetched: Mapping[str, PartitionOffsets | Exception]) -> list[Event]:
        return PHASES.timed("poll_offsets", super().offsets, now, listed, fetched)

    def logs_seen(
        self, now: int, starts: PartitionOffsets, ends: PartitionOffsets, watched: set[TP] | None = None
    ) -> list[Event]:
        return PHASES.timed("poll_logs_seen", super().logs_seen, now, starts, ends, watched)


# -- the requests librdkafka sent, from its statistics (brokers[].req: cumulative counts by request type)
class Requests:
    """librdkafka leaves OffsetFetch (and the other consumer-group requests) out of the statistics of a producer
    handle, which an AdminClient is: that count is the group reader's own (one request per group it asks)."""

    def __init__(self) -> None:
        self.ts_s = 0.0  # librdkafka's monotonic clock (CLOCK_MONOTONIC, as time.monotonic) of the last statistics
        self.counts: Counter[str] = Counter()

    def on_stats(self, raw: str) -> None:
        stats = json.loads(raw)
        counts: Counter[str] = Counter()
        for broker in stats.get("brokers", {}).values():
            counts.update({k: v for k, v in broker.get("req", {}).items() if v})
        self.ts_s, self.counts = stats["ts"] / 1e6, counts

    def after(self, admin: Any, t: float, wait_s: float = 5.0) -> Counter[str]:
        """Cumulative counts from statistics taken after monotonic time `t` (served by the admin client's poll)."""
        deadline = time.monotonic() + wait_s
        while self.ts_s <= t and time.monotonic() < deadline:
            admin.poll(0.1)
        return Counter(self.counts)


# -- the cluster
def topic_sizes(partitions: int, per_topic: int) -> dict[str, int]:
    full, rest = divmod(partitions, per_topic)
    sizes = {f"bench.t{i:04d}": per_topic for i in range(full)}
    if rest:
        sizes[f"bench.t{full:04d}"] = rest
    return sizes


def create_topics(admin: AdminClient, sizes: dict[str, int], batch: int, timeout_s: float) -> None:
    """CreateTopics `batch` topics a request, then wait until metadata lists every partition (the agent's view)."""
    names = list(sizes)
    for i in range(0, len(names), batch):
        futures = admin.create_topics([NewTopic(t, sizes[t], 1) for t in names[i : i + batch]])
        for fut in futures.values():
            fut.result(timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        meta = admin.list_topics(timeout=timeout_s).topics
        if all(t in meta and len(meta[t].partitions) == n for t, n in sizes.items()):
            return
        if time.monotonic() > deadline:
            raise RuntimeError("created topics not all in metadata within the timeout")
        time.sleep(0.2)


def produce(bootstrap: str, tps: list[TP], records: int) -> None:
    p = Producer(KafkaConnection(bootstrap).client("producer", {"linger.ms": 20}))
    for topic, partition in tps:
        for i in range(records):
            p.produce(topic, key=b"k%d" % i, value=b"v", partition=partition)
        p.poll(0)
    if p.flush(60):
        raise RuntimeError("records left undelivered")


def group_assignment(groups: int, sizes: dict[str, int], per_group: int) -> dict[str, list[TP]]:
    """Group i commits on `per_group` consecutive partitions of topic i mod topics, starting further along the
    topic for each round of groups over the topics, so the groups spread over the partitions."""
    topics = list(sizes)
    out = {}
    for i in range(groups):
        topic = topics[i % len(topics)]
        n = sizes[topic]
        first = (i // len(topics)) * per_group
        out[f"bench.g{i:05d}"] = [(topic, (first + j) % n) for j in range(min(per_group, n))]
    return out


def commit(admin: AdminClient, bootstrap: str, offsets: dict[str, dict[TP, int]], timeout_s: float) -> str:
    """Each group's offsets written without a member joining: AlterConsumerGroupOffsets (one group a request, all
    in flight), or, where the broker refuses it, a consumer per group committing without subscribing. Which."""
    try:
        futures = [
            fut
            for group, tps in offsets.items()
            for fut in admin.alter_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group, [TopicPartition(t, p, o) for (t, p), o in tps.items()])],
                request_timeout=timeout_s,
            ).values()
        ]
        for fut in futures:
            for tp in fut.result(timeout_s).topic_partitions:
                if tp.error is not None:
                    raise KafkaException(tp.error)
        return "AlterConsumerGroupOffsets"
    except KafkaException as exc:
        log.warning("AlterConsumerGroupOffsets refused (%s): consumers commit without joining", exc)
    conn = KafkaConnection(bootstrap)
    for group, tps in offsets.items():
        c = Consumer(conn.client("consumer", forced={"group.id": group}))
        try:
            c.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in tps.items()], asynchronous=False)
        finally:
            c.close()
    return "Consumer.commit without joining"


# -- the polls
def one_poll(agent: TimedAgent, requests: Requests) -> tuple[dict[str, Any], int, int]:
    """The deepcopy `run_admin_agent` takes, then one scan: its figures, commit and segment events."""
    t0 = time.perf_counter()
    copy.deepcopy(agent.poll)
    deepcopy_s = time.perf_counter() - t0
    before, fetches = Counter(requests.counts), agent.groups.fetches
    PHASES.seconds.clear()
    segments, commits, st = agent.scan()
    ended = time.monotonic()
    sent = requests.after(agent.admin, ended) - before
    sent["OffsetFetch"] = agent.groups.fetches - fetches  # not in an admin client's statistics: see the docstring
    phases = {k: round(v, 3) for k, v in PHASES.seconds.items()}
    phases["other"] = round(st.seconds - sum(PHASES.seconds.values()), 3)
    out = stats_row(st) | {
        "deepcopy_before_s": round(deepcopy_s, 3),
        "phase_seconds": phases,
        "requests_sent": dict(sorted(sent.items())),
        "requests_sent_total": sum(sent.values()),
        "event_types": dict(Counter(e["type"] for e in segments + commits)),
    }
    return out, len(commits), len(segments)


def stats_row(st: PollStats) -> dict[str, Any]:
    return {
        "seconds": round(st.seconds, 3),
        "calls": st.calls,
        "commit_events": st.commit_events,
        "segment_events": st.segment_events,
        "groups": st.groups,
        "group_errors": st.group_errors,
        "partitions": st.partitions,
    }


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=10_000, help="in the whole cluster")
    ap.add_argument("--topic-partitions", type=int, default=100, help="partitions of each topic")
    ap.add_argument("--group-partitions", type=int, default=10, help="partitions (of one topic) each group commits")
    ap.add_argument("--written", type=float, default=0.1, help="share of partitions given records before poll 1")
    ap.add_argument("--records", type=int, default=3, help="records on each of those partitions")
    ap.add_argument("--polls", type=int, default=3)
    ap.add_argument("--moved", type=float, default=0.1, help="share of groups moving their commits between polls")
    ap.add_argument("--appended", type=float, default=0.01, help="share of partitions given a record between polls")
    ap.add_argument("--timeout", type=float, default=30.0, help="the agent's timeout_s (the CLI's)")
    args = ap.parse_args()

    t_start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="compactd-admin-poll-bench-"))
    broker = kafka_broker(work / "broker")
    try:
        bootstrap = f"127.0.0.1:{broker.port}"
        conn = KafkaConnection(bootstrap)
        admin = AdminClient(conn.client("admin"))
        sizes = topic_sizes(args.partitions, args.topic_partitions)
        every = sorted((t, p) for t, n in sizes.items() for p in range(n))
        setup: dict[str, float] = {}

        t0 = time.monotonic()
        create_topics(admin, sizes, 50, max(60.0, args.timeout))
        setup["topics"] = time.monotonic() - t0
        log.warning("%d topics, %d partitions: %.1fs", len(sizes), len(every), setup["topics"])

        t0 = time.monotonic()
        step = max(1, round(1 / args.written)) if args.written > 0 else 0
        written = every[::step] if step else []
        produce(bootstrap, written, args.records)
        setup["produce"] = time.monotonic() - t0
        log.warning("%d records on %d partitions: %.1fs", args.records * len(written), len(written), setup["produce"])

        t0 = time.monotonic()
        assigned = group_assignment(args.groups, sizes, args.group_partitions)
        committed = {
            g: {tp: 1 + (i + j) % 5 for j, tp in enumerate(tps)} for i, (g, tps) in enumerate(assigned.items())
        }
        how = commit(admin, bootstrap, committed, max(60.0, args.timeout))
        setup["commits"] = time.monotonic() - t0
        log.warning("%d groups committed (%s): %.1fs", len(committed), how, setup["commits"])
        setup_s = time.monotonic() - t_start
        log.warning("setup: %.1fs", setup_s)

        requests = Requests()
        extra: dict[str, Any] = {"statistics.interval.ms": 200, "stats_cb": requests.on_stats}
        agent = TimedAgent(KafkaConnection(bootstrap, extra), TimedPoll(60_000, 300_000), args.timeout)
        polls, deepcopy_s, between = [], None, []
        moved_n = round(args.groups * args.moved)
        appended_n = round(len(every) * args.appended)
        group_names = list(committed)
        appended_before: list[TP] = []  # appended before the poll before this one: quiet since, their slice closes
        appended_last: list[TP] = []
        for n in range(args.polls):
            if n:
                t0 = time.monotonic()
                movers = [group_names[(n * moved_n + k) % len(group_names)] for k in range(moved_n)]
                for g in movers:
                    committed[g] = {tp: o + 10 for tp, o in committed[g].items()}
                commit(admin, bootstrap, {g: committed[g] for g in movers}, max(60.0, args.timeout))
                appended_before = appended_last
                appended_last = [every[(n * 7919 + k * 101) % len(every)] for k in range(appended_n)]
                produce(bootstrap, appended_last, 1)
                between.append(round(time.monotonic() - t0, 2))
                moved_tps = sum(len(committed[g]) for g in set(movers))
                expected = (moved_tps, len(set(appended_before) - set(appended_last)))
            else:
                expected = (sum(map(len, committed.values())), len(every) + len(written))
            row, commits, segments = one_poll(agent, requests)
            row["expected_events"] = {"commit": expected[0], "segment": expected[1]}
            if (commits, segments) != expected:
                log.warning("poll %d: events (%d, %d), expected %s", n + 1, commits, segments, expected)
            polls.append(row)
            log.warning("poll %d: %s", n + 1, row)
            if n == 0:
                t0 = time.perf_counter()
                copy.deepcopy(agent.poll)
                deepcopy_s = time.perf_counter() - t0
        agent.close()
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(
        json.dumps(
            {
                "benchmark": "admin_poll",
                "groups": args.groups,
                "partitions": len(every),
                "topics": len(sizes),
                "group_partitions": args.group_partitions,
                "written_partitions": len(written),
                "moved_groups_between_polls": moved_n,
                "appended_partitions_between_polls": appended_n,
                "polls": polls,
                "deepcopy_s": None if deepcopy_s is None else round(deepcopy_s, 3),
                "setup_s": round(setup_s, 2),
                "setup_seconds": {k: round(v, 2) for k, v in setup.items()},
                "commits_written_with": how,
                "between_polls_s": between,
                "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                "broker": f"Apache Kafka {kafka_version()}",
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "librdkafka": confluent_kafka.libversion()[0],
                },
                "wall_s": round(time.monotonic() - t_start, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
