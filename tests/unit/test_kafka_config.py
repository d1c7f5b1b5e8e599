"""The one builder of librdkafka settings: precedence, Spark options, secrets, repeated log lines."""

from __future__ import annotations

import logging

from compactd.kafka.config import LOG, KafkaConnection


def test_precedence_role_defaults_then_ours_then_users_then_forced() -> None:
    conn = KafkaConnection("b:9092", {"linger.ms": 50, "security.protocol": "SASL_SSL", "fetch.wait.max.ms": 7})
    producer = conn.client("producer")
    assert producer["bootstrap.servers"] == "b:9092" and producer["linger.ms"] == 50  # the user beats our default
    assert producer["security.protocol"] == "SASL_SSL" and producer["logger"] is LOG
    consumer = conn.client("consumer", {"fetch.wait.max.ms": 10}, forced={"group.id": "g"})
    assert (
        consumer["fetch.wait.max.ms"] == 7 and consumer["group.id"] == "g" and consumer["enable.auto.commit"] is False
    )


def test_spark_options_round_trip_and_values_become_strings() -> None:
    conn = KafkaConnection("b:1,c:2", {"sasl.mechanism": "PLAIN", "session.timeout.ms": 10000, "x.enable": True})
    opts = conn.spark_options()
    assert opts == {
        "kafka.bootstrap.servers": "b:1,c:2",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.session.timeout.ms": "10000",
        "kafka.x.enable": "true",
    }
    back = KafkaConnection.from_spark_options({**opts, "subscribe": "t"})
    assert back.bootstrap_servers == "b:1,c:2" and back.extra["sasl.mechanism"] == "PLAIN"


def test_secrets_are_masked() -> None:
    conn = KafkaConnection("b", {"sasl.password": "pw", "ssl.key.password": "k", "sasl.username": "u"})
    assert conn.redacted() == {"sasl.password": "***", "ssl.key.password": "***", "sasl.username": "u"}


def test_repeated_librdkafka_lines_pass_once(caplog) -> None:
    LOG.setLevel(logging.WARNING)
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        for ms in (0, 3, 9):
            LOG.error("FAIL: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after %dms in state CONNECT)", ms)
        LOG.error("FAIL: Failed to resolve 'nohost:9092'")
    assert len(caplog.records) == 2


def test_one_node_down_is_one_warning_from_all_clients(caplog) -> None:
    """A node of a cluster killed: every client says it cannot connect, and says it again with the count of what it
    suppressed; one WARNING line stays (the clients go on with the other nodes)."""
    LOG.setLevel(logging.WARNING)
    line = "FAIL [rdkafka#%s] [thrd:127.0.0.1:4/1]: 127.0.0.1:4/1: Connect to ipv4#127.0.0.1:4 failed: "
    line += "Connection refused"
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        for client in ("producer-6", "consumer-8", "consumer-12"):
            LOG.error(line + " (after 0ms in state CONNECT)", client)
            LOG.error(line + " (after 0ms in state CONNECT, 1 identical error(s) suppressed)", client)
    assert [r.levelname for r in caplog.records] == ["WARNING"], caplog.text
