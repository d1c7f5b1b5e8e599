"""Label values known before anything happens, in one place.

`Metrics` exports a series for each at 0 from start-up: a counter that only appears at its first increment hides
that increment from `increase()` (the first burst of DLQ records would never fire the alert) and leaves dashboard
panels at "No data". The decoders name their DLQ reasons with the constants below, so a reason cannot be added
without its series (`tests/unit/test_metrics_start.py` feeds the decoders bad input and checks).
"""

from __future__ import annotations

from typing import Final

from compactd.model import ActionKind, Reason, Status

# DLQ reasons (`compactd_dlq_records_total{reason}` and the DLQ record's `reason`)
NULL_VALUE: Final = "null_value"
OVERSIZED: Final = "oversized"
MALFORMED_JSON: Final = "malformed_json"
UNKNOWN_TYPE: Final = "unknown_type"
INVALID_FIELD: Final = "invalid_field"
UNDECODABLE: Final = "undecodable"  # a `__consumer_offsets` record the binary codec cannot read
UNKNOWN_TOPIC: Final = "unknown_topic"  # a record from a topic the decoder was not configured for
INVALID_CONFIG: Final = "invalid_config"
BAD_SIGNATURE: Final = "bad_signature"
STALE_VERSION: Final = "stale_version"

_JSON_EVENTS = (NULL_VALUE, OVERSIZED, MALFORMED_JSON, UNKNOWN_TYPE, INVALID_FIELD)

# stream -> the reasons its records can be rejected with (`streaming.decode.Decoder` names the streams)
DLQ_REASONS: Final[dict[str, tuple[str, ...]]] = {
    "segments": _JSON_EVENTS,
    "commits": _JSON_EVENTS,
    "consumer_offsets": (UNDECODABLE, INVALID_FIELD),
    "config": (NULL_VALUE, OVERSIZED, MALFORMED_JSON, INVALID_CONFIG, BAD_SIGNATURE, STALE_VERSION),
    "unknown": (UNKNOWN_TOPIC,),
}

# stream -> kinds of `compactd_input_records_total` ("rejected" counts the DLQ's records; `skipped_key_v<N>` of
# `__consumer_offsets` depends on the broker and appears when it does)
INPUT_KINDS: Final[dict[str, tuple[str, ...]]] = {
    "segments": ("segment_rolled", "compacted", "log_start", "rejected"),
    "commits": ("offset_commit", "offset_delete", "group_delete", "rejected"),
    "consumer_offsets": ("offset_commit", "offset_delete", "group_delete", "group_metadata", "rejected"),
    "config": ("config",),
}

# The reasons each action is decided for (policy.rules, and the controller's restore once a nudge is answered)
ACTION_REASONS: Final[dict[ActionKind, tuple[Reason, ...]]] = {
    "compact": ("max_compaction_lag",),
    "delete_records": ("consumed_retention", "forced_retention"),
    "restore_config": ("compacted", "nudge_expired", "takeover_ended"),
    # a run of the compaction service (compaction/): the view's first generation, bytes beyond its horizon, or
    # records beyond its horizon for max.compaction.lag.ms
    "compact_view": ("first_generation", "compaction_threshold", "max_compaction_lag"),
    "take_retention": ("retention_takeover",),
}
# Final statuses an action is counted with (never "pending"); a restore is never dry-run and no guard skips it
ACTION_STATUSES: Final[dict[ActionKind, tuple[Status, ...]]] = {
    "compact": ("dry_run", "sent", "failed", "skipped"),
    "delete_records": ("dry_run", "sent", "failed", "skipped"),
    "restore_config": ("sent", "failed"),
    "compact_view": ("dry_run", "sent", "failed", "skipped"),
    "take_retention": ("sent",),
}
ACTION_OUTCOMES: Final[tuple[tuple[ActionKind, Reason, Status], ...]] = tuple(
    (action, reason, status)
    for action, reasons in ACTION_REASONS.items()
    for reason in reasons
    for status in ACTION_STATUSES[action]
)

BATCH_OUTCOMES: Final = ("merged", "replayed")
CONFIG_RESULTS: Final = ("applied", "replayed", "rejected")
EVALUATION_TRIGGERS: Final = ("batch", "deadline", "full", "config", "compaction", "readers")
