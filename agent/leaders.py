"""Which partitions this broker leads: the log-dir agent reports a partition from its leader's log only.

Every replica keeps its own log and runs its own cleaner. A follower's cleaner may have compacted its copy while the
leader's log, the one readers fetch, is still dirty, and segment events from every broker's agent are merged by
their largest value: a follower's `compacted` event would answer a nudge the leader never took. So an agent
publishes only the partitions its broker leads now, as the cluster's metadata says. The broker is the one whose log
dir it reads: `node.id` (KRaft) or `broker.id` (ZooKeeper) in the log dir's `meta.properties`. When the leaders
cannot be read, the scan publishes nothing (unknown: the next scan asks again); when leadership moves, the new
leader's agent publishes the partition from its own log.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from compactd.kafka.admin import admin_client, retire
from compactd.kafka.config import KafkaConnection
from compactd.model import PartitionRef

log = logging.getLogger("compactd.agent")


def node_id(log_dir: Path) -> int | None:
    """The broker id a log dir belongs to, from its `meta.properties`; None when there is none to read."""
    try:
        lines = (log_dir / "meta.properties").read_text().splitlines()
    except OSError:
        return None
    props = dict(ln.split("=", 1) for ln in lines if "=" in ln and not ln.startswith("#"))
    raw = props.get("node.id", props.get("broker.id", "")).strip()
    return int(raw) if raw.lstrip("-").isdigit() else None


class Leaders:
    """The partitions broker `node` leads, from one metadata request per scan; constructed unconnected. The same
    request gives every partition's replica assignment (`assignment`), which the agent's `replica_log` reports carry."""

    def __init__(self, conn: KafkaConnection, node: int, timeout_s: float = 10.0) -> None:
        self.conn, self.node, self.timeout_s = conn, node, timeout_s
        self._admin: Any = None
        self._assignment: dict[PartitionRef, tuple[int, ...]] = {}

    def assignment(self, tp: PartitionRef) -> tuple[int, ...] | None:
        """The partition's replicas as the last scan's metadata gave them (None: not known)."""
        return self._assignment.get(tp)

    def __call__(self) -> set[PartitionRef] | None:
        if self._admin is None:
            self._admin = admin_client(self.conn, self.timeout_s)
        try:
            topics = self._admin.list_topics(timeout=self.timeout_s).topics
        except Exception as exc:  # unknown: nothing published this scan
            log.debug("leaders not read this scan: %s", exc)
            retire(self._admin)  # waiting on a node that died or stalled: the next scan asks with a new client
            self._admin = None
            return None
        self._assignment = {
            (name, p): tuple(pm.replicas) for name, md in topics.items() for p, pm in md.partitions.items()
        }
        return {(name, p) for name, md in topics.items() for p, pm in md.partitions.items() if pm.leader == self.node}
