"""Apache Kafka for the test suite, `compactd demo` and the benchmarks: combined KRaft nodes on loopback, one
(`KafkaBroker`) or several with replication (`KafkaCluster`: three nodes, replication factor 3, min ISR 2).

The jars come from Maven Central through the pom beside this module (`jvm/pom.xml`), copied by
`mvn -B dependency:copy-dependencies` into a cache directory named after the pom's hash, so a version change is a
new directory and never a mix. `make deps` fills it; the first broker start on a machine where it is empty fills it
too, with one progress line.

Older lines for the version matrix (`make test-versions`): `COMPACTD_KAFKA_VERSION` (3.9, 3.6, 2.8, or one of their
pinned versions) picks another pom (`jvm/pom-<line>.xml`, fetched on first use), and `COMPACTD_KAFKA_MODE=zk` runs
a line before 4.0 in ZooKeeper mode, its ZooKeeper (`ZooKeeper`, from the jars Kafka itself brings) started beside it.
Kafka 2.8 runs in ZooKeeper mode only: its KRaft mode was an early access without transactions, ACLs or partition
additions.

The broker is tuned for tests, not for production: internal topics with one replica, no initial rebalance delay, the
cleaner and retention checks every second, a small heap and a dedupe buffer to match. It logs to
`<workdir>/logs/server.log` and nothing reaches the terminal. A stopped or killed broker starts again on the same log
dir and ports (`restart`), which is what the broker-outage tests need.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from compactd import maven
from compactd.errors import CompactdError
from compactd.maven import pom_property

# Defaults for a test broker; `extra` overrides any of them (an SASL listener, a cleaner setting).
TEST_SETTINGS: dict[str, str] = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "10",  # 50 by default: a fifth of the files and start-up work on one node
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "5",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "share.coordinator.state.topic.num.partitions": "5",
    "group.initial.rebalance.delay.ms": "0",
    # KIP-848, share and streams group members learn their assignment by heartbeat: every 0.5 s instead of 5 s
    "group.consumer.min.heartbeat.interval.ms": "500",
    "group.consumer.heartbeat.interval.ms": "500",
    "group.share.min.heartbeat.interval.ms": "500",
    "group.share.heartbeat.interval.ms": "500",
    "group.streams.min.heartbeat.interval.ms": "500",
    "group.streams.heartbeat.interval.ms": "500",
    "num.partitions": "1",
    # a broker killed with -9 registers again at once instead of after the old session's 9 s
    "broker.session.timeout.ms": "2000",
    "broker.heartbeat.interval.ms": "500",
    # what runs in the background, every second instead of every 15 s - 5 min, and soon after start (30 s by default)
    "log.initial.task.delay.ms": "1000",
    "log.retention.check.interval.ms": "1000",
    "log.cleaner.backoff.ms": "1000",
    "log.segment.delete.delay.ms": "1000",
    "file.delete.delay.ms": "1000",
    # the log start the agent reads from log-start-offset-checkpoint: written every second, not every minute
    "log.flush.start.offset.checkpoint.interval.ms": "1000",
    "log.cleaner.threads": "1",
    "log.cleaner.dedupe.buffer.size": str(32 * 1024 * 1024),  # 128 MiB by default; the heap below is 512 MiB
    "log.cleaner.io.buffer.size": str(512 * 1024),
    # a test can stamp records with the wall clock of a simulated future; Kafka refuses > 1 h ahead by default
    "log.message.timestamp.after.max.ms": str(365 * 24 * 3600 * 1000),
}
# A replicated cluster's defaults on top of TEST_SETTINGS: what platform teams run (replication factor 3,
# min.insync.replicas 2) for the topics tests create and Kafka's own; a follower out of the ISR after 5 s instead of
# 30 s, so a stopped follower shows within a test's time; no automatic preferred-leader election (a test elects).
REPLICATED: dict[str, str] = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    "replica.lag.time.max.ms": "5000",
    "auto.leader.rebalance.enable": "false",
}


def tiered_settings(remote_dir: Path, bootstrap_listener: str = "PLAINTEXT") -> dict[str, str]:
    """Tiered storage (KIP-405) on a test broker: Kafka's own LocalTieredStorage (kafka-storage's test jar, on the
    broker's class path through local/jvm/pom.xml) keeps the remote tier in `remote_dir`; the remote log metadata
    topic is Kafka's default (TopicBasedRemoteLogMetadataManager), on one replica. Segments are copied and the local
    tier trimmed every second, not every 30 s."""
    return {
        "remote.log.storage.system.enable": "true",
        "remote.log.storage.manager.class.name": "org.apache.kafka.server.log.remote.storage.LocalTieredStorage",
        "remote.log.storage.manager.impl.prefix": "rsm.config.",
        "rsm.config.dir": str(remote_dir),
        "remote.log.metadata.manager.impl.prefix": "rlmm.config.",
        "remote.log.metadata.manager.listener.name": bootstrap_listener,
        "rlmm.config.remote.log.metadata.topic.replication.factor": "1",
        "rlmm.config.remote.log.metadata.topic.num.partitions": "1",
        "remote.log.manager.task.interval.ms": "1000",
    }


HEAP = "512m"
ADMIN_PASSWORD = "admin-secret"  # the super user of a broker started with `users` (tests only, loopback)
# A test broker's JVM: the serial collector and the client compiler only. On 2 cores shared with Spark they cost less
# CPU than G1 and the tiered JIT (measured: start 2.9 -> 1.7 CPU-s, idle 3.8% -> 2.5% of a core, RSS 241 -> 216 MB);
# a broker's peak throughput is not what these brokers are for. COMPACTD_KAFKA_JVM_OPTIONS replaces them.
JVM_OPTIONS = tuple(os.environ.get("COMPACTD_KAFKA_JVM_OPTIONS", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1").split())
# What Apache Kafka's own start script gives a broker (kafka-run-class.sh's KAFKA_JVM_PERFORMANCE_OPTS, and
# KAFKA_HEAP_OPTS' 1 GiB): the yardstick a benchmark measures Kafka's own work by (bench/compaction.py, the cleaner)
KAFKA_SCRIPT_JVM_OPTIONS = (
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
)
KAFKA_SCRIPT_HEAP = "1g"
READY_TIMEOUT_S = 60.0


def _pom(name: str = "pom.xml") -> Path:
    return Path(str(resources.files("compactd.local.jvm").joinpath(name)))


@dataclass(frozen=True)
class KafkaLine:
    """A line of Apache Kafka releases the test broker runs: one pom in `jvm/`, pinning its version."""

    pom: str

    @property
    def version(self) -> str:
        """The version the pom pins (its `kafka.version` property)."""
        return pom_property(_pom(self.pom), "kafka.version")

    @property
    def release(self) -> tuple[int, int]:
        major, minor = self.version.split(".")[:2]
        return int(major), int(minor)

    @property
    def has_zookeeper(self) -> bool:
        return self.release < (4, 0)

    @property
    def log4j1(self) -> bool:
        """Kafka before 4.0 logs through log4j 1 (`jvm/log4j.properties`), 4.x through log4j2 (`jvm/log4j2.xml`)."""
        return self.release < (4, 0)

    @property
    def initial_task_delay(self) -> bool:
        """Whether `log.initial.task.delay.ms` exists (3.9 on): before it, retention, log-start checkpoints and
        deleted logs' removal start 30 s after the broker."""
        return self.release >= (3, 9)

    def jars(self, quiet: bool = False) -> Path:
        """The line's jars (compactd/maven.py), fetched once."""
        return maven.ensure_jars(_pom(self.pom), "kafka", self.version, f"Apache Kafka {self.version}", quiet=quiet)


DEFAULT_LINE = KafkaLine("pom.xml")
OLDER_LINES = {"3.9": KafkaLine("pom-3.9.xml"), "3.6": KafkaLine("pom-3.6.xml"), "2.8": KafkaLine("pom-2.8.xml")}
MODES = ("kraft", "zk")


def kafka_line(version: str | None = None) -> KafkaLine:
    """The line for `version` ("3.9" or its pinned "3.9.1"; COMPACTD_KAFKA_VERSION when None; the default line, 4.x,
    when that is unset too)."""
    version = version if version is not None else os.environ.get("COMPACTD_KAFKA_VERSION", "")
    if not version or version in (DEFAULT_LINE.version, ".".join(DEFAULT_LINE.version.split(".")[:2]), "4"):
        return DEFAULT_LINE
    line = OLDER_LINES.get(".".join(version.split(".")[:2]))
    if line is None or (version.count(".") == 2 and version != line.version):
        pinned = ", ".join([DEFAULT_LINE.version, *(ln.version for ln in OLDER_LINES.values())])
        raise CompactdError(f"no test broker for Apache Kafka {version}: COMPACTD_KAFKA_VERSION is one of {pinned}")
    return line


def kafka_mode(line: KafkaLine, mode: str | None = None) -> str:
    """ "kraft" or "zk" (COMPACTD_KAFKA_MODE when None, "kraft" when that is unset), checked against the line."""
    mode = (mode if mode is not None else os.environ.get("COMPACTD_KAFKA_MODE", "")) or "kraft"
    if mode not in MODES:
        raise CompactdError(f"COMPACTD_KAFKA_MODE is kraft or zk, not {mode!r}")
    if mode == "zk" and not line.has_zookeeper:
        raise CompactdError(f"Apache Kafka {line.version} has no ZooKeeper mode: COMPACTD_KAFKA_MODE=kraft")
    if mode == "kraft" and line.release < (3, 0):
        raise CompactdError(f"Apache Kafka {line.version}'s KRaft mode was an early access (no transactions, ACLs "
                            "or partition additions): COMPACTD_KAFKA_MODE=zk")  # fmt: skip
    return mode


def kafka_version() -> str:
    """The Apache Kafka version of the default line (4.x: what the suite, the demo and the benchmarks run)."""
    return DEFAULT_LINE.version


def kafka_jars(quiet: bool = False) -> Path:
    """The default line's jars: the brokers' and the Java clients' the tests run (a Kafka Streams application, a
    consumer of a KIP-848 group), whatever line the broker under test is."""
    return DEFAULT_LINE.jars(quiet)


def _java(jars: Path, heap: str, jvm_options: tuple[str, ...], logs: Path, log4j1: bool, main: str,
          *args: str) -> list[str]:  # fmt: skip
    """A JVM on Kafka's jars that logs to `logs`/server.log only."""
    java = shutil.which("java")
    if java is None:
        raise CompactdError("java not found: Apache Kafka needs Java 17 (apt-get install openjdk-17-jre-headless)")
    if log4j1:
        logging_conf = (
            f"-Dlog4j.configuration=file:{resources.files('compactd.local.jvm').joinpath('log4j.properties')}"
        )
    else:
        logging_conf = f"-Dlog4j2.configurationFile={resources.files('compactd.local.jvm').joinpath('log4j2.xml')}"
    return [java, f"-Xmx{heap}", f"-Xms{heap}", *jvm_options, "-Djava.awt.headless=true", logging_conf,
            f"-Dkafka.logs.dir={logs}", "-cp", f"{jars}/*", main, *args]  # fmt: skip


def _end(proc: subprocess.Popen | None, sig: signal.Signals, timeout: float) -> bool:
    """Send `sig` to the process's group and wait for it; kill -9 what is still up after `timeout`. Returns whether
    the process died of a kill -9 (asked for, or forced)."""
    if proc is None or proc.poll() is not None:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    return proc.returncode == -signal.SIGKILL


class _Process:
    """A JVM this module started, in a process group of its own."""

    proc: subprocess.Popen | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


# ZooKeeper's session for a test broker: a broker killed with -9 holds its registration (/brokers/ids/N) until its
# session expires, and a new process for the same id refuses to start before that (18 s by default)
ZK_SESSION_MS = 4000


class ZooKeeper(_Process):
    """A standalone ZooKeeper for brokers in ZooKeeper mode (Kafka before 4.0), on 127.0.0.1, from the jars Kafka's
    line brings (what Kafka's own zookeeper-server-start.sh runs). Its ticks are 0.5 s, so sessions of 1 to 10 s are
    allowed (ZK_SESSION_MS). Started by the constructor; `stop()` and `start()` keep its data."""

    name = "zookeeper"

    def __init__(self, workdir: Path, jars: Path, log4j1: bool = True, jvm_options: tuple[str, ...] = ()) -> None:
        self.workdir = workdir
        self.jars = jars
        self.log4j1 = log4j1
        self.jvm_options = jvm_options or JVM_OPTIONS
        self.port = _free_port()
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "zoo.cfg"
        conf = {
            "dataDir": workdir / "data",
            "clientPort": self.port,
            "clientPortAddress": "127.0.0.1",
            "maxClientCnxns": 0,
            "admin.enableServer": "false",
            "tickTime": 500,
            "4lw.commands.whitelist": "srvr",
        }
        self.config.write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def connect(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        from compactd.local.servers import wait_port

        if self.running:
            return
        argv = _java(self.jars, "128m", self.jvm_options, self.logs, self.log4j1,
                     "org.apache.zookeeper.server.ZooKeeperServerMain", str(self.config))  # fmt: skip
        with open(self.logs / "stdout.log", "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        wait_port(self.port, self.proc, "zookeeper", READY_TIMEOUT_S)

    def stop(self) -> None:
        _end(self.proc, signal.SIGTERM, 10)

    def kill(self) -> None:
        _end(self.proc, signal.SIGKILL, 10)


def _free_port() -> int:
    from compactd.local.servers import free_port

    return free_port()


@dataclass(frozen=True)
class Quorum:
    """The KRaft controllers every node of one cluster names (`controller.quorum.voters`), and the cluster's ID its
    log dirs are formatted with."""

    cluster_id: str
    voters: Mapping[int, int]  # node id -> controller port

    @classmethod
    def of(cls, nodes: int) -> Quorum:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode()[:22]
        return cls(cluster_id, {n: _free_port() for n in range(1, nodes + 1)})

    def voters_config(self) -> str:
        return ",".join(f"{n}@127.0.0.1:{port}" for n, port in sorted(self.voters.items()))


class KafkaBroker(_Process):
    """One Apache Kafka process (broker and controller in one, KRaft; or a broker on its ZooKeeper, `mode` "zk") on
    127.0.0.1, its data under `workdir`.

    Started by the constructor and ready when it returns: a metadata request has answered with this broker in it.
    `stop()` is a clean shutdown (SIGTERM, then SIGKILL after 30 s), `kill()` is kill -9, `restart()` starts it again
    on the same log dir and ports.

    `users` (name -> password): the client listener is SASL_PLAINTEXT with SASL/PLAIN and the broker enforces ACLs
    (KRaft's StandardAuthorizer, nothing allowed without an ACL). `admin` (ADMIN_PASSWORD) is a super user, and so is
    ANONYMOUS, which is how the controller listener (plaintext, loopback) authenticates the node to itself. Clients
    connect with `client(user)`. In ZooKeeper mode the authorizer is AclAuthorizer, ZooKeeper's.

    `line` and `mode` (`kafka_line()`, `kafka_mode()`: the environment's, 4.x in KRaft mode by default): the version
    line and mode. A broker in ZooKeeper mode starts its own ZooKeeper beside it (stopped with it) unless it is given
    one (`zookeeper`, a cluster's)."""

    name = "kafka"

    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        extra: Mapping[str, str] | None = None,
        users: Mapping[str, str] | None = None,
        node_id: int = 1,
        quorum: Quorum | None = None,
        start: bool = True,
        jvm_options: tuple[str, ...] = JVM_OPTIONS,
        heap: str = HEAP,
        line: KafkaLine | None = None,
        mode: str | None = None,
        zookeeper: ZooKeeper | None = None,
    ) -> None:
        """`node_id` and `quorum`: this node's place in a cluster of several (KafkaCluster); alone by default.
        `start` False: the process starts with `launch()` and is ready after `wait_ready()` (a cluster starts every
        node first, since none is ready before a majority of the quorum runs). `jvm_options` and `heap`: the
        broker's JVM (KAFKA_SCRIPT_JVM_OPTIONS and KAFKA_SCRIPT_HEAP: as Kafka's own start script runs it)."""
        self.jvm_options = jvm_options
        self.heap = heap
        self.workdir = workdir
        self.users = None if users is None else {"admin": ADMIN_PASSWORD, **users}
        self.port = port or _free_port()
        self.node_id = node_id
        self.quorum = quorum or Quorum.of(1)
        self.controller_port = self.quorum.voters[node_id]
        self.log_dir = workdir / "data"
        self.logs = workdir / "logs"
        self.log = self.logs / "server.log"
        self.line = line or kafka_line()
        self.mode = kafka_mode(self.line, mode)
        self.jars = self.line.jars()
        self._extra = dict(extra or {})
        workdir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self._owns_zookeeper = self.mode == "zk" and zookeeper is None
        self.zookeeper = zookeeper
        if self._owns_zookeeper:
            self.zookeeper = ZooKeeper(workdir / "zookeeper", self.jars, self.line.log4j1, jvm_options)
        self._killed_at: float | None = None
        self._write_config()
        if self.mode == "kraft" and not (self.log_dir / "meta.properties").exists():
            self._format()
        self.proc: subprocess.Popen | None = None
        if start:
            self.start()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _write_config(self) -> None:
        if self.mode == "zk":
            assert self.zookeeper is not None
            # no process.roles, node.id or controller listener: a line before 4.0 refuses them in ZooKeeper mode
            node = {"broker.id": str(self.node_id), "zookeeper.connect": self.zookeeper.connect,
                    "zookeeper.session.timeout.ms": str(ZK_SESSION_MS), "listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
                    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT"}  # fmt: skip
        else:
            node = {
                "process.roles": "broker,controller",
                "node.id": str(self.node_id),
                "controller.quorum.voters": self.quorum.voters_config(),
                "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
                "controller.listener.names": "CONTROLLER",
                "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            }
        props = {
            **node,
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.log_dir),
            **TEST_SETTINGS,
            **(self._sasl() if self.users is not None else {}),
            **self._extra,
        }
        self.config = self.workdir / "server.properties"
        self.config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))

    def _sasl(self) -> dict[str, str]:
        """The client listener as SASL_PLAINTEXT/PLAIN with these users, and ACLs enforced."""
        assert self.users is not None
        users = " ".join(f'user_{u}="{p}"' for u, p in self.users.items())
        jaas = (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="admin" password="{ADMIN_PASSWORD}" {users};'
        )
        zk = self.mode == "zk"
        controller = "" if zk else f",CONTROLLER://127.0.0.1:{self.controller_port}"
        return {
            "listeners": f"SASL_PLAINTEXT://127.0.0.1:{self.port}{controller}",
            "advertised.listeners": f"SASL_PLAINTEXT://127.0.0.1:{self.port}",
            "inter.broker.listener.name": "SASL_PLAINTEXT",
            "listener.security.protocol.map": ("" if zk else "CONTROLLER:PLAINTEXT,") + "SASL_PLAINTEXT:SASL_PLAINTEXT",
            "sasl.enabled.mechanisms": "PLAIN",
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas,
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer"
            if zk
            else "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:admin;User:ANONYMOUS",
            "allow.everyone.if.no.acl.found": "false",
        }

    def client(self, user: str = "admin") -> dict[str, str]:
        """librdkafka settings that reach this broker as `user` (no credentials on a plaintext broker)."""
        conf = {"bootstrap.servers": self.bootstrap}
        if self.users is not None:
            conf.update({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                         "sasl.username": user, "sasl.password": self.users[user]})  # fmt: skip
        return conf

    def _java(self, main: str, *args: str, heap: str | None = None) -> list[str]:
        return _java(self.jars, heap or self.heap, self.jvm_options, self.logs, self.line.log4j1, main, *args)

    def _format(self) -> None:
        cluster_id = self.quorum.cluster_id  # may start with "-": one argument
        argv = self._java(
            "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", "-c", str(self.config), heap="64m"
        )
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompactdError(f"formatting Kafka's log dir {self.log_dir} failed: {proc.stderr.strip()[-300:]}")

    def start(self) -> None:
        if self.running:
            return
        self.launch()
        try:
            self.wait_ready()
        except BaseException:
            self.kill()
            raise

    def launch(self) -> None:
        """The process started, not yet ready. In ZooKeeper mode its ZooKeeper first, and after a kill -9 the old
        process's session expired (its registration is gone: a new one would be refused)."""
        if self.running:
            return
        if self.zookeeper is not None:
            if self._owns_zookeeper:
                self.zookeeper.start()
            if self._killed_at is not None:
                time.sleep(max(0.0, self._killed_at + ZK_SESSION_MS / 1000 + 1 - time.monotonic()))
        self._killed_at = None
        with open(self.logs / "stdout.log", "ab") as out:
            self.proc = subprocess.Popen(
                self._java("kafka.Kafka", str(self.config)),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started_at = time.monotonic()

    def wait_ready(self, brokers: int = 1) -> None:
        """Ready = a metadata request to this node answers with this node and `brokers` brokers in all, a controller,
        and every partition led (the port alone opens before the broker is unfenced and may refuse to create topics;
        after a crash, partitions are led only once their logs are recovered)."""
        from compactd.kafka.config import new_admin
        from compactd.local.servers import wait_port

        assert self.proc is not None
        wait_port(self.port, self.proc, "kafka", READY_TIMEOUT_S)
        probe = new_admin({**self.client(), "log_level": 0, "logger": _SILENT})  # this node's address only
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise CompactdError(f"kafka exited with {self.proc.returncode} while starting; see {self.log}")
            with contextlib.suppress(Exception):
                md = probe.list_topics(timeout=2)
                led = all(p.leader >= 0 and p.error is None for t in md.topics.values() for p in t.partitions.values())
                if self.node_id in md.brokers and len(md.brokers) >= brokers and md.controller_id >= 0 and led:
                    return
            if time.monotonic() > deadline:
                raise CompactdError(f"kafka did not become ready within {READY_TIMEOUT_S:.0f}s; see {self.log}")
            time.sleep(0.1)

    def stop(self, timeout: float = 30.0) -> None:
        """A clean shutdown: SIGTERM (Kafka's controlled shutdown, its logs flushed and closed), kill -9 if it hangs;
        then the broker's own ZooKeeper."""
        self._stop(timeout)
        if self._owns_zookeeper and self.zookeeper is not None:
            self.zookeeper.stop()

    def _stop(self, timeout: float) -> None:
        if _end(self.proc, signal.SIGTERM, timeout):  # it hung and was killed: its session outlives it
            self._killed_at = time.monotonic()

    def kill(self) -> None:
        """kill -9: the log dir is left as a crash leaves it (recovered on the next start). Its ZooKeeper runs on."""
        if _end(self.proc, signal.SIGKILL, 10):
            self._killed_at = time.monotonic()

    def close(self) -> None:
        """kill -9 the broker and its own ZooKeeper (a teardown after a failure)."""
        self.kill()
        if self._owns_zookeeper and self.zookeeper is not None:
            self.zookeeper.kill()

    def restart(self) -> None:
        self._stop(30.0)
        self.start()

    def rss_bytes(self) -> int:
        """The broker's resident memory, from /proc."""
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0


class KafkaCluster:
    """Several Apache Kafka nodes (each broker and controller, KRaft) that form one cluster on 127.0.0.1, with
    REPLICATED's defaults: replication factor 3 and min ISR 2 for every topic, Kafka's own included.

    Started by the constructor and ready when it returns: every node's metadata lists every broker. Each node is a
    `KafkaBroker` (`nodes[i]`, node id i + 1) that stops, is killed or restarts on its own; `node(id)` finds one by
    its node id, as Metadata names leaders."""

    name = "kafka"

    def __init__(self, workdir: Path, nodes: int = 3, extra: Mapping[str, str] | None = None,
                 line: KafkaLine | None = None, mode: str | None = None) -> None:  # fmt: skip
        """`line` and `mode`: as KafkaBroker's; in ZooKeeper mode one ZooKeeper serves every node."""
        self.workdir = workdir
        self.quorum = Quorum.of(nodes)
        self.line = line or kafka_line()
        self.mode = kafka_mode(self.line, mode)
        self.zookeeper = (
            ZooKeeper(workdir / "zookeeper", self.line.jars(), self.line.log4j1) if self.mode == "zk" else None
        )
        settings = {**REPLICATED, **(extra or {})}
        self.nodes = [
            KafkaBroker(
                workdir / f"node{n}",
                extra=settings,
                node_id=n,
                quorum=self.quorum,
                start=False,
                line=self.line,
                mode=self.mode,
                zookeeper=self.zookeeper,
            )
            for n in range(1, nodes + 1)
        ]
        try:
            for node in self.nodes:  # none is ready before a majority of the quorum runs
                node.launch()
            for node in self.nodes:
                node.wait_ready(brokers=nodes)
        except BaseException:
            self.kill()
            raise

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    def node(self, node_id: int) -> KafkaBroker:
        return next(n for n in self.nodes if n.node_id == node_id)

    def stop(self, timeout: float = 30.0) -> None:
        """Every node's controlled shutdown at once, then kill -9 what is still up after `timeout`. One at a time,
        the last node waits out its controlled shutdown with no quorum left to answer it (32 s of a 3-node stop)."""
        live = [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]
        for node in live:
            assert node.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.proc.pid, signal.SIGCONT)  # a node a test left stopped must run to stop
                os.killpg(node.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for node in live:
            assert node.proc is not None
            try:
                node.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.kill()
        if self.zookeeper is not None:
            self.zookeeper.stop()

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()
        if self.zookeeper is not None:
            self.zookeeper.kill()


# librdkafka's logger for the readiness probe: a broker still starting is expected, not news
_SILENT = logging.getLogger("compactd.broker.probe")
_SILENT.addHandler(logging.NullHandler())
_SILENT.propagate = False


def kafka_broker(workdir: Path, port: int | None = None, **kwargs) -> KafkaBroker:
    return KafkaBroker(workdir, port=port, **kwargs)


if __name__ == "__main__":  # `python -m compactd.local.broker --fetch`: what `make deps` runs
    import argparse

    parser = argparse.ArgumentParser(description="Apache Kafka's jars for compactd's test and demo broker")
    parser.add_argument("--fetch", action="store_true", help="fetch the jars into the cache if they are not there")
    if parser.parse_args().fetch:
        try:
            kafka_jars()
        except CompactdError as exc:
            print(f"compactd: {exc}", file=sys.stderr)
            raise SystemExit(1) from None
