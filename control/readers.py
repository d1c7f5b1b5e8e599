"""Where the readers that commit no group offsets are read: the IO side of policy/readers.py.

Three sources, each turned into `ReaderHold`s per topic:
- declared pins (`reader:<name>` layers with `pin` and `expires_ms`): from the layers alone; a pin past its lease no
  longer counts, and the job says so once, naming the reader and the setting;
- declared Spark checkpoints (`spark_checkpoint`): the latest committed batch's offsets (codec/spark_checkpoint.py),
  read from a local directory or, through the running Spark session, any Hadoop filesystem (s3a://, hdfs://);
- share groups (KIP-932): `__share_group_state` (kafka/share_state.py).
A reader whose source cannot be read is blind: it holds the topics it was last seen on, or every topic when it was
never read (with `subscribe_pattern`: the topics it matches). Each problem is logged once when it starts and once when
it ends, never per batch.

A declared reader's positions are bound to the topic ID they were first read on (policy/readers.py `incarnation`):
a topic created again is not held, nor released, by the old log's offsets. The bindings are published with the holds
(Redis) and taken back by the first read of a new process: a `--once` run must remember what the one before saw.

`holds()` is read once per batch (policy: control/evaluation.py folds them into the chunks) and again, `fresh`, right
before a consumed-retention delete goes (control/dispatch.py). `describe()` is what `compactd explain` shows.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import msgspec

from compactd.codec.spark_checkpoint import Checkpoint, kafka_positions, latest_batch, latest_planned
from compactd.control.metrics import Metrics
from compactd.kafka.share_state import STATE_TOPIC, ShareStateTail
from compactd.kafka.topics import TopicsNow
from compactd.policy.identity import known_id
from compactd.policy.readers import (
    EVERY_TOPIC,
    PATTERNS,
    PIN,
    SHARE_GROUP,
    SPARK_CHECKPOINT,
    Bound,
    ReaderHold,
    ReaderSpec,
    declared,
    incarnation,
    pin_holds,
)

log = logging.getLogger("compactd.readers")

CACHE_S = 5.0  # how long a batch's decisions reuse what was read
FRESH_S = 1.0  # the send-time check's, without the refresher: a round of sends reads once, not once per delete
REFRESH_S = 2.0  # the refresher's period
STALE_S = 2.5 * REFRESH_S  # with the refresher: older than this at a send, the readers count as unread (blind)
SHARE_GROUPS = "share groups"  # the name of the blind hold when share groups cannot be read at all


def _layers_key(layers: Mapping[str, Mapping[str, Any]]) -> int:
    """What of the layers the readers depend on (their `reader:<name>` scopes), as a cache key."""
    return hash(repr(sorted((s, repr(v)) for s, v in layers.items() if s.startswith("reader:"))))


def list_dir(path: str) -> list[str]:
    """The names in a checkpoint directory: local, or through the running Spark session's Hadoop filesystem."""
    if "://" not in path or path.startswith("file://"):
        local = path.removeprefix("file://")
        return os.listdir(local) if os.path.isdir(local) else []
    fs, p = _hadoop(path)
    return [] if not fs.exists(p) else [s.getPath().getName() for s in fs.listStatus(p)]


def read_text(path: str) -> str:
    if "://" not in path or path.startswith("file://"):
        with open(path.removeprefix("file://"), encoding="utf-8") as f:
            return f.read()
    fs, p = _hadoop(path)
    stream = fs.open(p)
    try:
        jvm = _session().sparkContext._jvm
        return str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
    finally:
        stream.close()


def _session() -> Any:
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None:
        raise OSError("no Spark session to reach this filesystem through (only local paths outside the job)")
    return spark


def _hadoop(path: str) -> tuple[Any, Any]:
    spark = _session()
    jvm = spark.sparkContext._jvm
    p = jvm.org.apache.hadoop.fs.Path(path)
    return p.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), p


def checkpoint_positions(path: str) -> Checkpoint | None:
    """A Spark query's latest committed batch and its positions; None when it has committed no batch yet."""
    base = path.rstrip("/")
    batch = latest_batch(list_dir(f"{base}/commits"), list_dir(f"{base}/offsets"))
    if batch is None:
        return None
    return Checkpoint(batch, kafka_positions(read_text(f"{base}/offsets/{batch}")))


def planned_batch(path: str) -> int:
    """The latest batch a query has planned (-1: none): its offsets were fetched before this call returned."""
    planned = latest_planned(list_dir(f"{path.rstrip('/')}/offsets"))
    return -1 if planned is None else planned


class TopicIds(Protocol):
    def describe(self, topics: Iterable[str]) -> TopicsNow: ...

    def close(self) -> None: ...


class PublishReaders:
    """Where `Readers` publishes its doc when the holds or a reader's state change: one gauge sample per reader, and
    the copy in Redis that `explain` reads."""

    def __init__(self, metrics: Metrics, save: Callable[[Mapping[str, Any]], None]) -> None:
        self.metrics, self.save = metrics, save

    def __call__(self, doc: dict[str, Any]) -> None:
        self.metrics.readers.clear()
        for name, status in doc["status"].items():
            self.metrics.readers.labels(name, status.get("kind", "?"), status.get("state", "invalid")).set(1)
        self.save(doc)


class Readers:
    """The holds of every reader that commits no group offsets, read at most every CACHE_S (or `fresh`)."""

    def __init__(
        self,
        share: ShareStateTail | None = None,
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
        checkpoint: Callable[[str], Checkpoint | None] = checkpoint_positions,
        monotonic: Callable[[], float] = time.monotonic,
        publish: Callable[[dict[str, Any]], None] | None = None,
        topics: TopicIds | None = None,
        published: Callable[[], Mapping[str, Any] | None] | None = None,
        planned: Callable[[str], int] = planned_batch,
    ) -> None:
        """`share`: the share-group tail (None: share groups are not read, on a cluster where none can exist);
        `checkpoint`: how a Spark checkpoint is read; `publish`: called with `doc()` whenever the holds or a
        reader's state change (Redis, for `explain`; the metrics); `topics`: the declared readers' topic IDs (None:
        no incarnation is checked); `published`: the last published doc, whose bindings the first read takes back."""
        self.share = share
        self.clock = clock
        self.checkpoint = checkpoint
        self.monotonic = monotonic
        self.publish = publish
        self.topics = topics
        self.published = published
        self.planned = planned
        self._bound: dict[str, dict[str, Bound]] = {}  # reader -> topic -> the incarnation its positions are bound to
        self._restored = published is None
        self._published = json.dumps({"holds": {}, "status": {}}, sort_keys=True)  # no reader: nothing to write
        self._cache: tuple[float, int, dict[str, tuple[ReaderHold, ...]]] | None = None
        self._last: dict[str, tuple[ReaderHold, ...]] = {}  # the holds as last read, for `take_moved`
        self._moved: set[str] = set()
        self._seen: dict[str, frozenset[str]] = {}  # reader -> topics it was last read on
        self._problems: dict[str, str] = {}  # reader -> the problem last logged
        self._status: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()  # the cache and what is derived from it
        self._reading = threading.Lock()  # one read of the sources at a time
        self._layers: Mapping[str, Mapping[str, Any]] | None = None
        self._running = False
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def holds(self, layers: Mapping[str, Mapping[str, Any]], fresh: bool = False) -> dict[str, tuple[ReaderHold, ...]]:
        """topic (or EVERY_TOPIC) -> the holds on it now: at most CACHE_S old for a plan, FRESH_S (STALE_S with the
        refresher) for the check right before a delete. With the refresher running (`start`), neither waits on IO: a
        plan takes the last read, and a send-time check finds the readers unread for too long blind (the send fails
        and is tried again, as with an unreachable cluster)."""
        key = _layers_key(layers)
        with self._lock:
            self._layers = layers
            cache = self._cache
            if cache is not None and cache[1] == key:
                age = self.monotonic() - cache[0]
                if age < (STALE_S if self._running and fresh else FRESH_S if fresh else CACHE_S):
                    return cache[2]
                if self._running and not fresh:
                    return cache[2]
                if self._running:
                    why = f"the readers were last read {age:.0f}s ago"
                    return {**cache[2], EVERY_TOPIC: (ReaderHold("readers", "unread", blind=why),)}
        return self._read(layers, key)

    def _read(self, layers: Mapping[str, Mapping[str, Any]], key: int) -> dict[str, tuple[ReaderHold, ...]]:
        """Read every reader's source (IO, one read at a time), then take the result in."""
        with self._reading:
            out: dict[str, list[ReaderHold]] = {}
            problems: dict[str, str] = {}
            status: dict[str, dict[str, Any]] = {}
            specs, bad = declared(layers)
            for name, why in bad.items():
                problems[name] = f"reader {name} is not counted: {why} (its reader:{name} keys)"
                status[name] = {"kind": "invalid", "why": why}
            read = {name: self._source(name, spec, problems, status) for name, spec in sorted(specs.items())}
            ids, unsure = self._incarnations(specs, read)
            for name, spec in sorted(specs.items()):
                self._declared(name, spec, read[name], ids, unsure, out, problems, status)
            self._bound = {n: b for n, b in self._bound.items() if n in specs}
            if self.share is not None:
                self._share_groups(out, problems, status)
            result = {t: tuple(h) for t, h in out.items()}
            with self._lock:
                self._say(problems)
                self._status = status
                self._moved |= {t for t in result.keys() | self._last.keys() if result.get(t) != self._last.get(t)}
                self._last = result
                self._cache = (self.monotonic(), key, result)
            self._maybe_publish(result, status)
            return result

    def start(self) -> None:
        """Read the readers every REFRESH_S on a thread of their own, so that neither a plan nor a send waits on
        their sources (a broker down costs the share-state read its timeout)."""
        if self._running:
            return
        self._running = True
        self._thread = threading.Thread(target=self._refresh, name="compactd-readers", daemon=True)
        self._thread.start()

    def _refresh(self) -> None:
        while not self._stopping.wait(REFRESH_S):
            layers = self._layers
            if layers is None:
                continue
            try:
                self._read(layers, _layers_key(layers))
            except Exception as exc:  # each source reports its own problems; this is a bug's last net
                log.warning("reading the readers failed: %s", exc)

    def _maybe_publish(self, holds: dict[str, tuple[ReaderHold, ...]], status: dict[str, dict[str, Any]]) -> None:
        if self.publish is None or not self._restored:  # the copy must not lose the bindings it holds
            return
        doc = {"holds": {t: [msgspec.to_builtins(h) for h in hs] for t, hs in sorted(holds.items())},
               "status": status, "bound": msgspec.to_builtins(self._bound)}  # fmt: skip
        text = json.dumps(doc, sort_keys=True, default=str)
        if text == self._published:
            return
        try:
            self.publish({**doc, "at": self.clock()})
            self._published = text
        except Exception as exc:  # explain's copy only: a decision never reads it back
            log.debug("readers not published: %s", exc)

    def take_moved(self) -> list[str]:
        """The topics whose holds changed since the last call (EVERY_TOPIC among them: a hold on every topic came or
        went). A reader's position moves without any event touching its partitions: the controller evaluates these
        topics again, as it does topics whose compacted view moved."""
        with self._lock:
            moved, self._moved = self._moved, set()
        if PATTERNS in moved:  # a reader's pattern hold came, went or changed: any topic may match it
            moved = (moved - {PATTERNS}) | {EVERY_TOPIC}
        return sorted(moved)

    def status(self) -> dict[str, dict[str, Any]]:
        """reader -> {kind, state, ...} as last read: for explain (through Redis) and the metrics."""
        with self._lock:
            return dict(self._status)

    def _source(
        self, name: str, spec: ReaderSpec, problems: dict[str, str], status: dict[str, dict[str, Any]]
    ) -> Checkpoint | dict[str, ReaderHold] | str | None:
        """What a declared reader's source says (IO): a checkpoint's latest batch (None: none committed yet), a
        pin's holds, or why it cannot be read (the reader is blind)."""
        if spec.pin is not None:
            found = pin_holds(name, spec, self.clock())
            if not found:
                problems[name] = (
                    f"reader {name}: its pin's lease ended at {spec.expires_ms} (epoch ms); it no longer holds "
                    f"{', '.join(sorted(spec.pin))}. Renew it (reader:{name} expires_ms) or remove it"
                )
                status[name] = {"kind": PIN, "state": "expired", "expires_ms": spec.expires_ms}
            return found
        assert spec.spark_checkpoint is not None
        try:
            return self.checkpoint(spec.spark_checkpoint)
        except Exception as exc:
            problems[name] = f"reader {name}: cannot read {spec.spark_checkpoint} ({exc}); its topics hold deletes"
            status[name] = {"kind": SPARK_CHECKPOINT, "state": "blind", "why": str(exc)}
            return f"cannot read its checkpoint {spec.spark_checkpoint}: {exc}"

    def _incarnations(
        self, specs: Mapping[str, ReaderSpec], read: Mapping[str, Any]
    ) -> tuple[TopicsNow | None, str | None]:
        """The topic IDs of every topic a declared reader has a position on now (one DescribeTopics), after taking
        back the bindings an earlier process published; (None, why) when either cannot be read: the readers hold."""
        if not self._restored:
            assert self.published is not None
            try:
                doc = self.published() or {}
                self._bound = {r: {t: msgspec.convert(b, Bound) for t, b in ts.items()}
                               for r, ts in doc.get("bound", {}).items()}  # fmt: skip
                self._restored = True
            except Exception as exc:
                return None, f"the topic IDs its positions were taken on cannot be read back ({exc})"
        if self.topics is None:
            return None, None
        topics = {t for r in read.values() if isinstance(r, (Checkpoint, dict)) for t in _topics_of(r)}
        if not topics:
            return TopicsNow(), None
        try:
            return self.topics.describe(topics), None
        except Exception as exc:
            return None, f"its topics' IDs cannot be read ({exc})"

    def _declared(
        self,
        name: str,
        spec: ReaderSpec,
        read: Checkpoint | dict[str, ReaderHold] | str | None,
        ids: TopicsNow | None,
        unsure: str | None,
        out: dict[str, list[ReaderHold]],
        problems: dict[str, str],
        status: dict[str, dict[str, Any]],
    ) -> None:
        kind = PIN if spec.pin is not None else SPARK_CHECKPOINT
        pattern = spec.subscribe_pattern or ""
        if isinstance(read, str):
            self._blind(name, kind, read, out, pattern)
            return
        if read is None:  # no batch committed: it has read nothing yet, everywhere it will read
            self._blind(name, kind, "no batch committed in its checkpoint yet", out, pattern)
            status[name] = {"kind": kind, "state": "starting"}
            return
        if isinstance(read, dict) and not read:
            return  # a pin past its lease (said in `_source`)
        if unsure is not None:
            self._blind(name, kind, unsure, out, pattern)
            problems[name] = f"reader {name}: {unsure}; its topics hold deletes"
            status[name] = {"kind": kind, "state": "blind", "why": unsure}
            return
        holds = read if isinstance(read, dict) else {t: ReaderHold(name, kind, p) for t, p in read.positions.items()}
        batch = read.batch if isinstance(read, Checkpoint) else 0
        bound = self._bound.setdefault(name, {})
        path = spec.spark_checkpoint

        def planned() -> int:
            return self.planned(path) if path else 0

        old: list[str] = []
        for topic, hold in holds.items():
            now_id = None
            if ids is not None and topic in ids.unknown:
                hold = ReaderHold(name, kind, {}, blind=f"the ID of {topic} cannot be read: {ids.unknown[topic]}")
            elif ids is not None:
                now_id = known_id(ids.ids.get(topic))
            if now_id is not None:
                mark = path or repr((sorted(hold.positions.items()), spec.expires_ms))
                b, count = incarnation(bound.get(topic), now_id, batch, mark, planned)
                if b is not None:
                    bound[topic] = b
                if not count:
                    old.append(topic)
                    until = "a batch planned since commits" if path else f"reader:{name} pin is set again"
                    why = f"{topic} was created again since its offsets were read: held until {until}"
                    hold = ReaderHold(name, kind, {}, blind=why)
            out.setdefault(topic, []).append(hold)
        if pattern:
            out.setdefault(PATTERNS, []).append(ReaderHold(name, kind, {}, pattern=pattern))
        if isinstance(read, Checkpoint):
            self._seen[name] = frozenset(read.positions)
            status[name] = {"kind": kind, "state": "counting", "positions": read.positions}
        else:
            status[name] = {"kind": kind, "state": "counting", "expires_ms": spec.expires_ms, "pin": spec.pin}
        if old:
            status[name]["other_incarnation"] = sorted(old)

    def _share_groups(
        self, out: dict[str, list[ReaderHold]], problems: dict[str, str], status: dict[str, dict[str, Any]]
    ) -> None:
        assert self.share is not None
        read = self.share.read()
        if read.blind:
            self._blind(EVERY_TOPIC, SHARE_GROUP, read.blind, out)  # every share group, whatever it reads
            problems[SHARE_GROUPS] = (
                f"share groups cannot be read ({read.blind}): consumed retention holds on every topic a share group "
                f"may read; grant Describe and Read on topic {STATE_TOPIC}"
            )
            status[SHARE_GROUPS] = {"kind": SHARE_GROUP, "state": "blind", "why": read.blind}
            return
        for group, topics in sorted(read.groups.items()):
            for topic, parts in topics.items():
                known = {p: o for p, o in parts.items() if o is not None}
                out.setdefault(topic, []).append(ReaderHold(group, SHARE_GROUP, known))
            status[group] = {"kind": SHARE_GROUP, "state": "counting",
                             "positions": {t: dict(p) for t, p in topics.items()}}  # fmt: skip

    def _blind(self, name: str, kind: str, why: str, out: dict[str, list[ReaderHold]], pattern: str = "") -> None:
        """A reader with no readable position holds the topics it was last seen on, or every topic (those its
        pattern matches, when it has one)."""
        for topic in self._seen.get(name) or (() if pattern else (EVERY_TOPIC,)):
            out.setdefault(topic, []).append(ReaderHold(name, kind, {}, blind=why))
        if pattern:
            out.setdefault(PATTERNS, []).append(ReaderHold(name, kind, {}, blind=why, pattern=pattern))

    def _say(self, problems: dict[str, str]) -> None:
        for name, line in problems.items():
            if self._problems.get(name) != line:
                log.warning("%s", line)
        for name in self._problems.keys() - problems.keys():
            log.info("reader %s counts again", name)
        self._problems = problems

    def republish(self) -> None:
        """Write the next read whatever it holds: a copy left by an earlier run must not outlive its readers."""
        self._published = ""

    def close(self) -> None:
        """Stop the refresher without waiting on a read in flight (a stop, and a second signal above all, must not
        wait out a source's timeout): a thread still reading is left to end with the process, and the share-state
        consumer it uses stays open."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(1.0)
            if self._thread.is_alive():
                return
        if self.share is not None:
            self.share.close()
        if self.topics is not None:
            self.topics.close()


def _topics_of(read: Checkpoint | dict[str, ReaderHold]) -> Iterable[str]:
    return read.positions if isinstance(read, Checkpoint) else read
