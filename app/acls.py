"""What compactd's principal needs from the cluster, as data: the README's ACL table is rendered from `NEEDS`
(tests/unit/test_acls.py fails when they differ), and `compactd doctor` checks it against a cluster.

The check changes nothing. It asks the broker which operations the principal is allowed on each resource (KIP-430:
DescribeCluster, DescribeTopics and DescribeGroups with their authorized operations) and, for a topic compactd
would create, a CreateTopics with `validate_only`. Each requirement is checked where it applies to the settings
given (a compaction nudge needs AlterConfigs only where nudges are decided; `__consumer_offsets` only with
`offsets_source: consumer_offsets`), on the resources it names: the topics the thresholds name (or those given with
`--topic`, or every topic the principal can see), compactd's own topics, the counted groups the cluster lists.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from compactd.kafka.admin import admin_client
from compactd.kafka.groups import HIDDEN_GROUPS, OFFSETS_TOPIC
from compactd.kafka.share_state import STATE_TOPIC
from compactd.policy.thresholds import group_counts, parse_scope, resolve, resolve_global
from compactd.settings import Settings
from compactd.streaming.connector import GROUP_ID_PREFIX

OWN_GROUP = "compactd-doctor"  # stands for the group ids of compactd's own consumers (`compactd-<purpose>-<uuid>`)
SOURCE_GROUP = f"{GROUP_ID_PREFIX}-doctor"  # stands for the groups of Spark's Kafka connector's offset reader


@dataclass(frozen=True)
class Need:
    """One row of the ACL table: operations on a resource, the requests they allow, what needs them."""

    resource: str  # "Cluster", "Topic", "Group"
    shown: str  # the resource as the table names it
    operations: tuple[str, ...]  # Kafka's operation names, as AclOperation spells them (READ, DESCRIBE_CONFIGS)
    request: str
    needed_for: str
    where: str  # which resources the check asks about: cluster, offsets, share_state, watched, own, groups
    applies: Callable[[Settings], bool] = lambda s: True


def _nudges(s: Settings) -> bool:
    return s.offsets_source != "admin" or any("compaction.retention.takeover" in v for v in s.thresholds.values())


NEEDS: tuple[Need, ...] = (
    Need("Topic", "`__consumer_offsets`", ("READ", "DESCRIBE"), "Fetch",
         "`offsets_source: consumer_offsets` (the default); and the check before every consumed-retention delete "
         "(`cluster_offsets_check`): a Kafka Streams group (KIP-1071) assigned a topic before its first commit is "
         "read from its records there; without it such a group holds every topic it has no commit on", "offsets",
         lambda s: s.offsets_source == "consumer_offsets" or s.cluster_offsets_check),
    Need("Topic", "`__share_group_state`", ("READ", "DESCRIBE"), "Fetch",
         "share groups (KIP-932) counted like groups; without it consumed retention holds wherever a share group may "
         "read. Granted by `Topic *` below", "share_state"),
    Need("Cluster", "", ("DESCRIBE",), "ListGroups",
         "the check of the groups' offsets before every consumed-retention delete (`cluster_offsets_check`, on by "
         "default); `agent --admin` and `offsets_source: admin`, which refuse to start without it (ListGroups would "
         "leave out the groups the principal may not Describe, and nothing else tells compactd of them)", "cluster"),
    Need("Group", "`*` (or every group that must count, and `compactd-` prefixed)", ("DESCRIBE",),
         "OffsetFetch, DescribeGroups, FindCoordinator",
         "the same, and a KIP-848 group assigned a topic before its first commit. compactd's own consumers commit "
         "nothing but look up their group's coordinator (`compactd-*`): without it the job stops at its first read",
         "groups"),
    Need("Group", f"`{GROUP_ID_PREFIX}` (prefixed)", ("READ",), "JoinGroup, SyncGroup, Heartbeat",
         "Spark's Kafka connector reads compactd's sources: the offset reader on the driver subscribes with a group of "
         f"its own (`{GROUP_ID_PREFIX}-<uuid>-driver-<n>`) that commits nothing; without it the stream stops at its "
         "start", "source_group"),
    Need("Topic", "`*` (or the watched topics)", ("DESCRIBE",), "Metadata, ListOffsets, DescribeTopics (topic IDs)",
         "every mode: the checks before each action", "watched"),
    Need("Topic", "`*`", ("DESCRIBE_CONFIGS",), "DescribeConfigs",
         "`cleanup.policy` before every action, `retention.ms` for the compaction service", "watched"),
    Need("Topic", "`*`", ("ALTER_CONFIGS",), "IncrementalAlterConfigs",
         "compaction nudges (`max.compaction.lag.ms`), `compaction.retention.takeover`; not needed with "
         "`offsets_source: admin` and no takeover", "watched", _nudges),
    Need("Topic", "`*`", ("DELETE",), "DeleteRecords", "consumed and forced retention", "watched"),
    Need("Topic", "`*`", ("READ",), "Fetch",
         "the compaction service reads the topics it compacts; the check before a consumed-retention delete reads "
         "the last record below a group's commit made under an earlier leader (an unclean leader election may have "
         "written the offsets again); without it such a delete holds until the group commits under the leader of "
         "now; the check before any delete decided by segments the agent reported with their leader epoch reads the "
         "last record below it when the partition had a leader since (forced retention over offsets written "
         "again); without it such a delete holds", "watched",
         lambda s: (s.cluster_offsets_check and s.cluster_check != "off")
         or any(v.get("compaction.service") or v.get("forced.retention.ms") is not None
                for v in s.thresholds.values())),
    Need("Topic", "`compactd.` (prefixed), and each view `<topic>.compacted`", ("CREATE", "DESCRIBE", "READ",
         "WRITE", "DELETE"), "CreateTopics, Produce, Fetch, DeleteRecords",
         "compactd's own topics (Create only with `create_topics: true`, the default) and the compaction views "
         "(Delete: their garbage collection). Kafka's ACLs have no suffix pattern: grant each view by name, or a "
         "prefix of it", "own"),
)  # fmt: skip

_OP_NAMES = {"READ": "Read", "WRITE": "Write", "CREATE": "Create", "DELETE": "Delete", "DESCRIBE": "Describe",
             "DESCRIBE_CONFIGS": "DescribeConfigs", "ALTER_CONFIGS": "AlterConfigs"}  # fmt: skip


def table() -> str:
    """The README's ACL table, from `NEEDS`."""
    rows = ["| resource | operation | request | needed for |", "|---|---|---|---|"]
    for n in NEEDS:
        resource = f"{n.resource} {n.shown}".strip()
        rows.append(f"| {resource} | {', '.join(_OP_NAMES[o] for o in n.operations)} | {n.request} | {n.needed_for} |")
    return "\n".join(rows) + "\n"


@dataclass(frozen=True)
class Finding:
    resource: str  # "Topic orders", "Cluster", "Group billing"
    operation: str
    state: str  # granted, missing, unknown
    need: Need
    note: str = ""

    def line(self) -> str:
        tail = f" ({self.note})" if self.note else ""
        op = _OP_NAMES[self.operation]
        return f"{self.state:<8} {self.resource}: {op} [{self.need.request}] for {self.need.needed_for}{tail}"


def watched_topics(settings: Settings, topics: Iterable[str], visible: Iterable[str]) -> list[str]:
    """The topics the check asks about: those given, else those the thresholds name, else every visible topic
    compactd may act on."""
    given = sorted(set(topics))
    if given:
        return given
    named = sorted({t for s in settings.thresholds for k, t, _ in [parse_scope(s)] if k != "global" and t})
    if named:
        return named
    own = set(settings.own_topics())
    return sorted(t for t in visible if not t.startswith("__") and t not in own and not t.endswith(".compacted"))


def check(settings: Settings, topics: Iterable[str] = (), timeout_s: float = 10.0) -> list[Finding]:
    """Every requirement that applies to `settings`, checked against the cluster (nothing is changed)."""
    from confluent_kafka import KafkaException, TopicCollection

    admin = admin_client(settings.kafka_connection(), timeout_s)
    visible = list(admin.list_topics(timeout=timeout_s).topics)
    watched = watched_topics(settings, topics, visible)
    views = [f"{t}.compacted" for s, v in settings.thresholds.items() for k, t, _ in [parse_scope(s)]
             if k == "topic" and t and v.get("compaction.service")]  # fmt: skip
    own = settings.own_topics() + views
    cache: dict[str, tuple[set[str] | None, str]] = {}

    def topic_ops(names: list[str]) -> None:
        wanted = [n for n in names if n not in cache]
        if not wanted:
            return
        futures = admin.describe_topics(
            TopicCollection(wanted), include_authorized_operations=True, request_timeout=timeout_s
        )
        for name, fut in futures.items():
            try:
                desc = fut.result(timeout_s)
                cache[name] = ({op.name for op in desc.authorized_operations or []}, "")
            except KafkaException as exc:
                cache[name] = (None, exc.args[0].str())

    out: list[Finding] = []
    for need in NEEDS:
        if not need.applies(settings):
            continue
        if need.where == "cluster":
            try:
                desc = admin.describe_cluster(include_authorized_operations=True).result(timeout_s)
                ops: set[str] | None = {op.name for op in desc.authorized_operations or []}
                note = ""
            except KafkaException as exc:
                ops, note = None, exc.args[0].str()
            found = _findings("Cluster", need, ops, note)
            if settings.offsets_source == "admin":  # groups it may not Describe: invisible, no other source has them
                found = [replace(f, note=HIDDEN_GROUPS) if f.state != "granted" else f for f in found]
            out.extend(found)
        elif need.where == "groups":
            out.extend(_groups(admin, settings, need, timeout_s))
        elif need.where == "source_group":
            out.extend(_described_groups(admin, [SOURCE_GROUP], need, timeout_s, set()))
        else:
            names = {"offsets": [OFFSETS_TOPIC], "share_state": [STATE_TOPIC], "watched": watched, "own": own}[
                need.where
            ]
            topic_ops(names)
            for name in names:
                ops, note = cache[name]
                if need.where == "own" and ops is None and "UNKNOWN_TOPIC" in note.upper().replace(" ", "_"):
                    out.extend(_not_created(admin, name, need, timeout_s))
                    continue
                if need.where == "share_state" and ops is None and "unknown topic" in note.lower():
                    note = "the topic does not exist: no share group has state on this cluster"
                out.extend(_findings(f"Topic {name}", need, ops, note))
    return out


def _findings(resource: str, need: Need, ops: set[str] | None, note: str) -> list[Finding]:
    """Granted or missing per operation; `ops` None: the resource could not be described (no Describe on it, or
    gone): Describe is missing and the rest cannot be told."""
    if ops is None:
        denied = "authoriz" in note.lower()
        return [
            Finding(resource, op, "missing" if denied and op == "DESCRIBE" else "unknown", need, note)
            for op in need.operations
        ]
    allowed = ops | ({"DESCRIBE"} if ops & {"READ", "WRITE", "DELETE", "ALTER"} else set())  # Kafka's implied ops
    if "ALL" in ops:
        allowed = set(need.operations)
    return [Finding(resource, op, "granted" if op in allowed else "missing", need) for op in need.operations]


def _not_created(admin: Any, name: str, need: Need, timeout_s: float) -> list[Finding]:
    """A topic compactd would create: CreateTopics with validate_only says whether it may."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic

    try:
        admin.create_topics([NewTopic(name, 1)], validate_only=True, request_timeout=timeout_s)[name].result(timeout_s)
        create = "granted"
        note = "not created yet"
    except KafkaException as exc:
        create = "missing" if "authoriz" in exc.args[0].str().lower() else "unknown"
        note = exc.args[0].str()
    return [Finding(f"Topic {name}", op, create if op == "CREATE" else "unknown", need, note) for op in need.operations]


def _groups(admin: Any, settings: Settings, need: Need, timeout_s: float) -> list[Finding]:
    """The counted groups the cluster lists, and those `groups.required` names, each with its operations."""
    layers = settings.thresholds
    scopes = [resolve_global(layers)] + [
        resolve(layers, t) for s in layers for k, t, _ in [parse_scope(s)] if k == "topic" and t is not None
    ]
    listed = {g.group_id for g in admin.list_consumer_groups(request_timeout=timeout_s).result(timeout_s).valid}
    required = {g for th in scopes for g in th.groups_required}
    groups = sorted(g for g in listed | required if any(group_counts(g, th) for th in scopes))
    groups.append(OWN_GROUP)  # compactd's own consumers' group ids (none of them exists: described as Dead)
    out: list[Finding] = []
    if len(groups) == 1:
        out.append(Finding("Group *", "DESCRIBE", "unknown", need, "no counted group is listed: none exists, or "
                           "none may be described"))  # fmt: skip
    return out + _described_groups(admin, groups, need, timeout_s, listed | {OWN_GROUP})


def _described_groups(admin: Any, groups: list[str], need: Need, timeout_s: float, listed: set[str]) -> list[Finding]:
    """Each group's authorized operations (a group that does not exist is described as Dead, with them)."""
    out: list[Finding] = []
    futures = admin.describe_consumer_groups(groups, include_authorized_operations=True, request_timeout=timeout_s)
    for group, fut in sorted(futures.items()):
        try:
            desc = fut.result(timeout_s)
            ops: set[str] | None = {op.name for op in desc.authorized_operations or []}
            note = "" if group in listed or group == SOURCE_GROUP else "required, not listed"
        except Exception as exc:
            ops, note = None, str(exc.args[0].str() if hasattr(exc.args[0], "str") else exc)
        out.extend(_findings(f"Group {group}", need, ops, note))
    return out
