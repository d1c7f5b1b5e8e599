"""Redis state, the system of record: partitions, group offsets, deadlines, and the action outbox.

The key layout is in `state/keys.py`; what callers may use is in `state/protocols.py`. `RedisState` is one class
made of one mixin per kind of data stored, all sharing one connection:

- `store_base`: the client, the Lua scripts, `from_url`, `start` and `upgrade`, sizes, key deletion;
- `merge_store`: merging a batch (lua/merge.lua), counted and required groups (lua/recount.lua);
- `read_store`: topics, partitions, views, `explain` details, group offsets (`TopicGroups`, `PartitionDetail`);
- `outbox_store`: deadlines and compaction-due times, action records and the outbox;
- `topic_store`: topic IDs, resets and forgetting of re-created and deleted topics;
- `health_store`: the state hash (epoch, merged batches, rebuild, gate) and the wipe for a rebuild;
- `config_store`: runtime config layers and compaction nudge bookkeeping.
"""

from __future__ import annotations

from compactd.model import PartitionNumbers
from compactd.state.config_store import ConfigStore
from compactd.state.health_store import HealthStore
from compactd.state.merge_store import MergeStore
from compactd.state.outbox_store import OutboxStore
from compactd.state.read_store import PartitionDetail, ReadStore, TopicGroups, decode_partition_record
from compactd.state.store_base import MAX_SAFE_INT, SCRIPTS
from compactd.state.topic_store import TopicLifecycleStore

__all__ = [
    "MAX_SAFE_INT",
    "SCRIPTS",
    "PartitionDetail",
    "PartitionNumbers",
    "RedisState",
    "TopicGroups",
    "decode_partition_record",
]


class RedisState(MergeStore, ReadStore, OutboxStore, TopicLifecycleStore, HealthStore, ConfigStore):
    """Narrow interface over Redis: merge a batch, read views, schedule deadlines, keep the outbox."""
