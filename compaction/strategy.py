"""KIP-280's rule for which record of a key survives compaction, as one pure ordering key.

`offset` keeps the highest offset; `timestamp` the highest record timestamp, ties to the highest offset; `header`
the highest version read from a header: a record whose header parses beats one without, neither carrying it falls
back to the highest offset, ties to the highest offset. A `header` strategy without a header name is `offset`.

The winner of a key is the record with the largest `order_key`: a max over tuples is associative and commutative, so
the same rule reduces a key's records in any order and in any grouping — per Spark partition, across the previous
generation and the new delta, or record by record (Pulsar's `shouldKeepLeft` is the pairwise form of it). Tombstones
compete like any record with their own version, so a late record with a lower version never brings a deleted key back
while the tombstone is kept (Pulsar's event-time compactor drops the tombstone's version and resurrects keys).

That is KIP-280's literal rule (`tombstone: version`). Its trade-off: a tombstone without the version header (what
Debezium and most producers write for a delete) loses to any versioned record of its key, so under `header` the key
stays live. `tombstone: latest` settles deletes by the log instead: a tombstone deletes its key when it is the key's
latest record, and only the records after a key's last tombstone compete by version (`replaces`, applied in log
order). A later record of a lower version can then bring a deleted key back, which is what the producer wrote.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from compactd.policy.thresholds import HeaderFormat, TombstoneRule

Kind = Literal["offset", "timestamp", "header"]
Headers = Sequence[tuple[str, bytes | None]]
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class Strategy:
    kind: Kind = "offset"
    header: str | None = None
    header_format: HeaderFormat = "long"
    tombstone: TombstoneRule = "version"

    @classmethod
    def of(
        cls,
        kind: Kind,
        header: str | None = None,
        header_format: HeaderFormat = "long",
        tombstone: TombstoneRule = "version",
    ) -> Strategy:
        """The strategy a topic's config names; `header` without a header name is KIP-280's fallback, `offset`."""
        if kind == "header" and not header:
            return cls("offset", tombstone=tombstone)
        return cls(kind, header if kind == "header" else None, header_format, tombstone)


def header_version(headers: Headers, name: str, fmt: HeaderFormat = "long") -> int | None:
    """The version a record's header carries, or None when it has none that parses (the last one of that name wins,
    as a Kafka header lookup by name returns it). `long`: 8 bytes big-endian signed (KIP-280's type); `decimal`: an
    ASCII integer within a long's range."""
    value: bytes | None = None
    found = False
    for key, raw in headers:
        if key == name:
            value, found = raw, True
    if not found or value is None:
        return None
    if fmt == "long":
        return int.from_bytes(value, "big", signed=True) if len(value) == 8 else None
    text = value.decode("ascii", errors="replace").strip()
    if not text or not (text.isdigit() or (text[0] in "+-" and text[1:].isdigit())):
        return None
    number = int(text)
    return number if LONG_MIN <= number <= LONG_MAX else None


def order_key(strategy: Strategy, offset: int, timestamp: int, headers: Headers = ()) -> tuple[int, int, int]:
    """The record of a key with the largest key wins. Same width for every strategy, so columns of keys compare."""
    if strategy.kind == "timestamp":
        return (timestamp, offset, 0)
    if strategy.kind == "header" and strategy.header:
        version = header_version(headers, strategy.header, strategy.header_format)
        return (0, 0, offset) if version is None else (1, version, offset)
    return (offset, 0, 0)


def replaces(
    strategy: Strategy, held: tuple[int, int, int], held_tombstone: bool, rank: tuple[int, int, int], tombstone: bool
) -> bool:
    """Whether a key's record (`rank`, `tombstone`), later in the log than the one held, takes its place. Under
    `tombstone: latest` a tombstone always does, and so does any record after a held tombstone."""
    if strategy.tombstone == "latest" and (tombstone or held_tombstone):
        return True
    return rank > held


def winner(strategy: Strategy, records: Iterable[tuple[int, int, Headers]]) -> tuple[int, int, Headers] | None:
    """The surviving (offset, timestamp, headers) among one key's records; None for no records."""
    best, best_key = None, None
    for rec in records:
        key = order_key(strategy, rec[0], rec[1], rec[2])
        if best_key is None or key > best_key:
            best, best_key = rec, key
    return best
