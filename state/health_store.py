"""State health: whether Redis still holds the state the checkpoint assumes (epoch, last merged batches, rebuild
targets, the readiness gate), and wiping it for a rebuild."""

from __future__ import annotations

from typing import Any

from compactd.state.store_base import StoreBase, _s


class HealthStore(StoreBase):
    """The state hash (`RedisKeys.state_health`) and the whole-prefix wipe."""

    def health(self) -> dict[str, str]:
        """The state hash (`RedisKeys.state_health`): epoch, last merged batch per stream, rebuild targets, gate."""
        return {_s(k): _s(v) for k, v in self.r.hgetall(self.keys.state_health).items()}

    def claim_epoch(self, epoch: str) -> str:
        """Write `epoch` unless Redis already has one; returns the epoch Redis holds now."""
        key = self.keys.state_health
        self.r.hsetnx(key, "epoch", epoch)
        return _s(self.r.hget(key, "epoch"))

    def epoch(self) -> str | None:
        value = self.r.hget(self.keys.state_health, "epoch")
        return None if value is None else _s(value)

    def mark_merged(self, stream_id: str, batch_id: int) -> None:
        """Record the last batch whose merge completed: a Redis that later holds an older one lost writes."""
        self.r.hset(self.keys.state_health, f"batch:{stream_id}", batch_id)

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
