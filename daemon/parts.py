"""What `Application` (daemon/application.py) builds in its constructor and both of its mixins use, the delete gate
(daemon/gate.py) and the run loop (daemon/run_loop.py): declared once, so that each attribute a mixin reads says
where it comes from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from compactd.control.controller import Controller
    from compactd.control.health import StateGuard
    from compactd.control.metrics import Metrics
    from compactd.control.runtime_config import RuntimeConfig
    from compactd.daemon.run_loop import RunSummary
    from compactd.kafka.config import KafkaConnection
    from compactd.policy.readiness import Readiness
    from compactd.settings import Settings
    from compactd.state.redis_store import RedisState
    from compactd.streaming.decode import Decoder


class JobParts:
    """The job's collaborators, each built once by `Application.__init__`."""

    settings: Settings
    conn: KafkaConnection
    state: RedisState
    metrics: Metrics
    controller: Controller
    config: RuntimeConfig
    guard: StateGuard
    decoder: Decoder
    summary: RunSummary
    spark_checkpoint: Path
    stream_id: str  # the checkpoint's stream, read at the start and again by a rebuild
    _admin: Any  # an Admin client for the end offsets, made on first use
    _segments_seen: bool  # a segment event merged into this state (health `segments_at`)
    # the delete gate's state (daemon/gate.py), which the run loop reads too: `readiness` is replaced each time the
    # gate is armed, with the targets of that moment
    readiness: Readiness
    lost: str | None  # why Redis is not the state the checkpoint assumes, until the rebuild starts
    rebuilding: bool
