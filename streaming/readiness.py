"""Readiness gate: no delete_records before the offsets topic has been read up to where it stood at start.

Until then the minimum committed offset may be built from a partial history (a group's newest commit, or its
tombstone, not read yet), so deletes are recorded as `skipped` with `detail.why = "offsets not caught up"`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path


class Readiness:
    def __init__(self, topic: str, targets: Mapping[str, int] | None) -> None:
        """`targets`: high watermark per partition (str) at start; None disables the gate."""
        self.topic = topic
        self.targets = dict(targets or {})
        self._ready = targets is None or all(v <= 0 for v in self.targets.values())

    def ready(self) -> bool:
        return self._ready

    def observe(self, source_offsets: Mapping[str, Mapping[str, int]]) -> bool:
        """Feed the end offsets of a batch; True when this call opened the gate."""
        if self._ready:
            return False
        reached = source_offsets.get(self.topic, {})
        if all(int(reached.get(p, 0)) >= hw for p, hw in self.targets.items()):
            self._ready = True
            return True
        return False


def batch_end_offsets(spark_checkpoint: Path, batch_id: int | None = None) -> dict[str, dict[str, int]]:
    """End offsets Spark logged for a batch (the latest one if batch_id is None); {} if there is none.

    The offset log is written before the batch runs, so inside foreachBatch it already names this batch's end.
    """
    folder = spark_checkpoint / "offsets"
    if batch_id is None:
        ids = [int(p.name) for p in folder.glob("*") if p.name.isdigit()] if folder.is_dir() else []
        if not ids:
            return {}
        batch_id = max(ids)
    path = folder / str(batch_id)
    if not path.is_file():
        return {}
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    # "v1", the batch metadata, then one line per source: ours is the only source
    return json.loads(lines[-1]) if len(lines) >= 3 else {}
