"""The one formatter and parser of the `"<topic>/<partition>"` key, and the agent topic's `"admin/<cluster>"`.

The first is the key of segment events and action records, the member of Redis' deadline sets and the tail of a
`partition:` threshold scope. Topic names cannot contain `/`, so the last `/` splits it. The second is written by the
admin agent and read by the job's delete gate, neither of which imports the other.
"""

from __future__ import annotations

from compactd.errors import ConfigError


def partition_key(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def parse_partition_key(key: str | bytes) -> tuple[str, int]:
    """`"orders/3"` → `("orders", 3)`; ConfigError for anything else."""
    text = key.decode() if isinstance(key, bytes) else key
    topic, sep, num = text.rpartition("/")
    if not sep or not topic or not num.isdigit():
        raise ConfigError(f"invalid partition key {text!r}: expected <topic>/<partition>")
    return topic, int(num)


def mark_key(cluster: str) -> str:
    """The key of a cluster's poll marks on the agent topic (compacted: the newest mark per cluster stays)."""
    return f"admin/{cluster}"
