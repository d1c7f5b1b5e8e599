"""The compacted views' cap on source deletes, as data the compaction trigger writes and the controller reads.

The compaction trigger writes what it learns here: a source that is another log than its view's (`changed`: deletes
capped at 0 until a new view), a generation published, a grace over (`moved`). The controller reads the cap
(`cap`, through `compaction.manifest.retention_cap`, the rule) and takes the topics whose cap moved at its next tick
(`take_moved`), to evaluate them again. Neither calls the other.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

from compactd.compaction.manifest import Manifest, retention_cap
from compactd.policy.thresholds import Thresholds

CACHE_S = 1.0  # how long decisions reuse the manifests they read (the send-time check always reads them)


class ManifestMirror(Protocol):
    """The published manifests as Redis mirrors them (compaction/store.py `CompactionState`)."""

    def topics(self) -> list[str]: ...

    def manifest(self, topic: str) -> Manifest | None: ...

    def mirror(self, manifest: Manifest) -> None: ...


class ManifestTopic(Protocol):
    """The manifest topic, the truth the mirror is refreshed from (compaction/store.py `ManifestLog`)."""

    def read_all(self) -> dict[str, Manifest]: ...


class ViewCaps:
    def __init__(self, state: ManifestMirror, log: ManifestTopic) -> None:
        """`state`: the Redis mirror of the published manifests; `log`: the manifest topic, read when the mirror is
        missing (a new job, a state wiped by a rebuild)."""
        self.state = state
        self.log = log
        self.changed: set[str] = set()  # sources that are another log than their view's
        self._moved: set[str] = set()
        self._lock = threading.Lock()
        self._mirrored = False
        self._cache_at = -CACHE_S
        self._with_view: set[str] = set()
        self._manifests: dict[str, Manifest | None] = {}

    # -- what the trigger records
    def moved(self, topic: str) -> None:
        """The topic's cap moved (a generation published, a grace over, the source found to be another log): its
        partitions are evaluated again at the controller's next tick, as a config change would have them."""
        with self._lock:
            self._moved.add(topic)
        self._cache_at = -CACHE_S  # decisions read the new manifest

    def another_log(self, topic: str, now_another: bool) -> bool:
        """Record whether the topic's source is another log than its view's; True when that changed."""
        if now_another == (topic in self.changed):
            return False
        (self.changed.add if now_another else self.changed.discard)(topic)
        self.moved(topic)
        return True

    # -- what the controller reads
    def take_moved(self) -> list[str]:
        with self._lock:
            moved, self._moved = sorted(self._moved), set()
        return moved

    def cap(self, topic: str, partition: int, th: Thresholds, now: int, fresh: bool = False) -> int | None:
        """The highest source offset a delete may reach on this partition (None: no view, no cap). Decisions read
        the manifests through a cache of CACHE_S (a stale manifest caps lower: the safe side); the send-time check
        reads Redis now (`fresh`)."""
        if fresh or time.monotonic() - self._cache_at >= CACHE_S:
            self._cache_at = time.monotonic()
            self._with_view = set(self.state.topics())
            self._manifests.clear()
        manifest: Manifest | None = None
        if topic in self._with_view or th.compaction_service:
            if fresh or topic not in self._manifests:
                self._manifests[topic] = self.state.manifest(topic)
            manifest = self._manifests[topic]
        if manifest is None and th.compaction_service and not self._mirrored:
            manifest = self._manifests[topic] = self.manifest(topic)
        if topic in self.changed:
            return 0  # the view is of another log: nothing of this one is in it yet
        return retention_cap(manifest, th.compaction_service, partition, now, th.compaction_view_grace_ms)

    def epoch_read(self, topic: str, partition: int) -> int:
        """The leader epoch the published generation read the partition under, as the last `cap` read the manifest
        (-1: no view, or not known). A source that is another log is capped at 0 already."""
        manifest = self._manifests.get(topic)
        if topic in self.changed or manifest is None or manifest.generation <= 0:
            return -1
        pv = manifest.partitions.get(str(partition))
        return -1 if pv is None else pv.epoch

    # -- the published manifests
    def manifest(self, topic: str) -> Manifest | None:
        """The published manifest: the Redis mirror, refreshed from the manifest topic when it has none — a missing
        mirror never reads as "nothing published"."""
        found = self.state.manifest(topic)
        if found is None or not self._mirrored:
            self.refresh_mirrors()
            found = self.state.manifest(topic)
        return found

    def refresh_mirrors(self) -> None:
        for m in self.log.read_all().values():
            current = self.state.manifest(m.topic)
            if current is None or current.generation < m.generation:
                self.state.mirror(m)
        self._mirrored = True
