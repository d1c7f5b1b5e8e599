"""The one formatter and parser of the `"<topic>/<partition>"` key.

It is the key of segment events and action records, the member of Redis' deadline sets and the tail of a
`partition:` threshold scope. Topic names cannot contain `/`, so the last `/` splits it.
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
