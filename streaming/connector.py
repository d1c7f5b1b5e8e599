"""Spark's own Kafka connector (`spark-sql-kafka-0-10`): its jars, and the options compactd reads Kafka with.

The jars come from Maven Central through `jvm/pom.xml` (compactd/maven.py), at exactly pyspark's version, and reach
Spark as local files (`spark.jars`; deploy/submit ships them to a cluster with the job), never through Ivy.

compactd's `kafka:` settings are librdkafka's (its Python clients use them). The connector runs the Java client, whose
names differ for the security settings: `java_options` translates those, keeps the keys both clients share, and leaves
out librdkafka's own tuning, which has no Java meaning. `spark_kafka:` settings are given to the Java client as they
are, after the translation (they win).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from compactd import maven
from compactd.errors import CompactdError
from compactd.kafka.config import SECRET_KEYS, KafkaConnection, KafkaValue
from compactd.policy.thresholds import SOURCE_GROUP_PREFIX
from compactd.streaming import udfs

log = logging.getLogger("compactd.source")

# The driver's offset requests: Spark's default reader (Admin) drops internal topics, so `__consumer_offsets` would
# yield no partition; the consumer-based one reads it (a session setting: every Kafka source of the session uses it).
# Spark shows a source's options in its plans (UI, event logs, `explain`), masking those whose key or value matches
# its redaction patterns: the default ones miss `kafka.ssl.keystore.key` (the PEM private key `java_options`
# inlines) and librdkafka's `kafka.ssl.key.pem`. The options' pattern gets compactd's secret keys too, and any plan
# text a PEM private key (whatever carried it there).
SESSION_CONF = {
    "spark.sql.streaming.kafka.useDeprecatedOffsetFetching": "true",
    "spark.sql.redaction.options.regex": f"(?i)url|{SECRET_KEYS.pattern}",
    "spark.sql.redaction.string.regex": r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
}
# The consumer-based offset reader subscribes with a group of its own (it never commits); its id starts with this, so
# the group is recognisably compactd's: it never counts as a reader (`policy.thresholds.group_counts`).
GROUP_ID_PREFIX = SOURCE_GROUP_PREFIX

# The Java consumer's defaults for a source read, below the user's settings. Reads are bounded ranges up to the end of
# the log: a fetch the broker holds for `fetch.max.wait.ms` (500 ms by default) when no new data is there cost each
# task half a second at its range's end (600k records in 16 partitions: 5.1 s to read; 1.2 s with 10 ms, measured in
# docs/benchmarks.md). Larger fetches per partition: fewer round trips on a backlog. The connector polls for each
# record it cannot take from the last poll's batch, and the consumer hands out `max.poll.records` (500 by default) a
# poll. With 10,000, Spark's read of 1M binary commits went from 345k to 513k records/s (issue 65, bench/throughput.py
# `spark_stages`), as ViewRun.java's compaction reads already did. No JMX reporter: each consumer registered its
# metrics' MBeans, about 2 CPU-seconds of the first large batch's 10-12 (class loading, the JIT) for nothing compactd
# reads.
READ_DEFAULTS = {
    "fetch.max.wait.ms": "10",
    "max.partition.fetch.bytes": str(8 << 20),
    "max.poll.records": "10000",
    "auto.include.jmx.reporter": "false",
}
# The stream's reads only, below the user's settings too. A fetch came through a 64 KiB socket buffer
# (`receive.buffer.bytes`'s default); with 1 MiB besides the above, Spark's read of 1M binary commits made 564k
# records/s. The compaction's clients keep the default: with it, cold `compactd compact` runs took 15.5-16.4 s
# instead of 12.2-15.0 s (one run each, noisy). And Kafka's default fetch per partition (1 MiB), not 8: Spark keeps
# each source partition's consumer, its last fetch and the records of its last poll in the JVM between batches (its
# consumer pool, and every query's for 5 min), and with 8 MiB the driver's heap after a full collection grew by
# 90 MB a query over 16 source partitions (164 -> 435 MB in 5 rounds of bench/throughput.py; a `make bench` run of
# 8 rounds ended in full collections, 2.1 s batches taking 13.8 s), with 1 MiB by 32 MB at the same speed (219k vs
# 218k events/s, one run each).
SOURCE_READ_DEFAULTS = {"receive.buffer.bytes": str(1 << 20), "max.partition.fetch.bytes": str(1 << 20)}

# Keys with the same name and meaning in librdkafka and the Java client.
SHARED_KEYS = frozenset(
    {
        "security.protocol",
        "sasl.mechanism",
        "sasl.kerberos.service.name",
        "ssl.endpoint.identification.algorithm",
        "ssl.key.password",
        "ssl.keystore.location",
        "ssl.keystore.password",
        "client.id",
        "client.dns.lookup",
        "socket.connection.setup.timeout.ms",
        "isolation.level",
    }
)
_SASL_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def _pom() -> Path:
    return Path(str(resources.files("compactd.streaming.jvm").joinpath("pom.xml")))


def spark_version() -> str:
    """The Spark version the connector is pinned at (`spark.version` of the pom): pyspark's own."""
    return maven.pom_property(_pom(), "spark.version")


def connector_jars(quiet: bool = False) -> list[Path]:
    """The connector's jars as local files, fetched once (`make deps`), and compactd's decoders beside them
    (`udfs`: the source's fast path). A pyspark of another version fails here, in
    one line: Spark loads a connector built for another version and fails later, in a task, with a JVM error."""
    import pyspark

    want = spark_version()
    if pyspark.__version__ != want:
        raise CompactdError(
            f"pyspark {pyspark.__version__} is installed, but Spark's Kafka connector is pinned at {want} "
            f"(streaming/jvm/pom.xml): pip install pyspark=={want}"
        )
    libs = maven.ensure_jars(_pom(), "spark-kafka", want, f"Spark's Kafka connector {want}", "jars", quiet)
    jars = sorted(libs.glob("*.jar"))
    if not jars:
        raise CompactdError(f"no jar in {libs}: remove {libs.parent} and run `make deps` again")
    return [*jars, udfs.tasks_jar(quiet, jars)]


def java_options(
    conn: KafkaConnection, spark_kafka: Mapping[str, KafkaValue] | None = None, source: bool = False
) -> dict[str, str]:
    """The connection as Java client settings (without the connector's `kafka.` prefix); `source`: for the stream's
    reads (SOURCE_READ_DEFAULTS too)."""
    extra = {k: v for k, v in conn.extra.items()}
    defaults = {**READ_DEFAULTS, **(SOURCE_READ_DEFAULTS if source else {})}
    out: dict[str, str] = {**defaults, "bootstrap.servers": conn.bootstrap_servers}
    left_out: list[str] = []
    mechanism = str(extra.pop("sasl.mechanism", extra.pop("sasl.mechanisms", "")) or "")
    if mechanism:
        out["sasl.mechanism"] = mechanism
    user, password = extra.pop("sasl.username", None), extra.pop("sasl.password", None)
    if user is not None:
        module = _SASL_MODULES.get(mechanism.upper() or "PLAIN")
        if module is None:
            raise CompactdError(
                f"sasl.mechanism {mechanism} with sasl.username: Spark's Kafka connector needs a JAAS config for it; "
                "set spark_kafka.sasl.jaas.config"
            )
        quoted = f"username={json.dumps(str(user))} password={json.dumps(str(password or ''))}"
        out["sasl.jaas.config"] = f"{module} required {quoted};"
    ca = extra.pop("ssl.ca.location", None)
    if ca is not None:
        out["ssl.truststore.type"] = "PEM"
        out["ssl.truststore.location"] = str(ca)
    cert, key = extra.pop("ssl.certificate.location", None), extra.pop("ssl.key.location", None)
    if cert is not None or key is not None:
        if cert is None or key is None:
            raise CompactdError("ssl.certificate.location and ssl.key.location go together: set both, or neither")
        out["ssl.keystore.type"] = "PEM"
        out["ssl.keystore.certificate.chain"] = Path(str(cert)).read_text()
        out["ssl.keystore.key"] = Path(str(key)).read_text()
    if str(extra.pop("enable.ssl.certificate.verification", "true")).lower() in ("false", "0"):
        raise CompactdError(
            "enable.ssl.certificate.verification=false has no Java client equivalent: give Spark's Kafka connector a "
            "truststore instead (ssl.ca.location, or spark_kafka.ssl.truststore.*)"
        )
    for key_, value in extra.items():
        if key_ in SHARED_KEYS:
            out[key_] = _text(value)
        else:
            left_out.append(key_)
    if left_out:
        log.info(
            "kafka settings with no Java client meaning, not given to Spark's Kafka connector: %s (spark_kafka sets "
            "the connector's own)",
            ", ".join(sorted(left_out)),
        )
    out.update({k: _text(v) for k, v in (spark_kafka or {}).items()})
    return out


def _text(value: KafkaValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


if __name__ == "__main__":  # `make deps`: --fetch; deploy/submit: --print (the jars, comma-separated)
    import sys

    try:
        found = connector_jars(quiet="--print" in sys.argv)
    except CompactdError as exc:
        print(f"compactd: error: {exc}", file=sys.stderr)
        sys.exit(1)
    if "--print" in sys.argv:
        print(",".join(str(p) for p in found))
