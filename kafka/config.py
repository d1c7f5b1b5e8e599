"""The one place that writes librdkafka settings: every Kafka client compactd creates gets them from here.

`KafkaConnection` holds the bootstrap servers and the user's extra settings (`kafka:` in the config file:
security.protocol, sasl.*, ssl.*, ...). Each client asks for a role; the result is our defaults for that role,
then the user's settings (the user wins), then what the caller must force (a group id, a read mode).
librdkafka's own log lines go through Python logging (`compactd.librdkafka`), repeated lines folded.
`new_consumer`, `new_producer` and `new_admin` make the clients themselves: first, the process's garbage collector
moves to a thread of compactd's own (`compactd/gc_pause.py`: librdkafka aborts a process whose collector frees a
client on one of librdkafka's threads).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from compactd.gc_pause import collect_on_own_thread

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient

Role = Literal["producer", "consumer", "admin"]
KafkaValue = str | int | float | bool

LOG = logging.getLogger("compactd.librdkafka")

# Keys that hold secrets: never logged, never shown by `config get`.
SECRET_KEYS = re.compile(
    r"(password|secret|token|key\.pem|keystore\.password|keystore\.key|jaas|sasl\.oauthbearer\.config)", re.I
)

# Every client asks the cluster for its metadata every 10 s (librdkafka: every 5 min) unless the user's settings say
# otherwise. A client learns where leaders and the controller moved only from metadata: after a broker of a replicated
# cluster dies, an Admin request bound for the controller the client last heard of ("Timed out waiting for
# controller") and a ListOffsets bound for a dead leader wait for the next refresh. Measured on three nodes (Apache
# Kafka 4.4, the node leading most partitions killed with -9): the share-group reader stayed blind, and every delete
# held, for minutes at librdkafka's default.
METADATA_REFRESH_MS = 10_000
# A request to a node that stopped answering (SIGSTOP, a frozen VM, a full GC: it holds the connection open) waits
# out `socket.timeout.ms` before the client gives up on it and asks the metadata where the leader went: librdkafka's 60
# s (a produce: the lesser of it and `message.timeout.ms`) kept the agents' segment events, and with them the job's
# batches, waiting for a minute while the controller had moved the leaders 2 s after the node stopped. 10 s, as the
# job's own source (streaming/job.py `kafka.request.timeout.ms`).
REQUEST_TIMEOUT_MS = 10_000
_EVERY_ROLE: dict[str, KafkaValue] = {
    "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS,
    "socket.timeout.ms": REQUEST_TIMEOUT_MS,
}
ROLE_DEFAULTS: dict[str, dict[str, KafkaValue]] = {
    "producer": {**_EVERY_ROLE, "linger.ms": 5},
    "consumer": {**_EVERY_ROLE, "enable.auto.commit": False},
    "admin": {**_EVERY_ROLE},
}


# librdkafka's lines for a broker's coordinators still loading after a start (Kafka answers COORDINATOR_LOAD_IN_PROGRESS
# for a moment): the client retries and succeeds, so they are debug lines, not warnings
TRANSIENT = ("Coordinator load in progress: retrying",)
NODE_DOWN = "FAIL "  # librdkafka's line for a connection to one broker that failed or dropped
_CLIENT = re.compile(r"rdkafka#\w+-\d+")
_SUPPRESSED = re.compile(r"\(after \d+ms in state \w+(, \d+ identical error\(s\) suppressed)?\)")


class _RepeatFilter(logging.Filter):
    """librdkafka repeats a failing connection's line on every retry: pass each distinct line once a minute."""

    def __init__(self, window_s: float = 60.0) -> None:
        super().__init__()
        self.window_s = window_s
        self._seen: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.endswith(TRANSIENT):  # librdkafka retries by itself and says so: not news unless it lasts
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return LOG.isEnabledFor(logging.DEBUG)
        if record.levelno > logging.WARNING and message.startswith(NODE_DOWN):
            # one node of several refusing or dropping connections (a broker restarting, killed): the clients go on
            # with the others, and a client with none left says so through its error callback
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        # the same line from every client, and again with librdkafka's count of what it suppressed: one shape
        shape = re.sub(r"\d+", "#", _SUPPRESSED.sub("", _CLIENT.sub("rdkafka", message)))
        now = time.monotonic()
        last = self._seen.get(shape)
        if last is not None and now - last < self.window_s:
            return False
        if len(self._seen) > 1000:
            self._seen.clear()
        self._seen[shape] = now
        return True


LOG.addFilter(_RepeatFilter())


def _spark_value(value: KafkaValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class KafkaConnection:
    """Where the cluster is and how to talk to it; shared by the source, sinks, writers, admin and agent."""

    bootstrap_servers: str
    extra: Mapping[str, KafkaValue] = field(default_factory=dict)

    def client(
        self, role: Role, defaults: Mapping[str, KafkaValue] | None = None, forced: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """librdkafka settings for one client: role defaults < `defaults` < the user's settings < `forced`."""
        conf: dict[str, Any] = {**ROLE_DEFAULTS[role], **(defaults or {})}
        conf["bootstrap.servers"] = self.bootstrap_servers
        conf.update(self.extra)
        conf.update(forced or {})
        conf.setdefault("logger", LOG)
        return conf

    def spark_options(self) -> dict[str, str]:
        """The same settings as Spark Kafka source options (`kafka.` prefix, string values)."""
        opts = {"kafka.bootstrap.servers": self.bootstrap_servers}
        opts.update({f"kafka.{k}": _spark_value(v) for k, v in self.extra.items()})
        return opts

    @classmethod
    def from_spark_options(cls, options: Mapping[str, str]) -> KafkaConnection:
        """Inverse of `spark_options`, for the source running inside Spark (option keys may arrive lowercased)."""
        extra = {k[6:]: v for k, v in options.items() if k.lower().startswith("kafka.")}
        servers = extra.pop("bootstrap.servers", "127.0.0.1:9092")
        return cls(str(servers), extra)

    def redacted(self) -> dict[str, KafkaValue]:
        """The user's settings with secret values masked, for logs and error lines."""
        return {k: ("***" if SECRET_KEYS.search(k) else v) for k, v in self.extra.items()}


def new_consumer(conf: Mapping[str, Any]) -> Consumer:
    """A Consumer, made after the collector left librdkafka's threads (the module's docstring)."""
    from confluent_kafka import Consumer

    collect_on_own_thread()
    return Consumer(dict(conf))


def new_producer(conf: Mapping[str, Any]) -> Producer:
    """A Producer, made after the collector left librdkafka's threads."""
    from confluent_kafka import Producer

    collect_on_own_thread()
    return Producer(dict(conf))


def new_admin(conf: Mapping[str, Any]) -> AdminClient:
    """An AdminClient, made after the collector left librdkafka's threads."""
    from confluent_kafka.admin import AdminClient

    collect_on_own_thread()
    return AdminClient(dict(conf))
