"""The README's ACL table, proven on Apache Kafka with SASL/PLAIN and the StandardAuthorizer (nothing is allowed
without an ACL). A principal granted exactly the table runs the job end to end; `compactd doctor` says granted for
every row; each grant taken away in turn is named by the doctor in one line; and the job, short of a grant, holds or
fails what needs it, never anything unsafe. Ground truth: the broker's watermarks and configs."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator

import pytest
import yaml
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ConfigResource,
    ResourcePatternType,
    ResourceType,
)

from compactd.app.acls import NEEDS, check
from compactd.app.cli import main
from compactd.daemon.application import Application
from compactd.local.broker import KafkaBroker
from compactd.settings import Settings, TopicNames
from tests.support import kraft
from tests.support.events import old_segments
from tests.support.fixtures import Cluster
from tests.support.groups import consume_and_commit, newest_protocol
from tests.support.waiting import wait_until

pytestmark = pytest.mark.spark
H = 3_600_000
USER = "User:compactd"
PASSWORD = "compactd-secret"
ANY = AclPermissionType.ALLOW
LISTER = "lister"


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    # `lister`: a principal of its own for the test of the group listing (its ACLs never meet compactd's)
    broker = KafkaBroker(tmp_path_factory.mktemp("sasl-kafka"), users={"compactd": PASSWORD, LISTER: PASSWORD})
    try:
        yield broker
    finally:
        broker.stop()


def grants(prefix: str) -> list[AclBinding]:
    """Exactly the README's table's rows that apply to the test's job, for the principal: `*` rows as the literal
    wildcard, compactd's own topics by their prefix (the test's names)."""
    t, lit, pre = ResourceType.TOPIC, ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    rows = [
        (t, "__consumer_offsets", lit, [AclOperation.READ, AclOperation.DESCRIBE]),
        (t, "__share_group_state", lit, [AclOperation.READ, AclOperation.DESCRIBE]),
        (ResourceType.BROKER, "kafka-cluster", lit, [AclOperation.DESCRIBE]),
        (ResourceType.GROUP, "*", lit, [AclOperation.DESCRIBE]),
        (ResourceType.GROUP, "compactd-source", pre, [AclOperation.READ]),
        # Read on `*`: the check of a commit made under an earlier leader (the compaction service's too)
        (t, "*", lit, [AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS,
                       AclOperation.DELETE, AclOperation.READ]),
        (t, prefix, pre, [AclOperation.CREATE, AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE,
                          AclOperation.DELETE]),
    ]  # fmt: skip
    return [AclBinding(kind, name, pattern, USER, "*", op, ANY) for kind, name, pattern, ops in rows for op in ops]


IMPLIES = {AclOperation.DESCRIBE: {AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE, AclOperation.ALTER},
           AclOperation.DESCRIBE_CONFIGS: {AclOperation.ALTER_CONFIGS}}  # fmt: skip


def covered(binding: AclBinding, others: list[AclBinding]) -> bool:
    """Whether the other bindings still allow what `binding` allows (Kafka's wildcard, prefixes, implied Describe)."""
    ops = {binding.operation} | IMPLIES.get(binding.operation, set())
    for o in others:
        if o.restype != binding.restype or o.operation not in ops:
            continue
        if o.name in ("*", binding.name) or (
            o.resource_pattern_type == ResourcePatternType.PREFIXED and binding.name.startswith(o.name)
        ):
            return True
    return False


def apply(cluster: Cluster, add: list[AclBinding] = (), remove: list[AclBinding] = ()) -> None:  # type: ignore[assignment]
    """ACLs created and deleted; returns once the broker's authorizer shows them (kraft.apply_acls)."""
    kraft.apply_acls(cluster.conn, add, remove)


@pytest.mark.versions
def test_the_acl_table_is_what_compactd_needs_and_each_missing_grant_is_named(
    spark, sasl_broker, redis_url, tmp_path, caplog, capsys
) -> None:
    super_user = {k: v for k, v in sasl_broker.client().items() if k != "bootstrap.servers"}
    admin_cluster = Cluster(sasl_broker.bootstrap, super_user)
    admin = admin_cluster.admin
    prefix = admin_cluster.prefix
    data, compact = admin_cluster.name("orders"), admin_cluster.name("profiles")
    logs = admin_cluster.name("logs")  # no group reads it: forced retention (level 2) alone
    admin_cluster.create(logs, 1, {"cleanup.policy": "delete"})
    admin_cluster.fill(logs, 200)
    admin_cluster.create(data, 1, {"cleanup.policy": "delete"})
    admin_cluster.create(compact, 1, {"cleanup.policy": "compact"})
    admin_cluster.fill(data, 400)
    group = admin_cluster.name("billing")
    consume_and_commit(sasl_broker.bootstrap, group, data, 400, newest_protocol(), extra=sasl_broker.client())
    bindings = grants(f"compactd-{prefix}.")
    apply(admin_cluster, add=bindings)

    creds = {k: v for k, v in sasl_broker.client("compactd").items() if k != "bootstrap.servers"}
    own = ("segments", "commits", "config", "actions", "dlq", "compactions", "nudges", "agent")
    names = {k: f"compactd-{prefix}.{k}" for k in own}  # compactd.* in the table: a prefix of their own
    now = int(time.time() * 1000)
    settings = Settings(
        bootstrap_servers=sasl_broker.bootstrap, redis_url=redis_url, checkpoint_dir=str(tmp_path / "ckpt"),
        trigger_interval_ms=500, topics=TopicNames(**names), offsets_source="consumer_offsets", kafka=creds,
        cluster_check="strict",
        thresholds={"global": {"dry.run": False}, f"topic:{data}": {"consumed.retention.ms": H},
                    f"topic:{compact}": {"max.compaction.lag.ms": H},
                    f"topic:{logs}": {"forced.retention.ms": H}},
    )  # fmt: skip

    # the doctor, before the first run: nothing missing (compactd's own topics: Create granted, the rest once they
    # exist)
    found = check(settings)
    assert [f.line() for f in found if f.state == "missing"] == []
    assert {f.need for f in found} == {n for n in NEEDS if n.applies(settings)}

    # the job, as the principal granted exactly the table: a consumed-retention delete and a nudge, for real
    admin_cluster.create(names["segments"])
    events = old_segments(data, [100, 200, 300, 400], now) + old_segments(compact, [50], now)
    events += old_segments(logs, [100, 200], now)
    admin_cluster.send(names["segments"], events)
    with Application(settings, spark=spark) as job:
        job.run(once=True)
    assert admin_cluster.watermarks(data) == (400, 400)
    assert admin_cluster.watermarks(logs) == (200, 200)  # forced retention
    resource = ConfigResource(ResourceType.TOPIC, compact)
    config = admin.describe_configs([resource])[resource].result(30)
    assert config["max.compaction.lag.ms"].value == "1"  # nudged, through IncrementalAlterConfigs
    actions = {(a["action"], a["status"]) for a in admin_cluster.read_all(names["actions"])}
    assert ("delete_records", "sent") in actions and ("compact", "sent") in actions, actions

    # after it: every operation granted. `__share_group_state` does not exist on this broker (librdkafka 2.16's
    # share consumer does not speak SASL, so no share group was made here): its row says so
    unknown = [f.line() for f in check(settings) if f.state != "granted"]
    assert unknown and all("__share_group_state" in line and "does not exist" in line for line in unknown), unknown

    # each grant taken away in turn: the doctor names it, in one line (unless another row grants it too)
    tried: list[tuple[AclBinding, str]] = []
    for binding in bindings:
        apply(admin_cluster, remove=[binding])
        try:
            expect = binding.name != "__share_group_state" and not covered(
                binding, [b for b in bindings if b is not binding]
            )
            missing = wait_until(  # the authorizer shows the removal; the check's own client may answer later
                f"the check {'naming' if expect else 'not naming'} {binding} missing",
                lambda: [f for f in check(settings) if f.state == "missing"],
                lambda m, expect=expect: bool(m) == expect,
            )
        finally:
            apply(admin_cluster, add=[binding])
        lines = [f.line() for f in missing]
        if binding.name == "__share_group_state":  # it does not exist here: unknown, never missing
            assert lines == []
            continue
        if covered(binding, [b for b in bindings if b is not binding]):
            assert lines == [], f"{binding} is granted by another row too, yet: {lines}"
            continue
        assert lines, f"nothing missing without {binding}"
        op = binding.operation.name
        assert all(f.operation == op or op == "DESCRIBE" for f in missing), lines
        tried.append((binding, lines[0]))
    # every row the doctor checks was taken away once with a line naming it
    # (DescribeConfigs is implied by AlterConfigs, Describe by Read, Write and Delete, on the same resource)
    assert {b.operation for b, _ in tried} >= {
        AclOperation.DELETE,
        AclOperation.ALTER_CONFIGS,
        AclOperation.DESCRIBE,
        AclOperation.READ,
        AclOperation.CREATE,
        AclOperation.WRITE,
    }

    # short of Describe on the group its topic holds its deletes (nothing unsafe)
    admin_cluster.fill(data, 100)
    consume_and_commit(sasl_broker.bootstrap, group, data, 500, newest_protocol(), extra=sasl_broker.client())
    admin_cluster.send(names["segments"], old_segments(data, [100, 200, 300, 400, 500], now)[-1:])
    # Kafka's ACLs only add up: a DENY takes Describe on this one group away, `*` stays for compactd's own consumers
    deny = AclBinding(ResourceType.GROUP, group, ResourcePatternType.LITERAL, USER, "*", AclOperation.DESCRIBE,
                      AclPermissionType.DENY)  # fmt: skip
    apply(admin_cluster, add=[deny])
    with caplog.at_level(logging.WARNING), Application(settings, spark=spark) as job:
        job.run(once=True)
    assert admin_cluster.watermarks(data) == (400, 500)
    # the cluster lists the group (Describe on the cluster lists every group) but will not give its offsets: the
    # delete waits, one line names the group, the broker's answer and the setting
    held = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and group in r.getMessage()]
    assert held and "Group authorization failed" in held[0] and "check the groups' ACLs" in held[0], held
    apply(admin_cluster, remove=[deny])

    # the same check as an operator runs it (last: the CLI sets up logging), from a config file: exit 0, a summary line
    config = tmp_path / "compactd.yaml"
    config.write_text(yaml.safe_dump(settings.model_dump(mode="json", exclude={"thresholds", "readers"}) | {
        "thresholds": settings.thresholds, "redis_url": redis_url}))  # fmt: skip
    assert main(["doctor", "--config", str(config)]) == 0
    assert "0 missing" in capsys.readouterr().out.splitlines()[-1]

    # the compaction service's rows (Read on the topics it compacts, its view topic): a run as the principal, of a
    # topic Kafka's cleaner leaves alone (one it compacts is refused)
    admin_cluster.send_raw(logs, b"v1", b"k")
    admin_cluster.send_raw(logs, b"v2", b"k")
    admin_cluster.flush()
    view = f"{logs}.compacted"  # Kafka's ACLs have no suffix pattern: the view by name (or a prefix of it)
    view_ops = (AclOperation.CREATE, AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE)
    service = [AclBinding(ResourceType.TOPIC, "*", ResourcePatternType.LITERAL, USER, "*", AclOperation.READ, ANY)]
    service += [
        AclBinding(ResourceType.TOPIC, view, ResourcePatternType.LITERAL, USER, "*", op, ANY) for op in view_ops
    ]
    apply(admin_cluster, add=service)
    assert main(["compact", logs, "--config", str(config)]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (summary["status"], summary["records_in"], summary["records_out"]) == ("SUCCESS", 2, 1)
    assert admin_cluster.watermarks(view) == (0, 1)  # the view holds the key once

    # `agent --admin` as the principal (managed clusters): one poll publishes the group's commit to compactd's commits
    # topic; the job reading that topic (the `commits` source, which `admin` reads too) takes the group's position
    # from it (the agent's own time-slice segments are recent: nothing is old enough to delete)
    assert main(["agent", "--admin", "--once", "--config", str(config)]) == 0
    commits = [e for e in admin_cluster.read_all(names["commits"]) if e.get("group") == group]
    assert {(e["topic"], e["offset"]) for e in commits if e["type"] == "offset_commit"} == {(data, 500)}
    from_commits = settings.model_copy(
        update={"offsets_source": "commits", "checkpoint_dir": str(tmp_path / "ckpt-commits"), "redis_prefix": "acl2"}
    )
    with Application(from_commits, spark=spark) as job:
        job.run(once=True)
        assert job.state.view(data, 0).min_committed == 500


def test_a_compaction_run_as_a_principal_granted_its_rows(spark, sasl_broker, redis_url) -> None:
    """The compaction service's rows of the table (Read on the topic; the view by name; compactd's own topics by
    prefix), and nothing else: a run through the JVM task authenticates with SASL from compactd's `kafka:` settings
    and publishes the view KIP-280 keeps. Ground truth: the view read back by the superuser."""
    import redis

    from compactd.compaction.reduce import reduce_partition
    from compactd.compaction.service import Compactor
    from compactd.compaction.strategy import Strategy
    from tests.support.compaction import history, produce

    super_user = {k: v for k, v in sasl_broker.client().items() if k != "bootstrap.servers"}
    admin_cluster = Cluster(sasl_broker.bootstrap, super_user)
    prefix = admin_cluster.prefix
    topic = admin_cluster.name("accounts")
    admin_cluster.create(topic, 2)
    sent = produce(admin_cluster, topic, history(seed=5, n=300, keys=40), partitions=2)
    t, lit, pre = ResourceType.TOPIC, ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    view_ops = [AclOperation.CREATE, AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE]
    rows = [
        (t, topic, lit, [AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS]),
        (t, f"{topic}.compacted", lit, view_ops),
        (t, f"compactd-{prefix}.", pre, view_ops),
    ]
    apply(admin_cluster, add=[AclBinding(kind, name, pattern, USER, "*", op, ANY)
                                    for kind, name, pattern, ops in rows for op in ops])  # fmt: skip
    creds = {k: v for k, v in sasl_broker.client("compactd").items() if k != "bootstrap.servers"}
    names = {k: f"compactd-{prefix}.{k}" for k in ("segments", "commits", "config", "actions", "dlq", "compactions")}
    settings = Settings(bootstrap_servers=sasl_broker.bootstrap, redis_url=redis_url, topics=TopicNames(**names),
                        kafka=creds)  # fmt: skip
    comp = Compactor(settings, redis.Redis.from_url(redis_url), lambda: {}, lambda: spark)
    out = comp.run(topic)
    assert (out["status"], out["generation"], out["records_in"]) == ("SUCCESS", 1, 300)
    manifest = comp.log.read(topic)
    assert manifest is not None
    for p in (0, 1):
        kept, _ = reduce_partition([], sent[p], Strategy(), now=manifest.started_at)
        pv = manifest.partitions[str(p)]
        got = read_range(admin_cluster, f"{topic}.compacted", p, pv.view_start, pv.view_end)
        assert got == [(r.key, r.value) for r in kept]


def read_range(cluster: Cluster, topic: str, partition: int, start: int, end: int) -> list[tuple]:
    """(key, value) of [start, end) of one partition."""
    import uuid

    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(cluster.conn.client("consumer", forced={"group.id": f"read-{uuid.uuid4()}"}))
    c.assign([TopicPartition(topic, partition, start)])
    out: list[tuple] = []
    deadline = time.monotonic() + 30
    while len(out) < end - start and time.monotonic() < deadline:
        out += [(m.key(), m.value()) for m in c.consume(1000, 0.5) if m.error() is None and m.offset() < end]
    c.close()
    return out


def test_offsets_source_admin_without_describe_on_the_cluster_refuses_to_start_and_holds(
    sasl_broker, redis_url, tmp_path, capsys
) -> None:
    """Issue 64, item 4: with `offsets_source: admin` the cluster's listing is all compactd knows of groups, and a
    principal without Describe on the cluster is answered only the groups it may Describe one by one. Here it may
    Describe `visible` and not `hidden`, which committed 100 on the topic: before, `agent --admin` and the job started,
    the check before a delete listed `visible` alone, and nothing held `hidden`'s topic. Now both refuse to start in
    one line, the doctor says why, and a grant taken away under a running job holds its deletes."""
    from compactd.errors import DependencyUnavailable
    from compactd.kafka.config import KafkaConnection
    from compactd.kafka.groups import ClusterGroupOffsets

    super_user = {k: v for k, v in sasl_broker.client().items() if k != "bootstrap.servers"}
    cluster = Cluster(sasl_broker.bootstrap, super_user)
    data, visible, hidden = cluster.name("orders"), cluster.name("visible"), cluster.name("hidden")
    cluster.create(data, 1, {"cleanup.policy": "delete"})
    cluster.fill(data, 400)
    consume_and_commit(sasl_broker.bootstrap, visible, data, 400, newest_protocol(), extra=sasl_broker.client())
    consume_and_commit(sasl_broker.bootstrap, hidden, data, 100, newest_protocol(), extra=sasl_broker.client())
    user, lit = f"User:{LISTER}", ResourcePatternType.LITERAL
    mine = [
        AclBinding(ResourceType.GROUP, visible, lit, user, "*", AclOperation.DESCRIBE, ANY),
        AclBinding(ResourceType.TOPIC, data, lit, user, "*", AclOperation.DESCRIBE, ANY),
    ]
    on_cluster = AclBinding(ResourceType.BROKER, "kafka-cluster", lit, user, "*", AclOperation.DESCRIBE, ANY)
    apply(cluster, add=mine)
    creds = {k: v for k, v in sasl_broker.client(LISTER).items() if k != "bootstrap.servers"}
    conn = KafkaConnection(sasl_broker.bootstrap, creds)

    # what the principal is answered: `visible` only (the blindness the refusal is about)
    blind = ClusterGroupOffsets(conn, ttl_s=0)
    try:
        seen = blind.check(data).committed
        assert visible in seen and hidden not in seen
    finally:
        blind.close()

    config = tmp_path / "compactd.yaml"
    config.write_text(yaml.safe_dump({
        "bootstrap_servers": sasl_broker.bootstrap, "redis_url": redis_url, "checkpoint_dir": str(tmp_path / "ckpt"),
        "offsets_source": "admin", "kafka": creds, "create_topics": False,
        "topics": {k: cluster.name(k) for k in ("segments", "commits", "config", "actions", "dlq")},
        "thresholds": {"global": {"dry.run": False}, f"topic:{data}": {"consumed.retention.ms": H}},
    }))  # fmt: skip
    for argv in (["agent", "--admin", "--once"], ["run", "--once"]):
        capsys.readouterr()
        assert main([*argv, "--config", str(config)]) == 2, argv
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and "offsets_source: admin needs Describe on the Cluster" in err[0], (argv, err)
    assert main(["doctor", "--config", str(config)]) == 1
    cluster_lines = [line for line in capsys.readouterr().out.splitlines() if " Cluster: " in line]
    assert cluster_lines and cluster_lines[0].startswith("missing"), cluster_lines
    assert "offsets_source: admin needs" in cluster_lines[0], cluster_lines
    assert cluster.watermarks(data) == (0, 400)

    # granted, the listing is whole: `hidden` is listed, and, its offsets not readable, it holds every delete
    apply(cluster, add=[on_cluster])
    checking = ClusterGroupOffsets(conn, ttl_s=0, every_group=True)
    try:
        with pytest.raises(DependencyUnavailable, match=f"group {hidden}"):
            checking.check(data)
        # the grant taken away under the running job: the next check holds, naming the setting
        apply(cluster, remove=[on_cluster])

        def refused() -> str:
            try:
                checking.check(data)
            except DependencyUnavailable as exc:
                return str(exc)
            return ""

        why = wait_until("the listing refused", refused, lambda w: "needs Describe on the Cluster" in w, 30)
        assert why.startswith("Kafka (group listing)"), why
    finally:
        checking.close()
        apply(cluster, remove=mine)
