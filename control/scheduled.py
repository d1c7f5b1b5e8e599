"""What this process last stored as each partition's deadline, so an evaluation writes only the ones that changed
(at a million partitions, rewriting every touched partition's zset entries was 2 s of Redis in a batch that changed
a third of them).

Redis stays the system of record: a value is remembered only after the write that stored it returned, and every
doubt means "unknown", which means "write". The memory is dropped as a whole:
- after `max_age_s` (a zset entry lost without the state guard noticing — a Redis Cluster shard failing over to a
  replica that missed writes, an eviction — is written again at the partition's next evaluation after that);
- when the state is wiped for a rebuild (`forget`), and at every start (it is not persisted);
- for good once another process writes deadlines too (evaluation slices: `off`), since it cannot see those writes.

Per topic, an int64 array indexed by partition number: 8 B per partition (8 MB at a million).
A partition must not be evaluated twice between two `IoAhead.settled()` (the controller's evaluations dedupe their
keys and settle before returning): a value still being written is not remembered yet.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

UNKNOWN = np.iinfo(np.int64).min  # never a stored time, nor NONE (-1)
MAX_AGE_S = 300.0


class Scheduled:
    def __init__(self, max_age_s: float = MAX_AGE_S, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s = max_age_s
        self.monotonic = monotonic
        self.enabled = True
        self._lock = threading.Lock()  # remember() runs in the Redis thread, changed() and forget() in the caller's
        self._topics: dict[str, np.ndarray] = {}
        self._since = monotonic()

    def changed(self, topic: str, parts: Sequence[int], deadlines: np.ndarray) -> np.ndarray:
        """Bool per row: whether its deadline may differ from what Redis holds."""
        if not self.enabled:
            return np.ones(len(parts), dtype=bool)
        with self._lock:
            if self.monotonic() - self._since > self.max_age_s:
                self._topics = {}
                self._since = self.monotonic()
            held = self._topics.get(topic)
        if held is None:
            return np.ones(len(parts), dtype=bool)
        ix = np.asarray(parts, dtype=np.int64)
        inside = ix < len(held)
        out = np.ones(len(parts), dtype=bool)
        out[inside] = held[ix[inside]] != deadlines[inside]
        return out

    def remember(self, topic: str, parts: Sequence[int], deadlines: Sequence[int]) -> None:
        """These values are in Redis now (called after the write returned)."""
        if not parts:
            return
        ix = np.asarray(parts, dtype=np.int64)
        with self._lock:
            if not self.enabled:
                return
            held = self._topics.get(topic)
            size = int(ix.max()) + 1
            if held is None or len(held) < size:
                grown = max(size, 2 * len(held) if held is not None else size)
                new = np.full(grown, UNKNOWN, dtype=np.int64)
                if held is not None:
                    new[: len(held)] = held
                held = self._topics[topic] = new
            held[ix] = np.asarray(deadlines, dtype=np.int64)

    def forget(self) -> None:
        """Redis may no longer hold what was written (a wipe): everything is unknown again."""
        with self._lock:
            self._topics = {}
            self._since = self.monotonic()

    def off(self) -> None:
        """Another process writes deadlines too: remember nothing from now on."""
        with self._lock:
            self.enabled = False
            self._topics = {}
