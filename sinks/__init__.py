"""Everything compactd writes outside Redis, behind `base.ActionSink`: deleteRecords and config nudges, the audit and
DLQ topics, dry-run, the nudge ledger."""
