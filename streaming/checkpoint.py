"""What compactd reads from and keeps in a checkpoint directory: the stream's identity and Spark's offset log."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path


def stream_id_for(checkpoint_dir: str | Path) -> str:
    """Identity of the stream that owns a checkpoint: batch ids are only comparable within it."""
    path = Path(checkpoint_dir)
    path.mkdir(parents=True, exist_ok=True)
    marker = path / "compactd-stream-id"
    if not marker.exists():
        tmp = path / f".stream-id.{uuid.uuid4()}"
        tmp.write_text(str(uuid.uuid4()))
        os.replace(tmp, marker)
    return marker.read_text().strip()


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


@dataclass(frozen=True)
class PlannedOffsets:
    """Where the stream's sources stand, read from its checkpoint when called (the planned end of the latest batch):
    what a topic reset records beside its cause (sinks/nudge_ledger.py `LifecycleRecords`)."""

    spark_checkpoint: Path

    def __call__(self) -> dict[str, dict[str, int]]:
        return batch_end_offsets(self.spark_checkpoint)


def completed_end_offsets(spark_checkpoint: Path) -> dict[str, dict[str, int]]:
    """End offsets of the last batch Spark marked complete (its `commits/` log); {} before the first one."""
    folder = spark_checkpoint / "commits"
    ids = [int(p.name) for p in folder.glob("*") if p.name.isdigit()] if folder.is_dir() else []
    return batch_end_offsets(spark_checkpoint, max(ids)) if ids else {}


EPOCH_FILE = "compactd-state-epoch"


def read_epoch(checkpoint_dir: str | Path) -> str | None:
    """The Redis state epoch this checkpoint was built against (policy/health.py); None before the first."""
    path = Path(checkpoint_dir) / EPOCH_FILE
    return path.read_text().strip() if path.is_file() else None


def write_epoch(checkpoint_dir: str | Path, epoch: str) -> None:
    path = Path(checkpoint_dir)
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / f".epoch.{uuid.uuid4()}"
    tmp.write_text(epoch)
    os.replace(tmp, path / EPOCH_FILE)


def last_completed_batch(spark_checkpoint: Path) -> int | None:
    """The newest batch Spark marked complete: its merge into Redis had finished."""
    folder = spark_checkpoint / "commits"
    ids = [int(p.name) for p in folder.glob("*") if p.name.isdigit()] if folder.is_dir() else []
    return max(ids) if ids else None


def reset_stream(checkpoint_dir: str | Path, spark_checkpoint: Path) -> None:
    """Forget the stream's progress and identity: the next query reads every source from its start, under a new
    stream id (batch ids restart at 0, and must not be taken for batches the lost state had merged)."""
    shutil.rmtree(spark_checkpoint, ignore_errors=True)
    (Path(checkpoint_dir) / "compactd-stream-id").unlink(missing_ok=True)


SOURCE_MARKER = "compactd-source"
CONNECTOR = "spark-sql-kafka-0-10"


def adopt_source(spark_checkpoint: Path) -> bool:
    """Mark the checkpoint as read by Spark's Kafka connector; True if it holds batches an earlier compactd read with
    its own Python source. Both write a batch's offsets as `{"topic": {"partition": next offset}}`, the connector's
    format, so the connector resumes where that source stopped: nothing is read twice or skipped."""
    marker = spark_checkpoint / SOURCE_MARKER
    if marker.is_file():
        return False
    earlier = bool(batch_end_offsets(spark_checkpoint))
    spark_checkpoint.mkdir(parents=True, exist_ok=True)
    tmp = spark_checkpoint / f".source.{uuid.uuid4()}"
    tmp.write_text(CONNECTOR)
    os.replace(tmp, marker)
    return earlier
