"""Every Redis key compactd writes, built in one place.

<prefix>:{<topic>}:...          per-topic state; one hash tag per topic keeps the merge script on one Cluster
                                slot. The Lua script derives these from the base it is given:
                                ps:<bucket> hashes (a packed record per partition: cleaned, log_start,
                                its segments and when the last clean was seen; lua/part.lua), layout hash
                                (which layouts are migrated),
                                gid hash (group -> per-topic id), o:<id>:<bucket> hashes (partition -> offset,
                                128 partitions each), t:<id>:<bucket> hashes (partition -> its commit's event time,
                                where the JSON commits topic gives one: a group's deletion is ordered by it), oc / ob
                                hashes (id -> partitions with an offset / highest bucket), ct hash (id -> the
                                group's latest commit time on the topic), groups / counted / asg (assigned) / parts
                                sets, applied hash (stream id -> last merged batch), rc hash (every replica's own
                                log: cleaner checkpoint, local log start; lua/replicas.lua), se hash
                                ("<partition>:<base>" -> a segment's last leader epoch); lua/offsets.lua has the
                                rules, lua/counted.lua how a partition's minimum over the counted groups is read
                                from the o: buckets
<prefix>:{sched}:deadlines      zset "<topic>/<partition>" -> next evaluation time (ms)
<prefix>:{act}:rec / outbox / last / nudge   the action records and their bookkeeping (one slot)
<prefix>:{state}                hash: the state epoch, the last merged batch per stream, a rebuild's targets, the gate
<prefix>:topics, <prefix>:gt:<group>         indexes (single-key operations only)
<prefix>:topic-ids              hash: topic -> the topic ID (KIP-516) its state describes, where the cluster reports one
<prefix>:resets                 hash: topic -> JSON {"at", "why", "partitions"} of its last reset (re-created topic)
"""

from __future__ import annotations

from dataclasses import dataclass

PART_BUCKET = 128  # partitions per ps:<bucket> hash (lua/part.lua)
OFFSET_BUCKET = 128  # partitions per o:<id>:<bucket> hash (lua/offsets.lua, lua/counted.lua)

# The Redis settings compactd's state is sized for (docs/operations.md, "Running it"): a partition's packed record
# (lua/part.lua) is about 90 B with 5 segments, over the default 64 B that keeps a hash in its compact listpack
# encoding, and a topic's set of partitions stays a compact intset up to 16,384 partitions instead of the default 512.
# Without them the state is correct and about 1.7 x larger per partition.
REDIS_CONFIG = {"hash-max-listpack-value": "256", "set-max-intset-entries": "16384"}


@dataclass(frozen=True)
class RedisKeys:
    prefix: str = "cd"

    def topic_base(self, topic: str) -> str:
        return f"{self.prefix}:{{{topic}}}"

    def partition_records(self, topic: str, partition: int) -> str:
        """The hash holding a partition's packed record (field: the partition; lua/part.lua has the format)."""
        return f"{self.topic_base(topic)}:ps:{partition // PART_BUCKET}"

    def layout(self, topic: str) -> str:
        return f"{self.topic_base(topic)}:layout"

    def counted_groups(self, topic: str) -> str:
        return f"{self.topic_base(topic)}:counted"

    def groups(self, topic: str) -> str:
        return f"{self.topic_base(topic)}:groups"

    def partitions(self, topic: str) -> str:
        return f"{self.topic_base(topic)}:parts"

    def group_ids(self, topic: str) -> str:
        return f"{self.topic_base(topic)}:gid"

    def assigned_groups(self, topic: str) -> str:
        """Groups with members assigned to the topic (group metadata), committed there or not."""
        return f"{self.topic_base(topic)}:asg"

    def replica_logs(self, topic: str) -> str:
        """Every replica's own log as the agents report it (`replica_log`), and each partition's replica assignment
        (lua/replicas.lua has the fields)."""
        return f"{self.topic_base(topic)}:rc"

    def segment_epochs(self, topic: str) -> str:
        """`<partition>:<base offset>` -> the leader epoch of that segment's last record, where its report gave one
        (lua/merge.lua keeps it as long as the segment)."""
        return f"{self.topic_base(topic)}:se"

    def commit_times(self, topic: str) -> str:
        """id -> a group's latest offset commit time on the topic (epoch ms), for `compactd explain`."""
        return f"{self.topic_base(topic)}:ct"

    def offset_buckets(self, topic: str) -> str:
        """id -> highest bucket of a group's offsets on the topic."""
        return f"{self.topic_base(topic)}:ob"

    def offset_bucket(self, topic: str, group_id: str, bucket: int) -> str:
        return f"{self.topic_base(topic)}:o:{group_id}:{bucket}"

    def group_topics(self, group: str) -> str:
        return f"{self.prefix}:gt:{group}"

    def group_assigned(self, group: str) -> str:
        """Topics a group's members are assigned (from group metadata), for unassigning what a rebalance drops."""
        return f"{self.prefix}:ga:{group}"

    @property
    def topics(self) -> str:
        return f"{self.prefix}:topics"

    @property
    def deadlines(self) -> str:
        return f"{self.prefix}:{{sched}}:deadlines"

    @property
    def retired(self) -> tuple[str, ...]:
        """Keys earlier versions wrote and nothing reads any more, deleted at start: the compaction-due zset (a member
        a partition, about 104 B each, read by no decision: the deadline already holds the time a partition's
        compaction becomes due, and `explain` derives it from the partition's state; issue 65)."""
        return (f"{self.prefix}:{{sched}}:compaction-due",)

    @property
    def records(self) -> str:
        return f"{self.prefix}:{{act}}:rec"

    @property
    def outbox(self) -> str:
        return f"{self.prefix}:{{act}}:outbox"

    @property
    def last(self) -> str:
        return f"{self.prefix}:{{act}}:last"

    @property
    def nudge(self) -> str:
        return f"{self.prefix}:{{act}}:nudge"

    @property
    def state_health(self) -> str:
        """Whether this Redis still holds the state the job's checkpoint assumes: `epoch`, `batch:<stream id>` (the
        last merged batch), `rebuild` (source offsets a rebuild must reach), `gate` = JSON {"open", "why",
        "since"} of the delete gate, and `readers` = JSON {"at", "holds", "status"} of the readers that commit no group
        offsets as the job last read them (control/readers.py), for explain; never read back for a decision."""
        return f"{self.prefix}:{{state}}"

    @property
    def group_deleted_at(self) -> str:
        """Sorted set: group -> the event time of its latest deletion from the JSON commits topic. A commit of the
        group older than that, read in a later batch (another partition of that topic), never counts."""
        return f"{self.prefix}:group-deleted-at"

    def shard_mark(self, tag: str) -> str:
        """A Redis Cluster shard's copy of the state epoch and last merged batches (one per primary, `tag` chosen so
        the key lands on it): a failover that loses one shard's writes loses its mark, or leaves it behind."""
        return f"{self.prefix}:{{mark-{tag}}}"

    @property
    def topic_ids(self) -> str:
        return f"{self.prefix}:topic-ids"

    @property
    def unlisted(self) -> str:
        """topic -> JSON {"at", "groups"}: counted groups the cluster did not list at the last delete check."""
        return f"{self.prefix}:unlisted"

    @property
    def resets(self) -> str:
        return f"{self.prefix}:resets"

    @property
    def config_layers(self) -> str:
        return f"{self.prefix}:{{cfg}}:layers"
