"""Real clients of the compacted view (issue 66, item 4): `<topic>.compacted` is a Kafka topic that tools other than
compactd read as a compacted topic, each key's last record its value and a null value its deletion. After a full run,
a delta run (newer records appended) and a run that died after writing followed by one that completed, under each
KIP-280 strategy (offset, timestamp, header) and with deletes, each client must hold exactly what
`compactd read --compacted --table` shows, and that must be the KIP-280 winners over the whole source (the model):

- a Kafka Streams application's KTable and GlobalKTable (tests/support/jvm/ViewTable.java: Streams' defaults,
  read_uncommitted, the classic protocol);
- kcat (Debian's package: librdkafka's defaults) to the view's end;
- Kafka's own console consumer, from the jars;
- Spark's plain Kafka source (a batch read), beside compactd's reader.

Keys are produced keyed (each key in one partition), as the sources a KTable reads are."""

from __future__ import annotations

import random
import time
import zlib
from typing import Any

import pytest
import redis

from compactd.compaction.service import Compactor, Overrides
from compactd.compaction.strategy import Strategy
from compactd.compaction.view import CompactedReader, table
from tests.support.compaction import Event, produce, run_killed_after_writing
from tests.support.view_clients import console_table, kcat_table, spark_table, streams_table

pytestmark = pytest.mark.spark
PARTITIONS = 3
CLIENTS = ("ktable", "global", "kcat", "console", "spark")


def keyed(seed: int, n: int, keys: int, version_base: int) -> list[Event]:
    """`n` records over `keys` keys, each key in its own partition (crc32), tombstones among them, versions and
    timestamps out of order."""
    rnd = random.Random(seed)
    now = int(time.time() * 1000) - 300_000
    out = []
    for i in range(n):
        key = b"key-%03d" % rnd.randrange(keys)
        value = None if rnd.random() < 0.15 else b"s%d-%d" % (seed, i)
        version = (version_base + rnd.randrange(0, 50)).to_bytes(8, "big", signed=True)
        out.append(Event(zlib.crc32(key) % PARTITIONS, key, value, now + rnd.randrange(-5_000, 5_000) + i,
                         (("v", version),)))  # fmt: skip
    return out


def read(client: str, cluster: Any, spark: Any, view: str) -> dict[bytes, bytes]:
    bootstrap = cluster.conn.bootstrap_servers
    if client in ("ktable", "global"):
        return streams_table(bootstrap, view, client)
    if client == "kcat":
        return kcat_table(bootstrap, view)
    if client == "console":
        return console_table(bootstrap, view)
    return spark_table(spark, bootstrap, view)


# the version matrix reads the view under `header` on every line (`pytest -m versions`); `make test` all three
@pytest.mark.parametrize("kind", ["offset", "timestamp", pytest.param("header", marks=pytest.mark.versions)])
@pytest.mark.parametrize("client", CLIENTS)
def test_a_real_client_of_the_view_reads_what_compactd_reads(
    cluster, job_settings, redis_url, spark, client: str, kind: str
) -> None:
    topic = cluster.name(f"vc{client}{kind}")
    cluster.create(topic, PARTITIONS)
    settings = job_settings()
    comp = Compactor(settings, redis.Redis.from_url(redis_url), lambda: {"global": {"compaction.view.grace.ms": 0}},
                     lambda: spark)  # fmt: skip
    strategy, overrides = Strategy.of(kind, "v"), Overrides(kind, "v")  # type: ignore[arg-type]
    sent = produce(cluster, topic, keyed(1, 400, 60, 0), partitions=PARTITIONS)

    def check(what: str) -> None:
        manifest = comp.log.read(topic)
        assert manifest is not None
        model = {}
        for p in range(PARTITIONS):
            model.update({r.key: r.value for r in table(sent[p], strategy)})
        reader = CompactedReader(comp.conn, settings.topics.compactions)
        compactd = {rec.key: rec.value for _, rec in reader.partition_records(topic, table_mode=True)}
        assert compactd == model, f"{what}: `read --compacted --table` is not the KIP-280 winners"
        got = read(client, cluster, spark, manifest.view)
        wrong = sorted(k for k in model if got.get(k) != model[k])
        back = sorted(k for k in got if k not in model)
        assert not wrong and not back, (
            f"{client} after the {what} run ({kind}): wrong {wrong}, deleted keys back {back}"
        )

    comp.run(topic, overrides)
    check("full")
    for p, recs in produce(cluster, topic, keyed(2, 150, 60, 25), partitions=PARTITIONS).items():
        sent[p] += recs
    comp.run(topic, overrides)
    check("delta")
    for p, recs in produce(cluster, topic, keyed(3, 150, 60, -10), partitions=PARTITIONS).items():
        sent[p] += recs

    run_killed_after_writing(comp, topic, overrides)
    comp.run(topic, overrides)
    check("killed and completed")
