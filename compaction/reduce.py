"""Phase one of a compaction run, as pure rules: where the horizon stops, and which records the next generation keeps.

A generation of partition p holds, in source-offset order, the winning record of every live key below the horizon.
The next one is the previous generation plus the source from the previous horizon to the new one, reduced per key
under the topic's strategy (`strategy.order_key`). Spark runs the same reduction for scale (a shuffle that spills,
not a heap map of every key); these functions are its reference and its tests' model.

Deletes, as Kafka's cleaner keeps them: a winning tombstone stays in the view for `delete.retention.ms` from the run
that first wrote it (its `compactd.deleted_at` header), so readers of the view learn of the delete, and a late record
of a lower version cannot bring the key back meanwhile; after that it is dropped. Records without a key cannot be
compacted: dropped and counted, or kept as they are with `compaction.retain.null.key`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from compactd.compaction.strategy import Headers, Strategy, order_key, replaces

DELETED_AT = "compactd.deleted_at"  # when a tombstone first entered the view (epoch ms, decimal ASCII)


@dataclass(frozen=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers = ()

    @property
    def tombstone(self) -> bool:
        return self.value is None


@dataclass
class Counts:
    records_in: int = 0
    null_keys: int = 0
    tombstones: int = 0  # tombstones the generation keeps
    tombstones_expired: int = 0  # dropped after delete.retention.ms
    keys: int = 0  # live keys (winners that are not tombstones)


def horizon(start: int, last_stable: int, timestamps: Iterable[tuple[int, int]], now: int, min_lag_ms: int) -> int:
    """Where this run's horizon stops: the last stable offset, or the first record at or after `start` younger than
    `min.compaction.lag.ms` (records that young stay beyond the horizon); never before `start`.

    `timestamps`: (offset, timestamp) of the source records from `start` on, in offset order.
    """
    if min_lag_ms <= 0:
        return max(start, last_stable)
    for offset, ts in timestamps:
        if offset >= last_stable:
            break
        if offset >= start and ts > now - min_lag_ms:
            return offset
    return max(start, last_stable)


def deleted_at(rec: Record) -> int | None:
    for name, raw in rec.headers:
        if name == DELETED_AT and raw is not None and raw.isdigit():
            return int(raw)
    return None


def settle(rec: Record, now: int, delete_retention_ms: int) -> tuple[Record | None, str]:
    """What the view keeps of a key's winner: ("key", the record), ("tombstone", the tombstone stamped with when it
    first entered the view), or ("expired", None) once it has stayed `delete.retention.ms`."""
    if not rec.tombstone:
        return rec, "key"
    since = deleted_at(rec)
    if since is None:  # written into the view for the first time by this run
        return replace(rec, headers=(*rec.headers, (DELETED_AT, str(now).encode()))), "tombstone"
    if now - since >= delete_retention_ms:
        return None, "expired"
    return rec, "tombstone"


def reduce_partition(
    previous: Iterable[Record],
    delta: Iterable[Record],
    strategy: Strategy,
    now: int,
    delete_retention_ms: int = 86_400_000,
    retain_null_key: bool = False,
) -> tuple[list[Record], Counts]:
    """The next generation of one partition: the previous generation's records and the delta's (each in log order,
    the previous generation's first), one winner per key, in source-offset order; and what was counted on the way."""
    counts = Counts()
    best: dict[bytes, tuple[tuple[int, int, int], Record]] = {}
    kept_null: list[Record] = []
    for rec in (*previous, *delta):
        counts.records_in += 1
        if rec.key is None:
            counts.null_keys += 1
            if retain_null_key:
                kept_null.append(rec)
            continue
        rank = order_key(strategy, rec.offset, rec.timestamp, rec.headers)
        held = best.get(rec.key)
        if held is None or replaces(strategy, held[0], held[1].tombstone, rank, rec.tombstone):
            best[rec.key] = (rank, rec)
    out: list[Record] = list(kept_null)
    for _, rec in best.values():
        kept, what = settle(rec, now, delete_retention_ms)
        if what == "expired":
            counts.tombstones_expired += 1
        elif what == "tombstone":
            counts.tombstones += 1
        else:
            counts.keys += 1
        if kept is not None:
            out.append(kept)
    out.sort(key=lambda r: r.offset)
    return out, counts
