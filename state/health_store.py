"""State health: whether Redis still holds the state the checkpoint assumes (epoch, last merged batches, rebuild
targets, the readiness gate), and wiping it for a rebuild."""

from __future__ import annotations

from typing import Any

from compactd.state.store_base import StoreBase, _s


class HealthStore(StoreBase):
    """The state hash (`RedisKeys.state_health`), on a Redis Cluster its copy on every primary shard (the marks), and
    the whole-prefix wipe."""

    _marks: list[str] | None = None

    def health(self) -> dict[str, str]:
        """The state hash (`RedisKeys.state_health`): epoch, last merged batch per stream, rebuild targets, gate."""
        return {_s(k): _s(v) for k, v in self.r.hgetall(self.keys.state_health).items()}

    def shard_marks(self) -> dict[str, dict[str, str]]:
        """Each primary shard's mark (key -> its fields, {} when the shard lost it); {} on a single server."""
        return {key: {_s(k): _s(v) for k, v in self.r.hgetall(key).items()} for key in self._mark_keys()}

    def _mark_keys(self) -> list[str]:
        """One mark key per primary of the cluster now ([] on a single server): the first tags whose keys land on
        each primary, found by the client's own slot map."""
        if not self.cluster:
            return []
        primaries = {n.name for n in self.r.get_primaries()}
        if self._marks is None or len(self._marks) != len(primaries):
            owners: dict[str, str] = {}
            for i in range(100_000):
                key = self.keys.shard_mark(str(i))
                owners.setdefault(self.r.get_node_from_key(key).name, key)
                if len(owners) == len(primaries):
                    break
            self._marks = sorted(owners.values())
        return self._marks

    def claim_epoch(self, epoch: str) -> str:
        """Write `epoch` unless Redis already has one; returns the epoch Redis holds now. On a cluster every shard's
        mark takes it too (`marks` in the state hash says the marks are kept: a state from before them is not read
        as a loss)."""
        key = self.keys.state_health
        self.r.hsetnx(key, "epoch", epoch)
        held = _s(self.r.hget(key, "epoch"))
        if self.cluster:
            for mark in self._mark_keys():
                self.r.hsetnx(mark, "epoch", held)
            self.r.hset(key, "marks", "1")
        return held

    def epoch(self) -> str | None:
        value = self.r.hget(self.keys.state_health, "epoch")
        return None if value is None else _s(value)

    def mark_merged(self, stream_id: str, batch_id: int) -> None:
        """Record the last batch whose merge completed: a Redis (or, on a cluster, a shard) that later holds an older
        one lost writes."""
        self.r.hset(self.keys.state_health, f"batch:{stream_id}", batch_id)
        for mark in self._mark_keys():
            self.r.hset(mark, f"batch:{stream_id}", batch_id)

    def set_health(self, **fields: str | None) -> None:
        """Set (or, with None, remove) fields of the state hash: `rebuild` targets, the `gate`."""
        key = self.keys.state_health
        put = {k: v for k, v in fields.items() if v is not None}
        drop = [k for k, v in fields.items() if v is None]
        pipe = self.r.pipeline(transaction=False)
        if put:
            pipe.hset(key, mapping=put)
        if drop:
            pipe.hdel(key, *drop)
        pipe.execute()

    def has_state(self) -> bool:
        """Whether any topic was ever merged into this Redis."""
        return bool(self.r.exists(self.k_topics))

    def wipe(self) -> int:
        """Delete every key of this job's prefix (a rebuild starts from nothing); returns how many."""
        n = 0
        pattern = f"{self.prefix}:*"
        batch: list[Any] = []
        for key in self.r.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 500:
                n += self._delete(batch)
                batch = []
        if batch:
            n += self._delete(batch)
        return n
