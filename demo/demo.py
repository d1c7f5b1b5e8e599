"""`compactd demo`: Apache Kafka (one KRaft node, jars from the project's Maven cache), Redis, producers and real
consumer groups, the segment agent on the broker's live log dir, and the job. Nothing is simulated:

- `orders` (compacted): a table of customers written once, then a few of them updated every second. Kafka's cleaner
  cleans the first segments by itself (nothing is clean yet, so the dirty ratio is 1), after which the updates stay
  far below `min.cleanable.dirty.ratio`: Kafka alone would leave them for hours. compactd's `max.compaction.lag.ms`
  (12 s) makes them due; the job nudges the topic (its `max.compaction.lag.ms` set to 1), Kafka's cleaner answers,
  the agent sees the cleaner checkpoint advance, and the job puts the topic's config back.
- `clicks` (delete policy): a stream read by two real consumer groups that commit to `__consumer_offsets`, which
  the job reads (the default offsets source): `billing` (the consumer protocol of KIP-848) keeps up, `analytics` (a
  classic group) reads more slowly. Consumed retention deletes what both have read; the broker's log start moves.
- `accounts` (delete policy): the same kind of table, compacted by compactd's own service, never by Kafka's cleaner
  (a source the cleaner compacts is refused: it would remove records before compactd reads them): the job publishes
  generations of its compacted view `accounts.compacted`, and the screen shows the last one and a few of its keys.

On a terminal the screen is a live table; piped, the demo is an event log: each change once, the table of the demo's
topics at the end, and the job's own log (librdkafka's lines with it) in a file it names first.

`--nodes 3` (`make demo CLUSTER=3`): three KRaft nodes, replication factor 3 and `min.insync.replicas` 2, one agent
per node publishing only the partitions its node leads. Once both loops have closed, the node leading most demo
partitions is killed with -9 and started again 20 s later: leadership moves, the other nodes' agents take over, and
both loops close again after the restart.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from confluent_kafka.admin import ConfigResource, NewTopic

from compactd.agent.agent import Event, KafkaPublisher, SegmentAgent
from compactd.app.status import print_table, rich_table, status_rows
from compactd.clock import now_ms
from compactd.kafka.admin import admin_client, ensure_topics
from compactd.kafka.config import KafkaConnection, new_consumer, new_producer
from compactd.local.broker import KafkaBroker, KafkaCluster, kafka_broker
from compactd.local.servers import Service, free_port, prometheus_server, redis_server
from compactd.settings import Settings

PARTITIONS = 2
ROLL_MS = 4_000  # segment.ms of both topics: a segment closes on the first append 4 s after it opened
CUSTOMERS = 500  # keys of the `orders` and `accounts` tables a partition, written once at the start
UPDATES_PER_S = 5  # keys of each table updated per partition every second
HOT = 40  # the customers a partition whose records the updates rewrite
CLICKS_PER_S = 50  # `clicks` records per partition every second
ANALYTICS_PER_S = 35  # what the slower group reads per partition every second
DEMO_TOPICS = {
    "orders": {"cleanup.policy": "compact", "segment.ms": str(ROLL_MS), "min.cleanable.dirty.ratio": "0.5"},
    "clicks": {"cleanup.policy": "delete", "segment.ms": str(ROLL_MS)},
    "accounts": {"cleanup.policy": "delete", "segment.ms": str(ROLL_MS)},
}
TABLES = ("orders", "accounts")  # written alike: Kafka's cleaner compacts the first, compactd's service the second
NUDGED = "max.compaction.lag.ms"
DOWN_S = 20.0  # how long the killed node stays down (`--nodes 3`)


def customer(k: int) -> bytes:
    """Customer `k`'s key: a keyed producer puts each customer in one partition, as applications do."""
    return f"c{k:04d}".encode()


def demo_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The status rows of the demo's topics (compactd also tracks its own topics and `__consumer_offsets`)."""
    return [r for r in rows if str(r["partition"]).rsplit("/", 1)[0] in DEMO_TOPICS]


def log_to_file(path: Path) -> None:
    """The job's log (and librdkafka's lines through it) to `path` instead of the terminal: piped, the demo's output
    is its event log, one line per change on the cluster."""
    import logging

    root = logging.getLogger()
    for handler in list(root.handlers):
        if type(handler) is logging.StreamHandler:
            to_file = logging.FileHandler(path)
            to_file.setFormatter(handler.formatter)
            for f in handler.filters:
                to_file.addFilter(f)
            to_file.setLevel(handler.level)
            root.removeHandler(handler)
            root.addHandler(to_file)


def demo_settings(bootstrap: str, redis_url: str, checkpoint: Path) -> Settings:
    return Settings(
        bootstrap_servers=bootstrap,
        redis_url=redis_url,
        checkpoint_dir=str(checkpoint),
        trigger_interval_ms=1000,
        thresholds={
            "global": {"dry.run": False, "action.retry.ms": 15_000},
            "topic:orders": {"max.compaction.lag.ms": 12_000},
            "topic:accounts": {"max.compaction.lag.ms": 12_000, "compaction.service": True},
            "topic:clicks": {"consumed.retention.ms": 10_000, "forced.retention.ms": 60_000},
        },
    )


class EventLog:
    """What happened, once each, in order: the screen scrolls it above the table, a pipe gets it as it comes."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def append(self, line: str) -> None:
        with self._lock:
            self.lines.append(f"{time.strftime('%H:%M:%S')} {line}")

    def since(self, shown: int) -> list[str]:
        with self._lock:
            return self.lines[shown:]

    def text(self) -> str:
        with self._lock:
            return "\n".join(self.lines)


class AgentPublisher(KafkaPublisher):
    """The segment agent's publisher, telling the event log what Kafka did: the cleaner checkpoint advancing on a
    demo topic, and a log start moving (retention, or compactd's deleteRecords)."""

    def __init__(self, settings: Settings, log: EventLog) -> None:
        super().__init__(settings.kafka_connection(), settings.topics.segments)
        self.log = log

    def publish(self, events: list[Event]) -> None:
        super().publish(events)
        for ev in events:
            where = f"{ev['topic']}/{ev['partition']}"
            if ev["topic"] not in DEMO_TOPICS:
                continue
            if ev["type"] == "compacted":
                self.log.append(f"kafka: the cleaner compacted {where} up to {ev['cleaned_up_to']}")
            elif ev["type"] == "log_start" and ev["log_start_offset"] > 0:
                self.log.append(f"kafka: {where} log start moved to {ev['log_start_offset']}")


class DemoCluster:
    """Producers and consumer groups on the demo topics, the segment agent on the broker's log dir, and a watch on
    what compactd does: its action records, and the `orders` config its nudge changes."""

    def __init__(self, settings: Settings, nodes: list[KafkaBroker], log: EventLog) -> None:
        self.s = settings
        self.log = log
        conn = settings.kafka_connection()
        self.admin = admin_client(conn)
        self.producer = new_producer(conn.client("producer", {"linger.ms": 5}))
        self.replication = min(3, len(nodes))
        # one agent per node; on several, each publishes only what its node leads (agent/leaders.py)
        self.agents = [
            SegmentAgent.beside([n.log_dir], conn, n.node_id, timeout_s=5.0)
            if len(nodes) > 1
            else SegmentAgent([n.log_dir])
            for n in nodes
        ]
        self.publisher = AgentPublisher(settings, log)
        self.actions = new_consumer(
            conn.client(
                "consumer", forced={"group.id": f"demo-actions-{uuid.uuid4()}", "auto.offset.reset": "earliest"}
            )
        )
        self.groups = {
            "billing": new_consumer(
                conn.client(
                    "consumer",
                    {"group.protocol": "consumer"},
                    forced={"group.id": "billing", "auto.offset.reset": "earliest", "enable.auto.commit": False},
                )
            ),
            "analytics": new_consumer(
                conn.client(
                    "consumer",
                    forced={"group.id": "analytics", "auto.offset.reset": "earliest", "enable.auto.commit": False},
                )
            ),
        }
        self.nudge: str | None = None  # the `orders` max.compaction.lag.ms last seen, when it is not the default
        self.seq = 0

    def create_topics(self) -> None:
        new = [NewTopic(t, PARTITIONS, self.replication, config=c) for t, c in DEMO_TOPICS.items()]
        for fut in self.admin.create_topics(new).values():
            with contextlib.suppress(Exception):
                fut.result(30)
        for k in range(CUSTOMERS * PARTITIONS):  # the customer tables, once; the key picks the partition
            for table in TABLES:
                self.producer.produce(table, key=customer(k), value=b"signed-up")
        self.producer.flush(30)
        self.log.append(
            f"demo: orders and accounts hold {CUSTOMERS * PARTITIONS} customers, each in one partition (keyed); "
            f"clicks streams {CLICKS_PER_S}/s a partition"
        )

    def step(self) -> None:
        self.seq += 1
        changed = UPDATES_PER_S * PARTITIONS
        for i in range(changed):  # a few customers change (of HOT a partition): the value names the update
            key = customer((self.seq * changed + i) % (HOT * PARTITIONS))
            for table in TABLES:
                self.producer.produce(table, key=key, value=f"update-{self.seq}".encode())
        for p in range(PARTITIONS):
            for i in range(CLICKS_PER_S):
                self.producer.produce("clicks", key=f"u{p * CLICKS_PER_S + i}".encode(), value=b"click", partition=p)
        self.producer.flush(10)
        self._consume("billing", 10_000)
        self._consume("analytics", ANALYTICS_PER_S * PARTITIONS)
        # the nudge and the actions before the log dir: what compactd did is told before what Kafka did about it
        self._watch_nudge()
        self._watch_actions()
        for agent in self.agents:
            self.publisher.publish(agent.scan())

    def _consume(self, group: str, most: int) -> None:
        """Read up to `most` records and commit the position: what the group has read, as an application does."""
        consumer = self.groups[group]
        msgs = consumer.consume(most, timeout=0.2) if most else []
        if any(m.error() is None for m in msgs):
            with contextlib.suppress(Exception):  # a rebalance under way: the next step commits
                consumer.commit(asynchronous=False)

    def _watch_actions(self) -> None:
        for msg in self.actions.consume(100, timeout=0.05):
            if msg.error() is not None:
                continue
            a = json.loads(msg.value())
            if a["action"] not in ("compact", "delete_records") or a["status"] not in ("sent", "failed"):
                continue
            what = f"before {a['before_offset']}" if a["action"] == "delete_records" else ""
            self.log.append(
                f"compactd: {a['action']} {a['topic']}/{a['partition']} {what} {a['status']} ({a['reason']})".replace(
                    "  ", " "
                )
            )

    def _watch_nudge(self) -> None:
        res = ConfigResource("TOPIC", "orders")
        entry = self.admin.describe_configs([res])[res].result(10)[NUDGED]
        now = None if entry.is_default else entry.value
        if now != self.nudge:
            if now is not None:
                self.log.append(f"kafka: orders {NUDGED}={now} (compactd's nudge: Kafka's cleaner must take it)")
            else:
                self.log.append(f"kafka: orders {NUDGED} back to the broker's default: the nudge put back")
            self.nudge = now

    def run(self, stop: threading.Event) -> None:
        for group, consumer in self.groups.items():
            consumer.subscribe(["clicks"])
            self.log.append(f"demo: group {group} subscribed to clicks")
        topic = self.s.topics.actions
        parts = self.actions.list_topics(topic, timeout=10).topics[topic].partitions
        self.actions.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.step()
            except Exception as exc:  # keep the demo alive through a hiccup, say what happened
                self.log.append(f"demo: {type(exc).__name__}: {exc}")
            stop.wait(max(1.0 - (time.monotonic() - started), 0.05))

    def close(self) -> None:
        for consumer in (*self.groups.values(), self.actions):
            with contextlib.suppress(Exception):
                consumer.close()
        self.publisher.close()


LEGEND = (
    "columns: compaction_delay_s = seconds past max.compaction.lag.ms (KIP-354; negative = not due yet) · "
    "min_committed = lowest offset every counted group has committed · deletable = offsets deleteRecords may "
    "remove now (consumed or forced retention) · last_action = newest action record and its status"
)


VIEW_TOPIC = "accounts"  # the demo topic with the compaction service on
VIEW_KEYS = 4  # keys of the view's table shown


class ViewWatch:
    """The compacted view of `accounts` as a reader sees it: the published generation (the manifest mirror in Redis)
    and, read once per new generation, a few keys of its table (view + source tail, `compactd read --table`)."""

    def __init__(self, settings: Settings, log: EventLog) -> None:
        from compactd.compaction.store import CompactionState

        self.s = settings
        self.log = log
        self.cv = CompactionState(settings.redis_state().r, settings.key_prefix)
        self.generation = 0
        self.lines: list[str] = ["compacted view: (the first generation is published once Spark has started)"]

    def refresh(self) -> list[str]:
        from compactd.compaction.view import CompactedReader

        manifest = self.cv.manifest(VIEW_TOPIC)
        if manifest is None or manifest.generation <= self.generation:
            return self.lines
        self.generation = manifest.generation
        reader = CompactedReader(self.s.kafka_connection(), self.s.topics.compactions)
        live = sorted(
            ((p, rec) for p, rec in reader.partition_records(VIEW_TOPIC, table_mode=True)),
            key=lambda pr: pr[1].key or b"",
        )
        horizons = " ".join(f"{p}:{pv.horizon}" for p, pv in sorted(manifest.partitions.items()))
        shown = "  ".join(
            f"{(rec.key or b'').decode()}={(rec.value or b'').decode()} (p{p}@{rec.offset})"
            for p, rec in live[:VIEW_KEYS]
        )
        self.lines = [
            f"compacted view {manifest.view}: generation {manifest.generation}, {manifest.records_in} records in, "
            f"{manifest.records_out} out, horizon {horizons}",
            f"  its table ({len(live)} live keys, view + tail): {shown} ...",
        ]
        self.log.append(
            f"compaction service: {VIEW_TOPIC} generation {manifest.generation} published "
            f"({manifest.keys} keys below the horizon)"
        )
        return self.lines


def _printer(settings: Settings, watch: ViewWatch, stop: threading.Event, started: float) -> None:
    """On a terminal, one live screen updated in place every 2 s (rich), the event log scrolling above it; piped or
    captured, the event log alone, each line once as it happens (the table is printed when the demo ends)."""
    state = settings.redis_state()

    def frame() -> tuple[list[dict[str, Any]], list[str]]:
        rows = demo_rows(status_rows(state, settings.thresholds, now_ms()))
        try:
            return rows, watch.refresh()
        except Exception as exc:  # the screen goes on; the next refresh tries again
            return rows, [f"compacted view: not read ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0]})"]

    if sys.stdout.isatty():
        _live_screen(frame, watch.log, stop, started)
        return
    shown = 0
    while not stop.wait(1.0):
        with contextlib.suppress(Exception):  # the view's lines reach the log when it is read
            watch.refresh()
        new = watch.log.since(shown)
        shown += len(new)
        if new:
            print("\n".join(new), flush=True)


WAITING = "(waiting for the job's first batch: Spark takes ~20 s to start)"


def _live_screen(
    frame: Callable[[], tuple[list[dict[str, Any]], list[str]]],
    log: EventLog,
    stop: threading.Event,
    started: float,
) -> None:
    """rich's Live display: the table and the view in place, the legend once as the table's caption; the event
    log and the job's log lines are printed above it and scroll."""
    import logging

    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    def screen() -> Group:
        rows, view_lines = frame()
        title = f"compactd demo — {time.monotonic() - started:.0f}s — Ctrl-C to stop"
        table = rich_table(rows, title=title, caption=LEGEND) if rows else Text(f"{title}\n{WAITING}")
        return Group(table, Text("\n".join(view_lines)))

    shown = 0
    handlers = [h for h in logging.getLogger().handlers if type(h) is logging.StreamHandler]
    with Live(screen(), auto_refresh=False, redirect_stderr=True, redirect_stdout=True) as live:
        before = [h.setStream(sys.stderr) for h in handlers]  # the job's log through Live, above the screen
        try:
            while not stop.wait(2.0):
                new = log.since(shown)
                for line in new:
                    live.console.print(line, highlight=False, markup=False)
                shown += len(new)
                live.update(screen(), refresh=True)
        finally:
            for h, stream in zip(handlers, before, strict=True):
                h.setStream(stream)


CLOSED = ("the nudge put back", "log start moved", "compaction service:")
RESTARTED = "started again"  # the event log's line once the killed node is back (`--nodes 3`)


def closed(text: str) -> bool:
    return all(mark in text for mark in CLOSED)


def _until_closed(log: EventLog, stop: threading.Event, after: str | None = None) -> None:
    """Stop once both loops have closed — Kafka's cleaner answered a nudge and the nudge was put back, and the
    broker's log start moved after a delete_records — and the compaction service published a generation (all of it
    after the line holding `after`, when given); then a few more seconds so the final table shows the answers."""
    while not stop.wait(0.5):
        text = log.text()
        if after is not None:
            text = text.split(after, 1)[1] if after in text else ""
        if closed(text):
            stop.wait(4.0)
            stop.set()


def _kill_and_restart(kafka: KafkaCluster, log: EventLog, stop: threading.Event) -> None:
    """Once both loops have closed: kill -9 the node leading most of the demo's partitions, start it again DOWN_S
    later. compactd is never told: its clients find the new leaders, the other nodes' agents take over."""
    while not stop.wait(0.5) and not closed(log.text()):
        pass
    if stop.is_set():
        return
    admin = admin_client(KafkaConnection(kafka.bootstrap))
    led = Counter(
        pm.leader for t in DEMO_TOPICS for pm in admin.list_topics(t, timeout=10).topics[t].partitions.values()
    )
    node_id, count = led.most_common(1)[0]
    victim = kafka.node(node_id)
    victim.kill()
    log.append(f"demo: kill -9 of Kafka node {node_id}, leader of {count} demo partitions; back in {DOWN_S:.0f} s")
    if stop.wait(DOWN_S):
        return
    victim.start()
    log.append(f"demo: Kafka node {node_id} {RESTARTED}")


def run_demo(
    duration_s: float = 0,
    workdir: str | None = None,
    render_dir: str | None = None,
    until_closed: bool = False,
    nodes: int = 1,
) -> int:
    """Run until Ctrl-C or `duration_s`; a temp dir is removed at the end, a given `workdir` is kept.

    `until_closed`: also stop as soon as both loops (compaction, deletion) have been carried out and answered (with
    several `nodes`: again after the killed node was started again).

    `render_dir`: also scrape the job with a local Prometheus and draw the dashboards there when the demo ends.
    """
    from compactd.daemon.application import Application

    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="compactd-demo-"))
    services: list[Service | KafkaBroker | KafkaCluster] = []
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    cluster: DemoCluster | None = None
    try:
        redis = redis_server(root / "redis")
        services.append(redis)
        kafka: KafkaCluster | None = None
        if nodes > 1:
            kafka = KafkaCluster(root / "kafka", nodes)
            services.append(kafka)
            brokers, bootstrap = kafka.nodes, kafka.bootstrap
        else:
            broker = kafka_broker(root / "broker")
            services.append(broker)
            brokers, bootstrap = [broker], broker.bootstrap
        settings = demo_settings(bootstrap, f"redis://127.0.0.1:{redis.port}/0", root / "checkpoint")
        prometheus_url = None
        if render_dir:
            settings.metrics_port = free_port()
            settings.metrics.sample_interval_ms = 2000
            prom = prometheus_server(root / "prometheus", settings.metrics_port)
            services.append(prom)
            prometheus_url = f"http://127.0.0.1:{prom.port}"
            print(f"demo: Prometheus {prometheus_url} scrapes the job every second", flush=True)
        if not sys.stdout.isatty():  # an event log: the job's own lines go to a file, named here
            job_log = root / "job.log" if workdir else Path(tempfile.gettempdir()) / f"compactd-demo-{os.getpid()}.log"
            log_to_file(job_log)
            print(f"demo: the job's log goes to {job_log}", flush=True)
        dirs = ", ".join(str(b.log_dir) for b in brokers)
        print(
            f"demo: Apache Kafka {bootstrap} (log dir {dirs}), redis 127.0.0.1:{redis.port}, data in {root}",
            flush=True,
        )
        ensure_topics(settings.kafka_connection(), settings.own_topics(), configs=settings.own_topic_configs())
        log = EventLog()
        cluster = DemoCluster(settings, brokers, log)
        cluster.create_topics()
        started = time.monotonic()
        watch = ViewWatch(settings, log)
        threads = [
            threading.Thread(target=cluster.run, args=(stop,), daemon=True),
            threading.Thread(target=_printer, args=(settings, watch, stop, started), daemon=True),
        ]
        if duration_s:
            threads.append(threading.Thread(target=lambda: stop.wait(duration_s) or stop.set(), daemon=True))
        if kafka is not None:
            threads.append(threading.Thread(target=_kill_and_restart, args=(kafka, log, stop), daemon=True))
        if until_closed:
            after = RESTARTED if kafka is not None else None
            threads.append(threading.Thread(target=_until_closed, args=(log, stop, after), daemon=True))
        for t in threads:
            t.start()
        with Application(settings) as app:
            app.run(stop=stop)
        if prometheus_url and render_dir:
            from compactd.dashboards.render import render

            span = max(time.monotonic() - started, 60.0)
            variables = {"topic": "orders", "partition": "0", "cluster": settings.cluster}
            for name in ("overview", "health", "partition"):
                path = render(prometheus_url, Path(render_dir), name, span, variables)
                print(f"demo: drew {path}", flush=True)
        for t in threads[:2]:
            t.join(10)
        state = settings.redis_state()
        print("\nfinal state:", flush=True)
        print_table(demo_rows(status_rows(state, settings.thresholds, now_ms())))
        print("\n".join(watch.lines), flush=True)
        return 0
    finally:
        stop.set()
        if cluster is not None:
            cluster.close()
        for svc in reversed(services):
            svc.stop()
        if workdir:
            print(f"demo data kept in {root}", flush=True)
        else:
            shutil.rmtree(root, ignore_errors=True)
