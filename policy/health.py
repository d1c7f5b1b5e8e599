"""Whether Redis still holds the state the job's checkpoint assumes (pure: no Redis, no files).

Redis is compactd's system of record, but Redis can lose it: a restart without persistence, a failover that drops
the writes not yet replicated, a FLUSHALL. A minimum committed offset computed from what is left would let a delete
pass a group whose commits were lost. So the job keeps two facts in both places and compares them:

- an **epoch**, a random id written once into a fresh Redis and into the checkpoint directory: a Redis without it,
  or with another one, is not the state this checkpoint built;
- the **last merged batch** of the stream, written after every merge: a Redis that holds an older one than the
  checkpoint completed (or than this process merged) lost writes.

Either mismatch is a loss: deletes are held, the state is wiped and rebuilt from the sources (see
`daemon/application.py`), and deletes resume once the rebuild has read the sources up to where they stood.
"""

from __future__ import annotations

from collections.abc import Mapping


def batch_field(stream_id: str) -> str:
    return f"batch:{stream_id}"


def state_loss(
    checkpoint_epoch: str | None,
    health: Mapping[str, str],
    stream_id: str,
    merged_at_least: int | None,
    has_state: bool,
    shards: Mapping[str, Mapping[str, str]] | None = None,
) -> str | None:
    """Why this Redis is not the state the checkpoint assumes, on one line; None when it is.

    `checkpoint_epoch`: the epoch kept beside the checkpoint (None: none yet). `health`: the Redis state hash.
    `merged_at_least`: the newest batch known merged (the checkpoint's last completed batch, or the last batch this
    process merged); None when nothing was. `has_state`: any topic was ever merged into this Redis. `shards`: on a
    Redis Cluster, each primary's mark (its copy of the epoch and merged batches): the state hash lives on one shard,
    and a failover of another that lost its writes shows only there.
    """
    epoch = health.get("epoch")
    if checkpoint_epoch is None:
        # a checkpoint from before epochs (an upgrade) or a new one: trust a Redis that holds state, unless the
        # checkpoint says batches were merged and Redis holds nothing at all
        if merged_at_least is not None and epoch is None and not has_state:
            return f"Redis holds no state, but the checkpoint has merged up to batch {merged_at_least}"
        return None
    if epoch is None:
        return "Redis holds no state epoch (restarted without persistence, flushed, or another database)"
    if epoch != checkpoint_epoch:
        return f"Redis holds state epoch {epoch[:8]}, the checkpoint expects {checkpoint_epoch[:8]}"
    for key, mark in sorted((shards or {}).items()) if health.get("marks") else ():
        if mark.get("epoch") != epoch:
            return f"a Redis Cluster shard lost its writes ({key} holds {'no mark' if not mark else 'another epoch'})"
        done = mark.get(batch_field(stream_id))
        if merged_at_least is not None and (done is None or int(done) < merged_at_least):
            return (
                f"a Redis Cluster shard lost writes ({key}: last merged batch {done or 'none'}, "
                f"batch {merged_at_least} was merged)"
            )
    if merged_at_least is None:
        return None
    merged = health.get(batch_field(stream_id))
    if merged is None or int(merged) < merged_at_least:
        return (
            f"Redis lost writes: its last merged batch is {merged if merged is not None else 'none'}, "
            f"batch {merged_at_least} was merged (a failover or a restart lost them)"
        )
    return None
