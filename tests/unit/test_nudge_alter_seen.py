"""sinks/kafka_admin.py: a config compactd altered is described again until the broker shows it.

KRaft answers IncrementalAlterConfigs once the controller has the change; a broker's DescribeConfigs shows it a
moment later. A nudge read in that moment, right after a restore, saw compactd's own value still on the topic, took it
for a nudge Redis had lost, and remembered the broker's default as the original: the next restore removed the
operator's override (one generated history of test_every_nudge_is_eventually_put_back, on the real broker). Here the
broker's lag is a fake admin's, which shows each alter `lag` descriptions late.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from confluent_kafka.admin import ConfigEntry, ConfigSource

from compactd.kafka.config import KafkaConnection
from compactd.model import ActionRecord, Nudge
from compactd.sinks.kafka_admin import KafkaAdminSink

LAG = "max.compaction.lag.ms"
OWN = ConfigSource.DYNAMIC_TOPIC_CONFIG.value


def done() -> Future:
    f: Future = Future()
    f.set_result(None)
    return f


class LaggingAdmin:
    """One topic's own configs; each alter is shown by DescribeConfigs only from the `lag`-th description on."""

    def __init__(self, own: dict[str, str], lag: int) -> None:
        self.own, self.shown, self.lag, self.late = dict(own), dict(own), lag, 0

    def incremental_alter_configs(self, resources: list[Any], request_timeout: float) -> dict[Any, Future]:
        for entry in resources[0].incremental_configs:
            if entry.value is None:
                self.own.pop(entry.name, None)
            else:
                self.own[entry.name] = entry.value
        self.late = self.lag
        return {resources[0]: done()}

    def describe_configs(self, resources: list[Any], request_timeout: float) -> dict[Any, Future]:
        if self.late > 0:
            self.late -= 1
        else:
            self.shown = dict(self.own)
        entries = {
            "cleanup.policy": ConfigEntry("cleanup.policy", "compact", source=OWN),
            **{k: ConfigEntry(k, v, source=OWN) for k, v in self.shown.items() if k != "cleanup.policy"},
        }
        f: Future = Future()
        f.set_result(entries)
        return {resources[0]: f}


class Memory:
    """NudgeMemory in a dict, as Redis keeps it: the first remembered nudge of a key is kept."""

    def __init__(self) -> None:
        self.kept: dict[tuple[str, str], Nudge] = {}

    def remember_config(self, nudge: Nudge) -> Nudge:
        return self.kept.setdefault((nudge.topic, nudge.key), nudge)

    def nudges(self) -> list[Nudge]:
        return list(self.kept.values())

    def nudged(self, topic: str) -> dict[str, str | None]:
        return {k: n.original for (t, k), n in self.kept.items() if t == topic}

    def forget_config(self, topic: str, key: str) -> None:
        self.kept.pop((topic, key), None)

    def rest_nudges(self, topic: str, ms: int) -> None:
        pass

    def nudges_rest(self, topic: str) -> int:
        return 0


def record(action: str) -> ActionRecord:
    return ActionRecord("id", action, "ledger", 0, "compaction_lag", False, 0, "pending", detail={"nudge": LAG})


def test_a_nudge_right_after_a_restore_remembers_the_operators_value() -> None:
    admin = LaggingAdmin({"cleanup.policy": "compact", LAG: "86400000"}, lag=2)
    sink = KafkaAdminSink(KafkaConnection("127.0.0.1:1"), Memory(), timeout_s=5)
    sink.admin = admin  # started: the fake stands for the cluster
    first = sink.execute(record("compact"))
    assert (first.status, first.detail["previous"]) == ("sent", "86400000") and admin.own[LAG] == "1"
    assert sink.execute(record("restore_config")).detail["restored"] == {LAG: "86400000"}
    again = sink.execute(record("compact"))  # before the fix: DescribeConfigs still showed "1", taken for a lost nudge
    assert (again.status, again.detail["previous"]) == ("sent", "86400000")
    assert sink.execute(record("restore_config")).detail["restored"] == {LAG: "86400000"}
    assert admin.own[LAG] == "86400000"
