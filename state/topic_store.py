"""Topic lifecycle: which incarnation (topic ID) a topic's state describes, and dropping that state when the topic
is re-created or deleted (control/identity.py), with the causes `explain` shows."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from compactd.keys import partition_key
from compactd.state.store_base import StoreBase, _s


class TopicLifecycleStore(StoreBase):
    """Topic IDs, resets and forgetting of re-created and deleted topics."""

    def topic_id(self, topic: str) -> str | None:
        """The topic ID (KIP-516) the topic's state describes, if the cluster reported one when it was recorded."""
        raw = self.r.hget(self.keys.topic_ids, topic)
        return None if raw is None else _s(raw)

    def topic_ids(self, topics: Sequence[str]) -> list[str | None]:
        """`topic_id` of many topics, in one call."""
        raws = self.r.hmget(self.keys.topic_ids, list(topics)) if topics else []
        return [None if raw is None else _s(raw) for raw in raws]

    def set_topic_ids(self, ids: Mapping[str, str]) -> None:
        """Bind topics' state to these topic IDs (one call)."""
        if ids:
            self.r.hset(self.keys.topic_ids, mapping=dict(ids))

    def reset_topic(self, topic: str, why: str, now: int) -> list[int]:
        """The topic's log is not the one its state describes: drop its partitions' log state, the groups' offsets
        on it, their deadlines and live actions (lua/reset.lua has what stays); remember why for `explain`.
        Returns the partitions that had state."""
        parts = sorted(int(_s(n)) for n in self._script("reset")(keys=[self.topic_base(topic)]))
        self._drop_partitions(topic, parts)
        cause = json.dumps({"at": now, "why": why, "partitions": len(parts)})
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(self.keys.resets, topic, cause)
        pipe.hdel(self.keys.topic_ids, topic)
        pipe.execute()
        return parts

    def forget_topic(self, topic: str) -> list[int]:
        """The topic was deleted and not created again: every key of its state goes (a nudge's original value too:
        there is no topic to put it back on). Returns the partitions that had state."""
        parts = self.partitions(topic)
        self._drop_partitions(topic, parts)
        keys = list(self.r.scan_iter(match=f"{self.topic_base(topic)}:*", count=1000))
        for start in range(0, len(keys), 500):
            self._delete(keys[start : start + 500])
        nudges = [k for k in self.r.hkeys(self.k_nudge) if _s(k).partition("|")[0] == topic]
        pipe = self.r.pipeline(transaction=False)
        pipe.srem(self.k_topics, topic)
        pipe.hdel(self.keys.topic_ids, topic)
        pipe.hdel(self.keys.resets, topic)
        if nudges:
            pipe.hdel(self.k_nudge, *nudges)
        pipe.execute()
        return parts

    def note_unlisted(self, topic: str, groups: Sequence[str], now: int) -> None:
        """Counted groups the cluster did not list at the last delete check of the topic, for `explain`."""
        self.r.hset(self.keys.unlisted, topic, json.dumps({"at": now, "groups": list(groups)}))

    def unlisted(self, topic: str) -> dict[str, Any] | None:
        raw = self.r.hget(self.keys.unlisted, topic)
        return None if raw is None else json.loads(raw)

    def save_readers(self, doc: Mapping[str, Any]) -> None:
        """The readers as the job last read them (control/readers.py), for `explain`."""
        self.r.hset(self.keys.state_health, "readers", json.dumps(doc))

    def readers(self) -> dict[str, Any] | None:
        raw = self.r.hget(self.keys.state_health, "readers")
        return None if raw is None else json.loads(raw)

    def restore_reset(self, topic: str, cause: dict[str, Any]) -> None:
        """A reset's cause read back from the ledger after a state loss, for `explain`."""
        self.r.hset(self.keys.resets, topic, json.dumps(cause))

    def reset_cause(self, topic: str) -> dict[str, Any] | None:
        """The topic's last reset ({"at", "why", "partitions"}), for `explain`; None if it never had one."""
        raw = self.r.hget(self.keys.resets, topic)
        return None if raw is None else json.loads(raw)

    def _drop_partitions(self, topic: str, parts: Sequence[int]) -> None:
        """Deadlines and live action records of these partitions (they live in other slots than the topic's keys)."""
        for start in range(0, len(parts), 5000):
            members = [partition_key(topic, n) for n in parts[start : start + 5000]]
            slots = [f"{m}/{kind}" for m in members for kind in ("compact", "delete_records")]
            pipe = self.r.pipeline(transaction=False)
            pipe.zrem(self.k_deadlines, *members)
            pipe.hdel(self.k_rec, *slots)
            pipe.zrem(self.k_outbox, *slots)
            pipe.execute()
