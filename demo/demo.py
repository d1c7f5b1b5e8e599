"""`compactd demo`: an embedded broker and Redis, a simulated cluster that reacts to actions, and the job.

The simulated cluster stands in for the segment agent and the broker's cleaner:
- producers write to `orders` (compacted) and `clicks` (delete policy) and roll a segment every few seconds;
- groups `billing` (keeps up) and `analytics` (lags behind) commit on `clicks`;
- a "cleaner" answers each sent compact action with a `compacted` event a few seconds later;
- log start offsets are polled from the broker, so a deleteRecords shows up as a `log_start` event;
- the compaction service is on for `orders`: the job publishes generations of its compacted view `orders.compacted`
  (one as soon as it starts, the next once records beyond the horizon are older than max.compaction.lag.ms), and the
  screen shows the last one and a few of its keys.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from compactd.app.settings import Settings
from compactd.app.status import format_table, print_table, rich_table, status_rows
from compactd.clock import now_ms
from compactd.demo.embedded import Service, free_port, kafka_broker, prometheus_server, redis_server
from compactd.kafka.admin import admin_client, ensure_topics
from compactd.keys import partition_key

DEMO_TOPICS = {"orders": {"cleanup.policy": "compact"}, "clicks": {"cleanup.policy": "delete"}}
PARTITIONS = 2
ROLL_EVERY_S = 4.0
CLEANER_DELAY_S = 3.0


def demo_settings(bootstrap: str, redis_url: str, checkpoint: Path) -> Settings:
    return Settings(
        bootstrap_servers=bootstrap,
        redis_url=redis_url,
        checkpoint_dir=str(checkpoint),
        trigger_interval_ms=1000,
        offsets_source="commits",  # the simulated cluster writes its groups' commits as JSON
        thresholds={
            "global": {"dry.run": False, "action.retry.ms": 15_000},
            "topic:orders": {"max.compaction.lag.ms": 12_000, "compaction.service": True},
            "topic:clicks": {"consumed.retention.ms": 10_000, "forced.retention.ms": 60_000},
        },
    )


@dataclass
class _Part:
    base: int = 0
    end: int = 0
    first_ts: int | None = None
    last_roll: float = 0.0
    rolled_end: int = 0
    log_start: int = 0


class SimulatedCluster:
    def __init__(self, settings: Settings) -> None:
        self.s = settings
        conn = settings.kafka_connection()
        self.producer = Producer(conn.client("producer"))
        self.admin = admin_client(conn)
        self.watermarks = Consumer(conn.client("consumer", forced={"group.id": "demo-watermarks"}))
        self.actions = Consumer(
            conn.client(
                "consumer", forced={"group.id": f"demo-cleaner-{uuid.uuid4()}", "auto.offset.reset": "earliest"}
            )
        )
        self.parts = {(t, p): _Part(last_roll=time.monotonic()) for t in DEMO_TOPICS for p in range(PARTITIONS)}
        self.cleaner_queue: list[tuple[float, str, int]] = []
        self.log: list[str] = []

    def create_topics(self) -> None:
        new = [NewTopic(t, PARTITIONS, 1, config=c) for t, c in DEMO_TOPICS.items()]
        for fut in self.admin.create_topics(new).values():
            with contextlib.suppress(Exception):
                fut.result(30)

    def _event(self, topic: str, key: str, event: dict) -> None:
        self.producer.produce(topic, key=key.encode(), value=json.dumps(event).encode())

    def step(self) -> None:
        now = now_ms()
        for (topic, p), st in self.parts.items():
            for i in range(50):  # the value names its offset: the view's table shows which record won
                value = f"v{st.end + i}".encode()
                self.producer.produce(topic, key=f"k{i % 20}".encode(), value=value, partition=p)
            st.end += 50
            st.first_ts = st.first_ts or now
            if time.monotonic() - st.last_roll >= ROLL_EVERY_S:
                self._event(
                    self.s.topics.segments,
                    partition_key(topic, p),
                    {
                        "type": "segment_rolled",
                        "topic": topic,
                        "partition": p,
                        "base_offset": st.base,
                        "end_offset": st.end,
                        "first_batch_max_ts": st.first_ts,
                        "size_bytes": (st.end - st.base) * 60,
                        "ts": now,
                    },
                )
                st.base, st.rolled_end, st.first_ts, st.last_roll = st.end, st.end, None, time.monotonic()
        for p in range(PARTITIONS):
            st = self.parts[("clicks", p)]
            for group, behind in (("billing", 0), ("analytics", 400)):
                self._event(
                    self.s.topics.commits,
                    group,
                    {
                        "type": "offset_commit",
                        "group": group,
                        "topic": "clicks",
                        "partition": p,
                        "offset": max(st.end - behind, 0),
                        "ts": now,
                    },
                )
        self._cleaner(now)
        self._log_starts(now)
        self.producer.flush(10)

    def _cleaner(self, now: int) -> None:
        # resume/pause around the read: an assigned consumer otherwise re-fetches non-stop from a broker that
        # answers empty fetches at once (noida-db does), burning CPU on both sides
        assigned = self.actions.assignment()
        self.actions.resume(assigned)
        msgs = self.actions.consume(100, timeout=0.2)
        self.actions.pause(assigned)
        for msg in msgs:
            if msg.error() is not None:
                continue
            action = json.loads(msg.value())
            if action["action"] == "compact" and action["status"] == "sent":
                self.cleaner_queue.append((time.monotonic() + CLEANER_DELAY_S, action["topic"], action["partition"]))
                self.log.append(f"cleaner: compaction of {action['topic']}/{action['partition']} scheduled")
        due = [c for c in self.cleaner_queue if c[0] <= time.monotonic()]
        self.cleaner_queue = [c for c in self.cleaner_queue if c[0] > time.monotonic()]
        for _, topic, p in due:
            upto = self.parts[(topic, p)].rolled_end
            self._event(
                self.s.topics.segments,
                partition_key(topic, p),
                {"type": "compacted", "topic": topic, "partition": p, "cleaned_up_to": upto, "ts": now},
            )
            self.log.append(f"cleaner: {topic}/{p} compacted up to {upto}")

    def _log_starts(self, now: int) -> None:
        for (topic, p), st in self.parts.items():
            low, _ = self.watermarks.get_watermark_offsets(TopicPartition(topic, p), timeout=5, cached=False)
            if low > st.log_start:
                st.log_start = low
                self._event(
                    self.s.topics.segments,
                    partition_key(topic, p),
                    {"type": "log_start", "topic": topic, "partition": p, "log_start_offset": low, "ts": now},
                )
                self.log.append(f"broker: {topic}/{p} log start moved to {low}")

    def run(self, stop: threading.Event) -> None:
        # assign, not subscribe: the cleaner reads every action and needs no group rebalance to start
        topic = self.s.topics.actions
        parts = self.actions.list_topics(topic, timeout=10).topics[topic].partitions
        self.actions.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        while not stop.is_set():
            try:
                self.step()
            except Exception as exc:  # keep the demo alive through a hiccup, say what happened
                self.log.append(f"simulator: {type(exc).__name__}: {exc}")
            stop.wait(1.0)
        self.actions.close()
        self.watermarks.close()


LEGEND = (
    "columns: compaction_delay_s = seconds past max.compaction.lag.ms (KIP-354; negative = not due yet) · "
    "min_committed = lowest offset every counted group has committed · deletable = offsets deleteRecords may "
    "remove now (consumed or forced retention) · last_action = newest action record and its status"
)


VIEW_TOPIC = "orders"  # the demo topic with the compaction service on
VIEW_KEYS = 4  # keys of the view's table shown


class ViewWatch:
    """The compacted view of `orders` as a reader sees it: the published generation (the manifest mirror in Redis)
    and, read once per new generation, a few keys of its table (view + source tail, `compactd read --table`)."""

    def __init__(self, settings: Settings, sim: SimulatedCluster) -> None:
        from compactd.compaction.store import CompactionState

        self.s = settings
        self.sim = sim
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
        self.sim.log.append(
            f"compaction service: {VIEW_TOPIC} generation {manifest.generation} published "
            f"({manifest.keys} keys below the horizon)"
        )
        return self.lines


def _printer(settings: Settings, watch: ViewWatch, stop: threading.Event, started: float) -> None:
    """The demo's screen every 2 s: on a terminal, one live screen updated in place (rich) with the simulated
    cluster's lines and the job's log scrolling above it; piped or captured, the plain table and the new lines."""
    state = settings.redis_state()
    sim = watch.sim

    def frame() -> tuple[list[dict[str, Any]], list[str]]:
        rows = status_rows(state, settings.thresholds, now_ms())
        try:
            return rows, watch.refresh()
        except Exception as exc:  # the screen goes on; the next refresh tries again
            return rows, [f"compacted view: not read ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0]})"]

    if sys.stdout.isatty():
        _live_screen(frame, sim, stop, started)
        return
    shown = 0
    while not stop.wait(2.0):
        rows, view_lines = frame()
        out = [f"compactd demo — {time.monotonic() - started:5.0f}s — Ctrl-C to stop"]
        out.append(format_table(rows) if rows else WAITING)
        out.extend(["", *view_lines, ""])
        out.extend(sim.log[shown:])
        shown = len(sim.log)
        print("\n".join(out), flush=True)


WAITING = "(waiting for the job's first batch: Spark takes ~20 s to start)"


def _live_screen(
    frame: Callable[[], tuple[list[dict[str, Any]], list[str]]],
    sim: SimulatedCluster,
    stop: threading.Event,
    started: float,
) -> None:
    """rich's Live display: the table and the view in place, the legend once as the table's caption; what the
    simulated cluster did and the job's log lines are printed above it and scroll."""
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
                for line in sim.log[shown:]:
                    live.console.print(line, highlight=False, markup=False)
                shown = len(sim.log)
                live.update(screen(), refresh=True)
        finally:
            for h, stream in zip(handlers, before, strict=True):
                h.setStream(stream)


def _until_closed(sim: SimulatedCluster, stop: threading.Event) -> None:
    """Stop once both loops have closed — the cleaner compacted what a compact action asked, and the broker's log
    start moved after a delete_records — and the compaction service published a generation; then two more
    refreshes so the final table shows the answers."""
    while not stop.wait(0.5):
        text = "\n".join(sim.log)
        if "compacted up to" in text and "log start moved" in text and "compaction service:" in text:
            stop.wait(4.0)
            stop.set()


def run_demo(
    duration_s: float = 0, workdir: str | None = None, render_dir: str | None = None, until_closed: bool = False
) -> int:
    """Run until Ctrl-C or `duration_s`; a temp dir is removed at the end, a given `workdir` is kept.

    `until_closed`: also stop as soon as both loops (compaction, deletion) have been carried out and answered.

    `render_dir`: also scrape the job with a local Prometheus and draw the dashboards there when the demo ends.
    """
    from compactd.app.application import Application

    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="compactd-demo-"))
    services: list[Service] = []
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        services.append(redis_server(root / "redis"))
        services.append(kafka_broker(root / "broker"))
        redis_port, broker_port = services[0].port, services[1].port
        settings = demo_settings(f"127.0.0.1:{broker_port}", f"redis://127.0.0.1:{redis_port}/0", root / "checkpoint")
        prometheus_url = None
        if render_dir:
            settings.metrics_port = free_port()
            settings.metrics.sample_interval_ms = 2000
            prom = prometheus_server(root / "prometheus", settings.metrics_port)
            services.append(prom)
            prometheus_url = f"http://127.0.0.1:{prom.port}"
            print(f"demo: Prometheus {prometheus_url} scrapes the job every second", flush=True)
        print(f"demo: broker 127.0.0.1:{broker_port}, redis 127.0.0.1:{redis_port}, data in {root}", flush=True)
        # before the simulated cleaner subscribes to the actions topic
        ensure_topics(settings.kafka_connection(), settings.own_topics(), configs=settings.own_topic_configs())
        sim = SimulatedCluster(settings)
        sim.create_topics()
        started = time.monotonic()
        watch = ViewWatch(settings, sim)
        threads = [
            threading.Thread(target=sim.run, args=(stop,), daemon=True),
            threading.Thread(target=_printer, args=(settings, watch, stop, started), daemon=True),
        ]
        if duration_s:
            threads.append(threading.Thread(target=lambda: stop.wait(duration_s) or stop.set(), daemon=True))
        if until_closed:
            threads.append(threading.Thread(target=_until_closed, args=(sim, stop), daemon=True))
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
        print_table(status_rows(state, settings.thresholds, now_ms()))
        print("\n".join(watch.lines), flush=True)
        return 0
    finally:
        stop.set()
        for svc in reversed(services):
            svc.stop()
        if workdir:
            print(f"demo data kept in {root}", flush=True)
        else:
            shutil.rmtree(root, ignore_errors=True)
