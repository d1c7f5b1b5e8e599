"""The state epoch against a real Redis: a flush, a restart without data and lost writes are named as losses; an
upgrade from a checkpoint without an epoch is adopted; a rebuild wipes only this job's keys and resets the stream."""

from __future__ import annotations

from pathlib import Path

import redis

from compactd.control.health import StateGuard
from compactd.model import Segment
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState
from compactd.streaming.checkpoint import read_epoch, stream_id_for


def guard(rclient: redis.Redis, ckpt: Path, prefix: str = "cd") -> StateGuard:
    return StateGuard(RedisState(rclient, prefix), ckpt, ckpt / "spark")


def completed(ckpt: Path, batch: int) -> None:
    """What Spark's checkpoint says after batch `batch` completed."""
    (ckpt / "spark" / "commits").mkdir(parents=True, exist_ok=True)
    (ckpt / "spark" / "commits" / str(batch)).write_text("v1\n{}\n")


def merged_something(rclient: redis.Redis, prefix: str = "cd") -> None:
    c = BatchChanges()
    c.topic("orders").segments.append((0, Segment(0, 100, 5, 10, 6)))
    RedisState(rclient, prefix).merge("s", 0, c, lambda g, t: True)


def test_a_fresh_start_claims_an_epoch_that_a_restart_finds_again(rclient, tmp_path) -> None:
    g = guard(rclient, tmp_path)
    assert g.loss_at_start("s") is None and g.epoch == read_epoch(tmp_path) is not None
    g.merged_batch("s", 0)
    completed(tmp_path, 0)
    again = guard(rclient, tmp_path)
    assert again.loss_at_start("s") is None and again.epoch == g.epoch and again.intact()


def test_flushall_is_a_loss_at_start_and_while_running(rclient, tmp_path) -> None:
    g = guard(rclient, tmp_path)
    g.loss_at_start("s")
    g.merged_batch("s", 3)
    rclient.flushall()
    assert not g.intact()
    assert "no state epoch" in (g.loss_now("s") or "")
    completed(tmp_path, 3)
    assert "no state epoch" in (guard(rclient, tmp_path).loss_at_start("s") or "")


def test_writes_lost_in_a_failover_are_a_loss(rclient, tmp_path) -> None:
    g = guard(rclient, tmp_path)
    g.loss_at_start("s")
    g.merged_batch("s", 5)
    rclient.hset(g.state.keys.state_health, "batch:s", 3)  # the replica had not seen batches 4 and 5
    assert "lost writes" in (g.loss_now("s") or "")
    completed(tmp_path, 5)
    assert "lost writes" in (guard(rclient, tmp_path).loss_at_start("s") or "")


def test_a_batch_merged_while_a_tick_reads_the_state_hash_is_no_loss(rclient, tmp_path) -> None:
    """The run loop's tick checks the state while the batch thread merges. A batch that completes (its mark written,
    then remembered) between the tick's read of the state hash and its look at what was merged is no loss. Before:
    "Redis lost writes: its last merged batch is none, batch 0 was merged" right after a rebuild's first batch, and
    the state was wiped and rebuilt a second time (a clean-clone make test, test_state_loss)."""
    g = guard(rclient, tmp_path)
    g.loss_at_start("s")
    read = g.state.health

    def read_then_merge() -> dict[str, str]:
        seen = read()
        g.merged_batch("s", 0)  # the batch thread, right after the tick's read
        return seen

    g.state.health = read_then_merge  # type: ignore[method-assign]
    assert g.loss_now("s") is None
    g.state.health = read  # type: ignore[method-assign]
    assert g.loss_now("s") is None and g.merged == 0


def test_an_upgraded_checkpoint_without_an_epoch_adopts_the_state_it_finds(rclient, tmp_path) -> None:
    merged_something(rclient)
    completed(tmp_path, 7)  # batches merged by a version that kept no epoch and no batch marker
    g = guard(rclient, tmp_path)
    assert g.loss_at_start("s") is None and read_epoch(tmp_path) == g.epoch
    assert g.loss_now("s") is None  # no false loss at the next merge


def test_an_empty_redis_under_a_checkpoint_without_an_epoch_is_a_loss(rclient, tmp_path) -> None:
    completed(tmp_path, 7)
    assert "holds no state" in (guard(rclient, tmp_path).loss_at_start("s") or "")


def test_a_rebuild_wipes_only_this_jobs_keys_and_forgets_the_streams_progress(rclient, tmp_path) -> None:
    merged_something(rclient, "cd:a")
    merged_something(rclient, "cd:ab")  # another cluster's job sharing the Redis
    stream = stream_id_for(tmp_path)
    completed(tmp_path, 4)
    g = guard(rclient, tmp_path, "cd:a")
    g.loss_at_start(stream)
    old = g.epoch
    g.begin_rebuild({"commits": {"0": 12}})
    assert rclient.keys("cd:a:{orders}*") == [] and rclient.keys("cd:ab:{orders}*") != []
    assert g.epoch != old and read_epoch(tmp_path) == g.epoch and g.intact()
    assert g.rebuild_targets() == {"commits": {"0": 12}}
    assert not (tmp_path / "spark").exists() and stream_id_for(tmp_path) != stream
    assert g.loss_now(stream_id_for(tmp_path)) is None
    g.rebuild_done()
    assert g.rebuild_targets() is None
