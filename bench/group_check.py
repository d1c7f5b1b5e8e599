"""The check before a consumed-retention delete at scale: what one round of the cluster's group offsets costs.

Since issue 64 every listed group is read again once its answer is older than `cluster_offsets_ttl_ms` (a group read
for one topic may have committed on another since), whatever compactd's state links it to: the cost a round is one
OffsetFetch per listed group, and that round answers every topic's check within the ttl. This measures it against
Apache Kafka: GROUPS groups with commits (set with AlterConsumerGroupOffsets, all in flight), spread over TOPICS
topics; then `ClusterGroupOffsets.check` on each topic, with the clock moved past the ttl between ROUNDS rounds.
Per round: the seconds of the first check (the one that reads every group), the seconds of the checks of the other
topics in the same ttl (cached), and the OffsetFetch requests sent; also a fresh check (a cached answer held the
delete), which reads only the groups on that topic.

Prints one JSON object; progress goes to stderr.
Usage: python bench/group_check.py [--groups 2000] [--topics 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import shutil
import tempfile
import time
from pathlib import Path

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from compactd.kafka.config import KafkaConnection
from compactd.kafka.groups import ClusterGroupOffsets
from compactd.local.broker import kafka_broker, kafka_version

log = logging.getLogger("compactd.bench")


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=2000)
    ap.add_argument("--topics", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="compactd-group-check-bench-"))
    broker = kafka_broker(work / "broker")
    try:
        bootstrap = f"127.0.0.1:{broker.port}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        topics = [f"t{i}" for i in range(args.topics)]
        for fut in admin.create_topics([NewTopic(t, 1, 1) for t in topics]).values():
            fut.result(60)
        t0 = time.monotonic()
        futures = [
            fut
            for g in range(args.groups)
            for fut in admin.alter_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(f"g{g}", [TopicPartition(topics[g % len(topics)], 0, 1 + g)])]
            ).values()
        ]
        for fut in futures:
            fut.result(60)
        log.warning("%d groups committed: %.1fs", args.groups, time.monotonic() - t0)

        clock = [0.0]
        offsets = ClusterGroupOffsets(KafkaConnection(bootstrap), ttl_s=5.0, monotonic=lambda: clock[0])
        rounds = []
        for n in range(args.rounds):
            before = offsets.fetches
            t0 = time.perf_counter()
            first = offsets.check(topics[0])
            first_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            for t in topics[1:]:
                offsets.check(t)
            rest_s = time.perf_counter() - t0
            row = {
                "first_check_s": round(first_s, 3),
                "other_topics_s": round(rest_s, 4),
                "offset_fetches": offsets.fetches - before,
                "groups_on_first_topic": len(first.committed),
            }
            before = offsets.fetches
            t0 = time.perf_counter()
            offsets.check(topics[0], fresh=True)
            row["fresh_check_s"] = round(time.perf_counter() - t0, 3)
            row["fresh_offset_fetches"] = offsets.fetches - before
            rounds.append(row)
            log.warning("round %d: %s", n + 1, row)
            clock[0] += 5.0
        offsets.close()
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(
        json.dumps(
            {
                "bench": "group_check",
                "groups": args.groups,
                "topics": args.topics,
                "ttl_s": 5.0,
                "rounds": rounds,
                "kafka": kafka_version(),
                "machine": platform.machine(),
            }
        )
    )


if __name__ == "__main__":
    main()
