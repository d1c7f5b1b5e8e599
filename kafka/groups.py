"""Consumer groups' committed offsets as the cluster itself has them (ListGroups + OffsetFetch).

The last word on what a real Kafka group has read: right before a consumed-retention delete is sent, the
controller compares it with these offsets, so no fault in compactd's own state (Redis losing writes, a bug, a
decoder missing a record) can delete what a group has not committed past — KAFKA-17635's lesson.

What is asked, and what an error costs:
- every group the cluster lists, whatever links it to the topic: at the send, no listed group's answer is older than
  `ttl_s`. Before issue 64 only the groups compactd's state or a group's last fetch put on the topic were read again,
  so a group read once for another topic that then committed on this one (in Kafka only: an `assign()` committer, an
  Empty group) was never asked, and a delete removed what it had not read (reproduced on the real broker);
- the cost is bounded by how, not by skipping groups: each group's answer (all its offsets, every topic) is kept
  `ttl_s` and answers every topic's check meanwhile, so a round is one OffsetFetch per listed group per ttl, whatever
  the number of topics and deletes, all in flight at once, and nothing while no delete is pending (the controller
  asks right before a send). 2,000 groups: 1.0-1.2 s a round here (`bench/group_check.py`); librdkafka asks one group
  per OffsetFetch (KIP-709's batching is Java's only). A fresh read (a cached answer held a delete) asks again only
  the groups that may hold the topic;
- a listed group that cannot be read holds every delete (its commits are unknown, on any topic) until it is read;
- a group compactd counts on the topic that the cluster does not list (the principal may not Describe it, or it is
  gone) is reported: `unlisted` in the answer, a gauge, and with `cluster_check: strict` the delete waits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

from compactd.codec.streams_group import MEMBER, TOPOLOGY, Topology, decode_key, decode_topology
from compactd.errors import ConfigError, DecodeError, DependencyUnavailable
from compactd.kafka.admin import admin_client, retire
from compactd.kafka.config import KafkaConnection
from compactd.kafka.coordinator import CoordinatorChild, error_text
from compactd.kafka.share_state import read_to_ends, tail_consumer
from compactd.model import PartitionOffsets
from compactd.policy.thresholds import SOURCE_GROUP_PREFIX

# group -> partition -> committed offset, for one topic
TopicCommits = dict[str, dict[int, int]]


class Commit(NamedTuple):
    """One group's commit on one partition, as OffsetFetch returns it: the offset, and the leader epoch the
    committing consumer had read it under (-1: none given, as the JSON commit events and old clients say)."""

    offset: int
    epoch: int = -1


@dataclass(frozen=True)
class GroupCheck:
    """What the cluster says of the groups of one topic: their commits, and the groups compactd knows on the topic
    that the cluster does not list."""

    commits: dict[str, dict[int, Commit]] = field(default_factory=dict)  # group -> partition -> its commit
    unlisted: frozenset[str] = frozenset()
    # groups with a member assigned a partition of the topic and no commit on the topic: a consumer-protocol
    # (KIP-848) group backfilling from the start, whose position is unknown until it commits
    assigned: frozenset[str] = frozenset()

    @classmethod
    def of_offsets(
        cls, committed: TopicCommits, unlisted: frozenset[str] = frozenset(), assigned: frozenset[str] = frozenset()
    ) -> GroupCheck:
        """A check from offsets alone (no epochs given): what a source without OffsetFetch's epochs knows."""
        return cls({g: {p: Commit(o) for p, o in parts.items()} for g, parts in committed.items()}, unlisted, assigned)

    @cached_property
    def committed(self) -> TopicCommits:
        """group -> partition -> committed offset: what the position rules (`cluster_check`) read."""
        return {g: {p: c.offset for p, c in parts.items()} for g, parts in self.commits.items()}

    def on(self, partition: int) -> dict[str, Commit]:
        """Each group's commit on one partition, for the groups that committed there."""
        return {g: parts[partition] for g, parts in self.commits.items() if partition in parts}


@dataclass
class _Fetched:
    at: float
    offsets: dict[tuple[str, int], int] | None  # None: the fetch failed
    error: str = ""
    held: frozenset[str] = frozenset()  # the topics of its last good fetch, kept through a failed one

    def topics(self) -> frozenset[str]:
        return self.held if self.offsets is None else frozenset(t for t, _ in self.offsets)


def to_fetch(
    topic: str,
    holders: set[str],
    listed: set[str],
    fetched: dict[str, _Fetched],
    now: float,
    ttl_s: float,
    fresh: bool = False,
) -> list[str]:
    """The groups whose offsets must be (re)read before a delete on `topic`: every listed group not read within the
    ttl, whatever links it to the topic. A group read once for another topic may have committed on this one since,
    in Kafka only (an `assign()` committer, Empty, that compactd's state never heard of): skipping it deleted what it
    had not read (issue 64). `fresh`: also the listed groups that may be the ones holding the delete, read within
    the ttl (by their last fetch or by compactd's state, `holders`): a cached answer that holds may be older than
    the commit the state heard of. Pure."""
    stale = {g for g in listed if g not in fetched or now - fetched[g].at >= ttl_s}
    if fresh:
        stale |= listed & (holders | {g for g, got in fetched.items() if topic in got.topics()})
    return sorted(stale)


def failure_for(listed: set[str], fetched: dict[str, _Fetched]) -> str | None:
    """The error that holds any delete back: a listed group whose last read failed. Its commits now are unknown,
    on any topic: what its last good fetch showed says nothing of a topic it committed on since. Pure."""
    for group in sorted(listed & fetched.keys()):
        got = fetched[group]
        if got.offsets is None:
            return f"group {group}: {got.error}"
    return None


# Kafka answers ListGroups with every group to a principal allowed Describe on the cluster (or an operation that
# implies it), and otherwise with only the groups it may Describe one by one: the others are not there at all
LISTS_EVERY_GROUP = frozenset({"DESCRIBE", "ALTER", "READ", "WRITE", "DELETE", "ALL"})
HIDDEN_GROUPS = (
    "offsets_source: admin needs Describe on the Cluster: without it ListGroups lists only the groups the principal "
    "may Describe, and a group it cannot see would not hold its topic's deletes; grant it (kafka-acls --add "
    "--allow-principal <principal> --operation Describe --cluster) or set offsets_source: consumer_offsets"
)


def lists_every_group(cluster_ops: Iterable[str]) -> bool:
    """Whether ListGroups answers every group to a principal allowed `cluster_ops` on the cluster (KIP-430's
    authorized operations, by AclOperation name). Pure."""
    return bool(LISTS_EVERY_GROUP & set(cluster_ops))


def require_every_group(conn: KafkaConnection, timeout_s: float = 10.0) -> None:
    """The start of `compactd run` and `agent --admin` with `offsets_source: admin`: ConfigError (one line,
    HIDDEN_GROUPS) when ListGroups would leave groups out. docs/safety.md says every group holds its topic's
    deletes; in that mode the listing is all compactd knows of groups."""
    reader = GroupReader(conn, timeout_s)
    try:
        every = reader.every_group_listed()
    except Exception as exc:
        where, setting = conn.bootstrap_servers, "--bootstrap-servers / bootstrap_servers"
        raise DependencyUnavailable("Kafka (DescribeCluster)", where, setting, error_text(exc)) from None
    finally:
        reader.close()
    if not every:
        raise ConfigError(HIDDEN_GROUPS)


class GroupReader:
    """The one reader of group offsets, for the check before a delete and for the admin agent's polls: ListGroups,
    then one OffsetFetch per group (librdkafka asks one group per request), all in flight at once. The principal
    needs Describe on the cluster (or each group) for ListGroups, Describe on the group and the topic for
    OffsetFetch."""

    def __init__(self, conn: KafkaConnection, timeout_s: float = 10.0) -> None:
        self.conn = conn
        self.timeout_s = timeout_s
        self._admin: Any = None
        self.coordinator = CoordinatorChild(conn, timeout_s)
        self.fetches = 0  # OffsetFetch requests sent (tests and the benchmark read it)
        self.lists = 0  # ListGroups requests sent
        self.describes = 0  # groups described
        self.active: set[str] = set()  # the typed groups with members, as the last listing found them
        self.untyped: set[str] = set()  # the groups only the untyped listing has: streams and share groups

    @property
    def admin(self) -> Any:
        if self._admin is None:
            self._admin = admin_client(self.conn, self.timeout_s)
        return self._admin

    def list_groups(self) -> set[str]:
        """Every group the cluster lists, of every type (KafkaException when it cannot say).

        ListGroups as librdkafka 2.16 types it (`list_consumer_groups`) returns classic and consumer-protocol groups
        only; streams groups (KIP-1071) and share groups (KIP-932) are left out, yet a streams group commits offsets
        like any group, and OffsetFetch answers for it. The untyped listing (`list_groups`, every group the
        principal may Describe) adds them; OffsetFetch of a share group answers no offsets (its positions are read
        from `__share_group_state`, control/readers.py)."""
        import warnings

        from confluent_kafka import ConsumerGroupState, KafkaException

        listed = self.admin.list_consumer_groups(request_timeout=self.timeout_s).result(self.timeout_s)
        self.lists += 1
        if listed.errors:
            raise KafkaException(listed.errors[0])
        groups = {g.group_id for g in listed.valid}
        # a group with members (not Empty or Dead) may be assigned a topic it has not committed on yet
        idle = {ConsumerGroupState.EMPTY, ConsumerGroupState.DEAD}
        self.active = {g.group_id for g in listed.valid if g.state not in idle}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the only call that lists every group type
            every = {g.id for g in self.admin.list_groups(timeout=self.timeout_s)}
        self.untyped = every - groups
        return groups | every

    def every_group_listed(self) -> bool:
        """Whether `list_groups` answers every group: DescribeCluster's authorized operations (one request; a
        cluster without an authorizer allows them all). KafkaException when it cannot say."""
        desc = self.admin.describe_cluster(include_authorized_operations=True, request_timeout=self.timeout_s)
        return lists_every_group(op.name for op in desc.result(self.timeout_s).authorized_operations or [])

    def fetch(self, groups: Iterable[str]) -> dict[str, PartitionOffsets | Exception]:
        """Each group's committed offsets (partitions with none left out), or the error that group's fetch met.
        Sent from a process of its own (kafka/coordinator.py): librdkafka can kill the process that sends a
        coordinator request while a coordinator moves."""
        groups = list(groups)
        self.fetches += len(groups)
        out = self.coordinator.offsets(groups)
        if any(isinstance(got, Exception) for got in out.values()):
            self.close()  # a coordinator that moved (its broker died): the next round asks with a new client
        return out

    def assignments(self, groups: Iterable[str]) -> dict[str, frozenset[str] | Exception]:
        """The topics each group's members are assigned now (DescribeGroups / ConsumerGroupDescribe, one request
        per coordinator), or the error that group's describe met; from the same child as `fetch`, for the same
        reason."""
        groups = list(groups)
        self.describes += len(groups)
        out = self.coordinator.assignments(groups)
        if any(isinstance(got, Exception) for got in out.values()):
            self.close()
        return out

    def close(self) -> None:
        """The clients go; the next request makes new ones, which learn the cluster's leaders and coordinators
        afresh. After a broker of a replicated cluster died, the old one kept sending a moved group's OffsetFetch
        towards the dead node: every delete held a minute and more (measured on three nodes)."""
        retire(self._admin)  # a request of it may still be out: freed once that has had its answer
        self._admin = None
        self.coordinator.close()


class ClusterGroupOffsets:
    """The groups' offsets through `GroupReader`, each group's kept `ttl_s`. `holders(topic)`: the groups compactd's
    state knows on the topic."""

    def __init__(
        self,
        conn: KafkaConnection,
        ttl_s: float = 5.0,
        timeout_s: float = 10.0,
        monotonic: Callable[[], float] = time.monotonic,
        holders: Callable[[str], Iterable[str]] = lambda topic: (),
        every_group: bool = False,
    ) -> None:
        """`every_group`: a listing that may leave groups out (no Describe on the cluster) holds every delete: with
        `offsets_source: admin` nothing else knows of a group ListGroups does not answer (issue 64)."""
        self.conn = conn
        self.every_group = every_group
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self.monotonic = monotonic
        self.holders = holders
        self.reader = GroupReader(conn, timeout_s)
        self.streams = StreamsGroups(conn, timeout_s, monotonic)
        self._listed: tuple[float, set[str]] | None = None
        self._fetched: dict[str, _Fetched] = {}
        self._assigned: tuple[float, dict[str, frozenset[str] | Topology | Exception]] | None = None
        self._lock = threading.Lock()

    @property
    def fetches(self) -> int:
        return self.reader.fetches

    @property
    def lists(self) -> int:
        return self.reader.lists

    def committed(self, topic: str) -> TopicCommits:
        """Groups with a committed offset on `topic`, and their offset on each partition they committed."""
        return self.check(topic).committed

    def check(self, topic: str, fresh: bool = False) -> GroupCheck:
        """The committed offsets of the groups on `topic`, every listed group read within the ttl, and the groups
        compactd knows there that the cluster does not list. `fresh`: list and read the groups that may hold the topic
        now, whatever the ttl (a cached answer held a delete the state allows: the state may have heard of a newer
        commit than the cache). Raises DependencyUnavailable when the cluster cannot answer, or a listed group
        cannot be read."""
        holders = set(self.holders(topic))
        ttl_s = 0.0 if fresh else self.ttl_s
        with self._lock:
            try:
                listed = self._list(ttl_s)
                # compactd's own source groups commit nothing and never count (group_counts): not read, and a failed
                # read of one (the Spark driver's group while its coordinator moves) holds nothing
                counted = {g for g in listed if not g.startswith(f"{SOURCE_GROUP_PREFIX}-")}
                self._fetch(to_fetch(topic, holders, counted, self._fetched, self.monotonic(), self.ttl_s, fresh))
            except DependencyUnavailable:
                raise
            except Exception as exc:
                self.reader.close()
                raise self._unavailable(exc) from None
            for gone in self._fetched.keys() - counted:
                del self._fetched[gone]
            why = failure_for(counted, self._fetched)
            if why is not None:
                raise DependencyUnavailable(
                    "Kafka (group offsets)", self.conn.bootstrap_servers, "the groups' ACLs", why
                )
            out: dict[str, dict[int, Commit]] = {}
            for group, got in self._fetched.items():
                given = getattr(got.offsets, "epochs", {})
                for (t, p), off in (got.offsets or {}).items():
                    if t == topic:
                        out.setdefault(group, {})[p] = Commit(off, given.get((t, p), -1))
            assigned = self._assigned_to(topic, counted, ttl_s) - out.keys()
        return GroupCheck(out, frozenset(holders - listed), frozenset(assigned))

    def _assigned_to(self, topic: str, listed: set[str], ttl_s: float) -> set[str]:
        """The listed groups with a member assigned `topic`: the groups with members (ListGroups' state), each
        described at most once per ttl, and the streams groups with members, by the topics their topology reads
        (`StreamsGroups`). A group that cannot be described may be assigned anything: it counts as assigned (its
        commits, if any, still decide; with none, the topic holds)."""
        now = self.monotonic()
        if self._assigned is None or now - self._assigned[0] >= ttl_s:
            try:  # only groups with members can be assigned anything: an Empty group is not described
                got: dict[str, frozenset[str] | Topology | Exception] = {}
                got.update(self.reader.assignments(sorted(listed & self.reader.active)))
                got.update(self.streams.reads(sorted(listed & self.reader.untyped)))
                self._assigned = (now, got)
            except Exception as exc:
                raise self._unavailable(exc) from None
        got = self._assigned[1]
        return {g for g in listed if g in got and (isinstance(got[g], Exception) or topic in got[g])}

    def _list(self, ttl_s: float) -> set[str]:
        now = self.monotonic()
        if self._listed is not None and now - self._listed[0] < ttl_s:
            return self._listed[1]
        groups = self.reader.list_groups()
        if self.every_group and not self.reader.every_group_listed():  # a grant taken away under the running job
            raise DependencyUnavailable(
                "Kafka (group listing)", self.conn.bootstrap_servers, "Describe on the Cluster", HIDDEN_GROUPS
            )
        self._listed = (now, groups)
        return groups

    def _fetch(self, groups: list[str]) -> None:
        """Read these groups' offsets; a group's failure is kept as its answer."""
        now = self.monotonic()
        for group, got in self.reader.fetch(groups).items():
            if isinstance(got, Exception):
                before = self._fetched.get(group)
                self._fetched[group] = _Fetched(now, None, error_text(got), before.topics() if before else frozenset())
            else:
                self._fetched[group] = _Fetched(now, got)

    def _unavailable(self, exc: Exception) -> DependencyUnavailable:
        return DependencyUnavailable(
            "Kafka (group offsets)",
            self.conn.bootstrap_servers,
            "--bootstrap-servers / bootstrap_servers",
            error_text(exc),
        )

    def close(self) -> None:
        self.reader.close()
        self.streams.close()


OFFSETS_TOPIC = "__consumer_offsets"
NO_TOPICS = Topology(frozenset())


def coordinator_partition(group: str, partitions: int) -> int:
    """The `__consumer_offsets` partition that holds `group`'s records: Kafka's `Utils.abs(groupId.hashCode()) %
    partitions` (Java's String.hashCode over UTF-16 code units, int32 arithmetic). Pure."""
    units = group.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] << 8 | units[i + 1])) & 0xFFFFFFFF
    h = h - (1 << 32) if h >= 1 << 31 else h
    return (0 if h == -(1 << 31) else abs(h)) % partitions


class StreamsGroups:
    """Streams groups (KIP-1071) as their records in `__consumer_offsets` have them: which have members, and what
    their topology reads. librdkafka cannot ask the cluster: its typed listing leaves streams groups out, DescribeGroups
    answers Dead for them, and it has no DescribeStreamsGroups. A streams group with members is assigned every topic
    its topology reads; until it commits there, its position is unknown (a backfill from `earliest`, Streams'
    default), which holds the topic as a KIP-848 group's assignment does.

    Only the partitions of the groups asked about are read (`coordinator_partition`): from their start once, then on
    from where the last read ended. The principal needs Read on `__consumer_offsets`; without it every group asked
    about counts as assigned anything."""

    def __init__(
        self, conn: KafkaConnection, timeout_s: float = 10.0, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.conn = conn
        self.timeout_s = timeout_s
        self.monotonic = monotonic
        self._consumer: Any = None
        self._partitions: set[int] = set()  # of OFFSETS_TOPIC, assigned
        self._members: dict[str, set[str]] = {}
        self._topology: dict[str, Topology] = {}
        self.undecodable = 0

    def reads(self, groups: Iterable[str]) -> dict[str, Topology | Exception]:
        """What each of `groups` reads now: its topology's topics while it has members, none without (a share group
        or an Empty streams group), or the error that kept its records from being read."""
        groups = list(groups)
        if not groups:
            return {}
        try:
            self._read(groups)
        except Exception as exc:
            return dict.fromkeys(groups, exc)
        out: dict[str, Topology | Exception] = {}
        for group in groups:
            if not self._members.get(group):
                out[group] = NO_TOPICS
            elif group in self._topology:
                out[group] = self._topology[group]
            else:  # a member joined and its topology is not written yet: it may read anything
                out[group] = RuntimeError(f"streams group {group} has members and no topology yet")
        return out

    def _read(self, groups: list[str]) -> None:
        from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

        if self._consumer is None:
            self._consumer = tail_consumer(self.conn, "compactd-streams-groups", "earliest")
        meta = self._consumer.list_topics(OFFSETS_TOPIC, timeout=self.timeout_s).topics.get(OFFSETS_TOPIC)
        if meta is None or meta.error is not None:
            raise KafkaException(meta.error) if meta is not None else RuntimeError(f"no metadata for {OFFSETS_TOPIC}")
        new = {coordinator_partition(g, len(meta.partitions)) for g in groups} - self._partitions
        if new:
            self._consumer.incremental_assign([TopicPartition(OFFSETS_TOPIC, p, OFFSET_BEGINNING) for p in new])
            self._partitions |= new
        read_to_ends(self._consumer, OFFSETS_TOPIC, sorted(self._partitions), self._apply, self.timeout_s,
                     self.monotonic)  # fmt: skip

    def _apply(self, _partition: int, key: bytes | None, value: bytes | None) -> None:
        try:
            k = decode_key(key or b"")
            if k is None:
                return
            if k.kind == MEMBER:
                members = self._members.setdefault(k.group, set())
                (members.discard if value is None else members.add)(k.member)
            elif k.kind == TOPOLOGY:
                if value is None:
                    self._topology.pop(k.group, None)
                else:
                    self._topology[k.group] = decode_topology(value)
        except DecodeError:
            self.undecodable += 1

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
