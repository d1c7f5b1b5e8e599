"""Never trust Redis further than it can be verified: detect a lost state, hold deletes, rebuild from the sources.

The rules are in `policy/health.py`; this is their IO: the epoch kept beside the checkpoint and in Redis, the last
merged batch, the rebuild's targets (kept in Redis, so a job that dies mid-rebuild resumes it), and the delete gate
as operators see it (`compactd explain`).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from pathlib import Path

from compactd.model import SourceOffsets
from compactd.policy.health import batch_field, state_loss
from compactd.state.redis_store import RedisState
from compactd.streaming.checkpoint import last_completed_batch, read_epoch, reset_stream, write_epoch

log = logging.getLogger("compactd.state")

REBUILDING = "state rebuilding after a loss"


class StateGuard:
    def __init__(self, state: RedisState, checkpoint_dir: str | Path, spark_checkpoint: Path) -> None:
        self.state = state
        self.checkpoint_dir = Path(checkpoint_dir)
        self.spark_checkpoint = spark_checkpoint
        self.epoch: str | None = None  # the epoch this process verified, once it has
        self.merged: int | None = None  # newest batch known merged into this Redis, by this stream

    def loss_at_start(self, stream_id: str) -> str | None:
        """Compare Redis with the checkpoint before anything is read; on agreement, adopt (or create) the epoch."""
        self.merged = last_completed_batch(self.spark_checkpoint)
        ours = read_epoch(self.checkpoint_dir)
        health = self.state.health()
        why = state_loss(ours, health, stream_id, self.merged, self.state.has_state(), self.state.shard_marks())
        if why is None:
            self.epoch = self.state.claim_epoch(ours or uuid.uuid4().hex)
            if ours != self.epoch:  # adopted: a new checkpoint, or one from before epochs (an upgrade)
                write_epoch(self.checkpoint_dir, self.epoch)
                if self.merged is not None and batch_field(stream_id) not in health:
                    self.state.mark_merged(stream_id, self.merged)
        return why

    def loss_now(self, stream_id: str) -> str | None:
        """The same comparison while running: one small read, before every merge and on every tick. What this process
        merged is taken before Redis is read: the batch thread marks a batch in Redis, then remembers it, so Redis
        must hold at least what was remembered before the read (taken after, a batch merged in between read as lost
        writes, and the state was wiped and rebuilt for nothing)."""
        merged = self.merged
        return state_loss(
            self.epoch, self.state.health(), stream_id, merged, has_state=True, shards=self.state.shard_marks()
        )

    def intact(self) -> bool:
        """Right before a delete is decided or sent: Redis still holds our epoch (a flush since the last check)."""
        return self.epoch is not None and self.state.epoch() == self.epoch

    def merged_batch(self, stream_id: str, batch_id: int) -> None:
        self.state.mark_merged(stream_id, batch_id)
        self.merged = batch_id

    def begin_rebuild(self, targets: SourceOffsets) -> None:
        """Wipe what is left, start a new epoch whose rebuild must read the sources up to `targets`, and forget the
        stream's progress. Each step is safe to repeat: a crash anywhere in here is a loss again at the next start."""
        wiped = self.state.wipe()
        self.epoch = uuid.uuid4().hex
        self.state.claim_epoch(self.epoch)
        self.state.set_health(rebuild=json.dumps(targets, sort_keys=True))
        write_epoch(self.checkpoint_dir, self.epoch)
        reset_stream(self.checkpoint_dir, self.spark_checkpoint)
        self.merged = None
        log.info("rebuilding the state from the sources: %d keys wiped, reading up to %s", wiped, dict(targets))

    def rebuild_targets(self) -> dict[str, dict[str, int]] | None:
        raw = self.state.health().get("rebuild")
        return None if raw is None else json.loads(raw)

    def rebuild_done(self) -> None:
        self.state.set_health(rebuild=None)

    def show_gate(self, is_open: bool, why: str) -> None:
        """The delete gate as `compactd explain` reads it."""
        gate = {"open": is_open, "why": "" if is_open else why, "since": int(time.time() * 1000)}
        self.state.set_health(gate=json.dumps(gate, sort_keys=True))
