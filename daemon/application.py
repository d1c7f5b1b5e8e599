"""The application: wires Redis, Kafka clients, sinks, the controller and the Spark job (the delete gate and the
state's rebuild are in daemon/gate.py, the stream, its batches and the stops in daemon/run_loop.py).

Constructors only configure; `start()` checks Redis and Kafka (bounded, a few seconds each), then starts each
component in order, and on a failed start closes the ones already started, in reverse. `close()` stops the query
between batches and closes everything in reverse order; it is safe to call more than once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from compactd.clock import now_ms
from compactd.compaction.service import Compactor, ServiceParts
from compactd.compaction.takeover import Takeovers
from compactd.compaction.trigger import POOL, CompactionTrigger
from compactd.compaction.view_caps import ViewCaps
from compactd.control.agent_watch import AgentWatch
from compactd.control.controller import Controller, Probe, _no_probe
from compactd.control.health import StateGuard
from compactd.control.metrics import Metrics, default_metrics
from compactd.control.readers import PublishReaders, Readers
from compactd.control.runtime_config import RuntimeConfig
from compactd.daemon.gate import DeleteGate
from compactd.daemon.run_loop import KAFKA_DOWN, KAFKA_RETRY_MAX_S, RunLoop, RunSummary
from compactd.errors import ConfigError, DependencyUnavailable, ForcedStop, forced_by
from compactd.kafka.admin import check_reachable, ensure_topics
from compactd.kafka.groups import ClusterGroupOffsets, require_every_group
from compactd.kafka.share_state import ShareStateTail
from compactd.kafka.topics import ClusterTopics
from compactd.model import ActionRecord
from compactd.policy.readiness import Readiness
from compactd.policy.thresholds import without_nudges
from compactd.settings import Settings
from compactd.sinks.audit import AuditLog
from compactd.sinks.base import ActionSink
from compactd.sinks.dlq import DeadLetters
from compactd.sinks.kafka_admin import KafkaAdminSink
from compactd.sinks.nudge_ledger import LifecycleRecords, NudgeLedger
from compactd.state.outage import Outage, RedisOutage
from compactd.state.redis_store import RedisState
from compactd.streaming.checkpoint import PlannedOffsets, stream_id_for
from compactd.streaming.decode import Decoder
from compactd.streaming.job import StreamingJob

log = logging.getLogger("compactd.job")

CHECK_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class JobOverlay:
    """What the job applies over the configured thresholds (`RuntimeConfig.effective`): the retention takeovers'
    forced retention, and no nudges where the cleaner cannot be seen (`compactd explain` shows
    `cleaner_not_visible`)."""

    takeovers: Takeovers
    cleaner_visible: bool

    def __call__(self, layers: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        layers = self.takeovers.overlay(layers)
        return layers if self.cleaner_visible else without_nudges(layers)


@dataclass(frozen=True)
class RetentionMoved:
    """A retention takeover began or ended (`CompactionTrigger`): the topic's forced retention changed, so the
    controller takes the layers again and decides the topic's partitions under them."""

    controller: Controller
    config: RuntimeConfig
    state: RedisState

    def __call__(self, topic: str) -> None:
        self.controller.set_layers(self.config.effective())
        self.controller.evaluate([(topic, p) for p in self.state.partitions(topic)], "compaction")


class Application(DeleteGate, RunLoop):
    """The composition root: every object of the running job is built here, each given its collaborators through
    its constructor, in the order they depend on one another (state and sinks, the readers, the compaction service's
    parts and the controller that reads their caps, the runtime config over the controller, the compaction service
    and its trigger over the config). Nothing is patched after it is built. Its two mixins hold the delete gate and
    the run loop; each declares what it borrows from here."""

    def __init__(
        self,
        settings: Settings,
        spark: SparkSession | None = None,
        metrics: Metrics | None = None,
        sink: ActionSink | None = None,
        clock: Callable[[], int] = now_ms,
        probe: Probe = _no_probe,
        verbose: bool = False,
    ) -> None:
        self.settings = settings
        self.spark = spark
        self.verbose = verbose
        # `metrics` given (tests, several jobs in one process): its own top_n, as its maker chose
        self.metrics = metrics or default_metrics(settings.cluster, settings.metrics.top_n)
        conn = settings.kafka_connection()
        self.conn = conn
        self.state = settings.redis_state(timeout_s=CHECK_TIMEOUT_S)
        self.audit = AuditLog(conn, settings.topics.actions, cluster=settings.cluster)
        self.dlq = DeadLetters(conn, settings.topics.dlq, cluster=settings.cluster)
        self.ledger = NudgeLedger(conn, settings.topics.nudges)
        self.sink: ActionSink = sink or KafkaAdminSink(conn, self.state, ledger=self.ledger, clock=clock)
        self.readiness = Readiness(None)  # the delete gate's (daemon/gate.py): closed until `_arm_readiness`
        self.guard = StateGuard(self.state, settings.checkpoint_dir, self.spark_checkpoint)
        self.outage = RedisOutage(settings.redis_retry_max_ms / 1000, self._redis_down)
        self.kafka_outage = Outage("Kafka", KAFKA_DOWN, KAFKA_RETRY_MAX_S, down="unavailable")
        self.lost: str | None = None  # why Redis is not the state the checkpoint assumes, until the rebuild starts
        self.rebuilding = False
        ttl_s = settings.cluster_offsets_ttl_ms / 1000
        checking = settings.cluster_offsets_check and settings.cluster_check != "off"
        self.group_offsets = (
            ClusterGroupOffsets(conn, ttl_s, holders=self.state.groups, every_group=settings.offsets_source == "admin")
            if checking
            else None
        )
        self.cluster_topics = ClusterTopics(conn)
        # readers that commit no group offsets: share groups, declared Spark checkpoints and pins
        self.readers = Readers(
            ShareStateTail(conn, timeout_s=CHECK_TIMEOUT_S),
            clock=clock,
            publish=PublishReaders(self.metrics, self.state.save_readers),
            topics=ClusterTopics(conn, timeout_s=CHECK_TIMEOUT_S),  # its own: the refresher reads on its own thread
            published=self.state.readers,
        )
        # the compaction service's views cap the source's deletes: data the trigger writes and the controller reads
        parts = ServiceParts.of(settings, self.state.r)
        view_caps = ViewCaps(parts.state, parts.log)
        self.controller = Controller(
            self.state,
            settings.thresholds,
            self.sink,
            self.audit,
            self.metrics,
            clock=clock,
            deletes_allowed=self.deletes_allowed,
            probe=probe,
            own_topics=frozenset(settings.own_topics()),
            cluster_offsets=None if self.group_offsets is None else self.group_offsets.check,
            topics=self.cluster_topics,
            strict_groups=settings.strict_groups,
            records=LifecycleRecords(self.ledger, PlannedOffsets(self.spark_checkpoint)),
            view_caps=view_caps,
            readers=self.readers,
        )
        # offsets_source admin: the Admin API cannot see the broker's cleaner, so no nudge is ever decided there
        self.agent_watch = (
            AgentWatch(conn, settings.topics.agent, settings.cluster) if settings.offsets_source == "admin" else None
        )
        takeovers = Takeovers(parts.cluster, self.ledger, clock)
        self.config = RuntimeConfig(
            self.state, settings.thresholds, settings.secrets(), self.controller, self.metrics,
            overlay=JobOverlay(takeovers, cleaner_visible=self.agent_watch is None),
        )  # fmt: skip
        compactor = Compactor(settings, self.state.r, self.config.effective, self._compaction_spark, clock, parts)
        self.compaction = CompactionTrigger(
            compactor,
            self.metrics,
            self.config.effective,
            self.state.topics,
            self._audit_run,
            clock,
            check_every_s=settings.compaction_check_interval_ms / 1000,
            takeovers=takeovers,
            takeover_moved=RetentionMoved(self.controller, self.config, self.state),
            caps=view_caps,
            segments_known=self.state.segments_known,
        )
        self.decoder = Decoder(
            settings.topics.segments,
            settings.topics.commits,
            settings.max_event_bytes,
            settings.topics.consumer_offsets,
            settings.topics.config,
        )
        self.stream_id = ""
        self.job: StreamingJob | None = None
        self.summary = RunSummary()
        self._closers: list[Callable[[], None]] = []
        self._last_log = time.monotonic()
        self._idle_batches = 0
        self._admin: Any = None
        self._kafka_options: dict[str, str] | None = None  # Spark's Kafka connector's (streaming/connector.py)
        self.forced = False  # a second signal: leave without waiting for the running batch
        self._stop: object = None  # the event `run` stops on (the CLI's StopEvent records a second signal)
        self._sampled_at = 0.0
        self._topics_checked_at = 0.0
        self._agent_checked_at = 0.0
        self._segments_seen = False  # a segment event merged into this state (health `segments_at`)
        self._sources_said = False

    def _compaction_spark(self) -> SparkSession:
        """A session of its own for a compaction run, next to the stream's, in a fair-scheduler pool of its own:
        the stream's micro-batches keep their share of the executors while a run works (called in the run's
        thread: the pool is a thread-local property)."""
        if self.spark is None:
            from compactd.streaming.session import spark_session

            self.spark = spark_session(self.settings.spark_master, verbose=self.verbose)
            self._closers.append(self._stop_spark)
        session = self.spark.newSession()
        session.sparkContext.setLocalProperty("spark.scheduler.pool", POOL)
        return session

    def _audit_run(self, rec: ActionRecord) -> None:
        """A compaction run's action record, audited like the outbox's (under the controller's lock: one writer)."""
        with self.controller.lock:
            self.audit.publish(rec)
            self.audit.flush()

    @property
    def spark_checkpoint(self) -> Path:
        return Path(self.settings.checkpoint_dir) / "spark"

    # ---- start, in order ----

    def check_dependencies(self) -> None:
        """Redis and Kafka answer, within a few seconds each; both are checked so both problems show at once."""
        problems: list[DependencyUnavailable] = []
        try:
            self.state.start()
        except DependencyUnavailable as exc:
            problems.append(exc)
        try:
            check_reachable(self.conn, CHECK_TIMEOUT_S)
        except DependencyUnavailable as exc:
            problems.append(exc)
        if len(problems) == 1:
            raise problems[0]
        if problems:
            raise DependencyUnavailable(
                " and ".join(p.component for p in problems),
                ", ".join(p.address for p in problems),
                " and ".join(p.setting for p in problems),
                "; ".join(f"{p.component}: {p.cause}" for p in problems),
            )

    def start(self, once: bool = False) -> None:
        if once:  # the run ends by evaluating what its batches did not (`Controller.evaluate_rest`)
            self.controller.track_evaluated()
        try:
            self.check_dependencies()
            if self.settings.offsets_source == "admin":  # the listing is all it knows of groups: it must be whole
                require_every_group(self.conn, CHECK_TIMEOUT_S)
            self._closers.append(self.state.close)
            self._closers.append(self.controller.io.close)  # its Redis thread, before the client closes
            # only now, with both dependencies answering, does anything touch the checkpoint directory
            self.stream_id = stream_id_for(self.settings.checkpoint_dir)
            lost = self.guard.loss_at_start(self.stream_id)
            if lost is not None:
                self._begin_rebuild(lost)  # loads the config layers that are left: none
            else:
                self.config.load()  # config events applied by earlier runs override the file's thresholds
            self._serve_metrics()
            self.metrics.init_source_topics(self.settings.source_topics())  # lag series scraped from the start
            self.metrics.redis_up.set(1)
            self.metrics.trigger_interval.set(self.settings.trigger_interval_ms / 1000)
            if self.settings.create_topics:
                ensure_topics(
                    self.conn,
                    self.settings.own_topics(),
                    configs=self.settings.own_topic_configs(),
                    replication_factor=self.settings.topics_replication_factor,
                )
            for component in (self.dlq, self.audit, self.sink):
                component.start()
                self._closers.append(component.close)
            if self.group_offsets is not None:
                self._closers.append(self.group_offsets.close)
            self._closers.append(self.cluster_topics.close)
            self._closers.append(self.readers.close)
            self._closers.append(self.compaction.compactor.close)  # the manifest topic's reader
            if self.state.readers() is not None:
                self.readers.republish()
            self.readers.start()
            self._recover_nudges()
            self._arm_readiness()
            if once and self._nothing_to_read():
                log.info(
                    "nothing new on %s since the last run: Spark not started", ", ".join(self.settings.source_topics())
                )
                return
            self._start_stream(once, starting_offsets="earliest" if self.rebuilding else None)
        except BaseException:
            self.close()
            raise

    def _serve_metrics(self) -> None:
        try:
            self.metrics.serve(self.settings.metrics_port)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on port {self.settings.metrics_port} ({exc.strerror}); "
                "check --metrics-port / metrics_port"
            ) from None

    # ---- stop, in reverse ----

    def close(self) -> None:
        self.compaction.stopping.set()
        errors: list[str] = []
        forced: ForcedStop | None = None
        while self._closers:
            closer = self._closers.pop()
            try:
                closer()
            except ForcedStop as exc:  # a second signal while closing: close the rest at once, then leave with it
                self.forced = True
                forced = exc
            except Exception as exc:  # keep closing the rest; report the first problem
                if (by_signal := forced_by(self._stop)) is not None:  # the second signal, wrapped by Py4J
                    self.forced, forced = True, by_signal
                else:
                    errors.append(f"{type(exc).__name__}: {exc}")
        if errors:
            log.warning("while stopping: %s", "; ".join(errors))
        if forced is not None:
            raise forced

    def __enter__(self) -> Application:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
