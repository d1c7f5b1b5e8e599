"""KRaft's "right after", in one place for the whole suite.

A KRaft broker answers Metadata, ListOffsets, DescribeConfigs and DescribeAcls from the metadata log as it has
applied it, a moment after the controller answered CreateTopics, DeleteTopics, IncrementalAlterConfigs or
CreateAcls; a restarted broker leads its partitions a moment after it first answers. Each helper here waits, with a
deadline, until the broker shows the change to a fresh client, and a failure says what it saw last."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    OffsetSpec,
    ResourcePatternType,
    ResourceType,
)

from compactd.kafka.config import KafkaConnection, new_admin
from tests.support.waiting import wait_until

WITHIN_S = 60.0  # generous: it only bounds a failure, and a slow machine's broker may take seconds

_NOT_YET = {
    # a group coordinator loading its `__consumer_offsets` partition (a node just started), or just moved
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.UNKNOWN_TOPIC_ID,
    KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.OFFSET_NOT_AVAILABLE,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NOT_CONTROLLER,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError._TRANSPORT,
    KafkaError._TIMED_OUT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._DESTROY_BROKER,  # a request on the connection to a node that restarted under it
}


def not_yet(exc: Exception) -> bool:
    """An answer the broker gives before it has applied a change (or led a partition), never a wrong request."""
    return isinstance(exc, KafkaException) and exc.args[0].code() in _NOT_YET


def _code(exc: Exception) -> int | None:
    return exc.args[0].code() if isinstance(exc, KafkaException) else None


@dataclass(frozen=True)
class TopicSeen:
    """A topic as a fresh client saw it at one moment. `id` None: Metadata does not list it. `stuck`: the first
    request that had no answer yet (e.g. DescribeConfigs: UNKNOWN_TOPIC_OR_PART), empty once all three answered."""

    id: str | None = None
    leaders: tuple[int, ...] = ()
    watermarks: tuple[tuple[int, int], ...] = ()
    stuck: str = ""

    def ready(self, partitions: int | None = None) -> bool:
        """Listed, every partition led, its watermarks and configs readable."""
        return (
            self.id is not None
            and not self.stuck
            and (partitions is None or len(self.leaders) == partitions)
            and len(self.watermarks) == len(self.leaders)
        )


def admin(conn: KafkaConnection) -> AdminClient:
    """A fresh client: no metadata cached from before the change it is to see."""
    return new_admin(conn.client("admin"))


def look(conn: KafkaConnection, topic: str) -> TopicSeen:
    """`topic` through Metadata, ListOffsets (on its leaders) and DescribeConfigs, in that order, by a fresh client."""
    a = admin(conn)
    try:
        d = a.describe_topics(TopicCollection([topic]))[topic].result(30)
    except KafkaException as exc:
        if _code(exc) == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return TopicSeen()
        if not_yet(exc):
            return TopicSeen(stuck=f"Metadata: {exc}")
        raise
    tid = str(d.topic_id)
    parts = sorted(d.partitions, key=lambda p: p.id)
    leaders = tuple(p.leader.id if p.leader is not None else -1 for p in parts)
    if any(leader < 0 for leader in leaders):
        return TopicSeen(tid, leaders, stuck="Metadata: a partition without a leader")
    tps = [TopicPartition(topic, p.id) for p in parts]
    try:
        ends = []
        for spec in (OffsetSpec.earliest(), OffsetSpec.latest()):
            futs = a.list_offsets({tp: spec for tp in tps}, isolation_level=IsolationLevel.READ_UNCOMMITTED)
            ends.append([futs[tp].result(30).offset for tp in tps])
    except KafkaException as exc:
        if not_yet(exc):
            return TopicSeen(tid, leaders, stuck=f"ListOffsets: {exc}")
        raise
    res = ConfigResource(ResourceType.TOPIC, topic)
    try:
        a.describe_configs([res])[res].result(30)
    except KafkaException as exc:
        if not_yet(exc):
            return TopicSeen(tid, leaders, tuple(zip(*ends, strict=True)), stuck=f"DescribeConfigs: {exc}")
        raise
    return TopicSeen(tid, leaders, tuple(zip(*ends, strict=True)))


def until_visible(conn: KafkaConnection, topic: str, partitions: int | None = None) -> TopicSeen:
    """Right after CreateTopics: the topic listed, led, its watermarks and configs readable."""
    return wait_until(
        f"topic {topic} visible to Metadata, ListOffsets and DescribeConfigs",
        lambda: look(conn, topic),
        lambda s: s.ready(partitions),
        WITHIN_S,
        tolerate=not_yet,
    )


def until_gone(conn: KafkaConnection, topic: str) -> None:
    """Right after DeleteTopics: Metadata no longer lists the topic."""
    wait_until(f"topic {topic} gone from Metadata", lambda: look(conn, topic), lambda s: s.id is None, WITHIN_S)


def until_recreated(conn: KafkaConnection, topic: str, old_id: str | None, partitions: int) -> TopicSeen:
    """Right after a delete and a create under one name: the NEW incarnation listed (another topic ID) and its
    partitions' logs the new, empty ones, (0, 0), on their leaders. Until then a producer's records may still land
    in the old log, which the broker drops with it."""
    return wait_until(
        f"topic {topic} re-created: a topic ID other than {old_id}, watermarks (0, 0) on all {partitions} partitions",
        lambda: look(conn, topic),
        lambda s: s.ready(partitions) and s.id != old_id and all(w == (0, 0) for w in s.watermarks),
        WITHIN_S,
        tolerate=not_yet,
    )


def configs(conn: KafkaConnection, restype: ResourceType, name: str) -> dict[str, ConfigEntry]:
    """Every config of a resource as the broker describes it now, to a fresh client."""
    res = ConfigResource(restype, name)
    a = admin(conn)  # must outlive the future
    return a.describe_configs([res])[res].result(30)


def until_config(
    conn: KafkaConnection,
    restype: ResourceType,
    name: str,
    key: str,
    ok: Callable[[ConfigEntry], bool],
    what: str,
    timeout_s: float = WITHIN_S,
) -> ConfigEntry:
    """Right after IncrementalAlterConfigs (or whatever changes a config): DescribeConfigs shows what `ok` accepts."""
    return wait_until(
        f"{what}: {restype.name.lower()} {name}'s {key}",
        lambda: configs(conn, restype, name)[key],
        ok,
        timeout_s,
        tolerate=not_yet,
    )


_OWN = {ResourceType.TOPIC: ConfigSource.DYNAMIC_TOPIC_CONFIG, ResourceType.BROKER: ConfigSource.DYNAMIC_BROKER_CONFIG}


def alter(conn: KafkaConnection, restype: ResourceType, name: str, changes: dict[str, str | None]) -> None:
    """Set (a value) or delete (None) configs of a topic or a broker, and return once DescribeConfigs shows each."""
    res = ConfigResource(
        restype,
        name,
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.DELETE if v is None else AlterConfigOpType.SET)
            for k, v in changes.items()
        ],
    )
    a = admin(conn)
    a.incremental_alter_configs([res])[res].result(30)
    own = _OWN[restype].value
    for key, value in changes.items():
        until_config(
            conn,
            restype,
            name,
            key,
            (lambda e: e.source != own) if value is None else (lambda e, v=value: e.value == v and e.source == own),
            f"{key} deleted" if value is None else f"{key}={value}",
        )


def _acls(a: AdminClient) -> set[AclBinding]:
    every = AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY
    )
    return set(a.describe_acls(every).result(30))


def apply_acls(conn: KafkaConnection, add: list[AclBinding] = (), remove: list[AclBinding] = ()) -> None:  # type: ignore[assignment]
    """Create and delete ACLs, and return once the broker's authorizer describes the result: it applies ACL records
    from the metadata log a moment after the answer."""
    a = admin(conn)
    for fut in a.create_acls(list(add)).values() if add else []:
        fut.result(30)
    if remove:
        filters = [
            AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation,
                             b.permission_type)
            for b in remove
        ]  # fmt: skip
        for fut in a.delete_acls(filters).values():
            fut.result(30)
    wait_until(
        f"the authorizer showing {len(add)} ACLs added and {len(remove)} removed",
        lambda: _acls(a),
        lambda now: set(add) <= now and not set(remove) & now,
        WITHIN_S,
        tolerate=not_yet,
    )


def settled(conn: KafkaConnection) -> None:
    """Return once the broker has applied every metadata change the controller accepted before this call: a topic
    created now is a later record of the one metadata log, so the broker showing it has applied all earlier ones. A
    test asserting that nothing changed (a config left alone) asserts it after this, never after a sleep."""
    marker = f"settled-{uuid.uuid4().hex[:12]}"
    a = admin(conn)
    a.create_topics([NewTopic(marker, 1, 1)])[marker].result(30)
    until_visible(conn, marker, 1)
    a.delete_topics([marker])[marker].result(30)


def unanswered(exc: Exception) -> bool:
    """No answer yet: a request that timed out (a node just killed), or a leader still being elected."""
    return isinstance(exc, TimeoutError) or not_yet(exc)
