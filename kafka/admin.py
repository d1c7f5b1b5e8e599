"""Cluster metadata calls shared by the job, the source and the CLI: reachability, topics, end offsets."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from typing import Any

from compactd.errors import CompactdError, DependencyUnavailable
from compactd.kafka.config import KafkaConnection, new_admin
from compactd.kafka.watermarks import list_offsets
from compactd.model import SourceOffsets

CHECK_STEP_S = 0.25  # how often the start-up check looks at what librdkafka said while it waits


RETIRED_KEEP_S = 120.0  # longer than any request compactd makes waits for its answer
RETIRED_MAX = 16  # and at most this many (each holds its broker threads)
_retired: list[tuple[float, Any]] = []


def retire(client: Any) -> None:
    """A client dropped for a new one (its metadata may point at a dead node) while another thread may still wait on
    a request it sent: kept referenced RETIRED_KEEP_S, neither closed under that call nor freed before its answer
    (a freed client never answers: the wait would run to its timeout). Older retired clients go now. Where a client
    is finally freed does not matter: the collector never runs on librdkafka's threads (compactd/gc_pause.py)."""
    if client is None:
        return
    now = time.monotonic()
    _retired[:] = [(at, c) for at, c in _retired if now - at < RETIRED_KEEP_S][-(RETIRED_MAX - 1) :]
    _retired.append((now, client))


def admin_client(conn: KafkaConnection, timeout_s: float = 10.0) -> Any:
    # a dead bootstrap address should fail the first request quickly, not after librdkafka's long defaults
    return new_admin(conn.client("admin", {"socket.connection.setup.timeout.ms": int(timeout_s * 1000)}))


def check_reachable(conn: KafkaConnection, timeout_s: float = 5.0) -> None:
    """Bounded start-up check: one metadata request, or DependencyUnavailable naming the setting to change.

    It fails as soon as librdkafka reports every bootstrap broker down (refused, unresolvable: known at once), and
    after `timeout_s` when no broker answers at all (a dropped connection, a firewall)."""
    from confluent_kafka import KafkaError, KafkaException

    errors: list[KafkaError] = []
    conf = conn.client("admin", {"socket.connection.setup.timeout.ms": int(timeout_s * 1000)})
    conf["error_cb"] = errors.append
    conf["log_level"] = 0  # the one-line error below says it all
    try:
        admin = new_admin(conf)
    except (KafkaException, ValueError, TypeError) as exc:  # librdkafka refused a setting of the kafka: map
        raise DependencyUnavailable("Kafka", conn.bootstrap_servers, "the kafka: settings", str(exc)) from None
    until = time.monotonic() + timeout_s
    while True:
        try:
            admin.list_topics(timeout=max(0.01, min(CHECK_STEP_S, until - time.monotonic())))
            return
        except KafkaException as exc:
            admin.poll(0)  # serves error_cb: librdkafka's own reason (refused, unresolvable, TLS, SASL)
            down = any(e.code() == KafkaError._ALL_BROKERS_DOWN for e in errors)
            if not down and time.monotonic() < until:
                continue
            cause = _first_reason([e.str() for e in errors]) or (exc.args[0].str() if exc.args else str(exc))
            setting = "--bootstrap-servers / bootstrap_servers"
            raise DependencyUnavailable("Kafka", conn.bootstrap_servers, setting, cause) from None


def _first_reason(errors: list[str]) -> str | None:
    """`127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 0ms ...)` → the
    part after the broker name, without the timing."""
    for err in errors:
        if "brokers are down" in err:
            continue
        text = err.split("/bootstrap: ", 1)[-1]
        return re.sub(r"\s*\(after \d+ms in state \w+\)$", "", text)
    return None


ENSURE_ATTEMPT_S = 10.0  # one attempt at compactd's own topics; the next goes through a new client


def ensure_topics(
    conn: KafkaConnection,
    names: Iterable[str],
    partitions: int = 1,
    timeout_s: float = 30.0,
    configs: dict[str, dict[str, str]] | None = None,
    replication_factor: int = -1,
    admin: Any = None,
) -> None:
    """Create compactd's own topics when missing (operators may pre-create them with their own layout).

    `configs`: topic configs by name (the config topic keeps its events forever: they are deltas, not snapshots).
    `replication_factor`: -1 takes the cluster's `default.replication.factor` (KIP-464, Kafka 2.4+): never 1 on a
    cluster that replicates, where the nudge ledger or the config topic would otherwise live on one broker.
    `admin`: the caller's client, already connected (a new one connects first: about 0.05 s).

    A request that has no answer within ENSURE_ATTEMPT_S is asked again through a new client until `timeout_s`: the
    broker it went to may be a node that stopped answering (seen on three nodes: a follower stopped with SIGSTOP
    while the job started held CreateTopics for the whole 30 s, and the job ended with a bare TimeoutError). Past
    `timeout_s`, one line: CompactdError.
    """
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout_s
    names = list(dict.fromkeys(names))
    while True:
        attempt = min(ENSURE_ATTEMPT_S, max(deadline - time.monotonic(), 1.0))
        client = admin or admin_client(conn)
        try:
            _create_missing(client, names, partitions, attempt, configs or {}, replication_factor)
            return
        except (TimeoutError, KafkaException) as exc:
            why = exc.args[0].str() if isinstance(exc, KafkaException) else f"no answer within {attempt:g} s"
            if isinstance(exc, KafkaException) and not exc.args[0].retriable() and exc.args[0].name() != "_TIMED_OUT":
                raise CompactdError(f"cannot create compactd's topics: {why}") from None
            if time.monotonic() >= deadline:
                raise CompactdError(
                    f"cannot create compactd's topics {', '.join(names)} within {timeout_s:g} s: {why}"
                ) from None
            retire(client)
            admin = None  # a new client: its requests may go to another broker


def _create_missing(
    admin: Any, names: list[str], partitions: int, timeout_s: float, configs: dict[str, dict[str, str]],
    replication_factor: int,
) -> None:  # fmt: skip
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    existing = set(admin.list_topics(timeout=timeout_s).topics)
    wanted = [
        NewTopic(t, partitions, replication_factor, config=configs.get(t, {})) for t in names if t not in existing
    ]
    for topic, fut in admin.create_topics(wanted, request_timeout=timeout_s).items() if wanted else []:
        try:
            fut.result(timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            if exc.args[0].retriable() or exc.args[0].code() == KafkaError._TIMED_OUT:
                raise
            raise CompactdError(f"cannot create topic {topic}: {exc.args[0].str()}") from None


def list_end_offsets(admin: Any, topics: list[str], which: str, isolation: str = "read_committed") -> SourceOffsets:
    """Earliest ("low") or latest ("high") offset of every partition of `topics`, in one ListOffsets round.

    Under read_committed "high" is the last stable offset: a consumer cannot read past an open transaction, so a
    batch planned up to the high watermark would stall on it.
    """
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    spec = OffsetSpec.earliest() if which == "low" else OffsetSpec.latest()
    # Whole-cluster metadata, filtered: asking for one topic by name can auto-create it on some brokers.
    metadata = admin.list_topics(timeout=10).topics
    request = {}
    for topic in topics:
        md = metadata.get(topic)
        if md is None or md.error is not None:
            continue  # not created yet: picked up once it exists
        request.update({TopicPartition(topic, p): spec for p in md.partitions})
    if not request:
        return {}
    level = IsolationLevel.READ_COMMITTED if isolation == "read_committed" else IsolationLevel.READ_UNCOMMITTED
    out: dict[str, dict[str, int]] = {}
    for tp, offset in list_offsets(admin, request, level, 10).items():
        out.setdefault(tp.topic, {})[str(tp.partition)] = offset
    return out


def high_watermarks(conn: KafkaConnection, topic: str) -> dict[str, int]:
    """Where each partition ends for a read_committed reader (keys as the source's offsets use them)."""
    return list_end_offsets(admin_client(conn), [topic], "high").get(topic, {})
