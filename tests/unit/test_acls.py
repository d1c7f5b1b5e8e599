"""The README's ACL table is what `app/acls.py` requires (and what tests/e2e/test_acls.py proves on a broker that
enforces ACLs): generated, never edited by hand."""

from __future__ import annotations

from pathlib import Path

from compactd.app.acls import NEEDS, table, watched_topics
from compactd.settings import Settings

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_table_is_the_generated_one() -> None:
    assert table() in README.read_text(), "README's ACL table differs from app/acls.py: paste `table()` into it"


def test_which_rows_apply_to_which_settings() -> None:
    default = Settings()
    admin = Settings(offsets_source="admin")
    service = Settings(thresholds={"topic:orders": {"compaction.service": True}})
    offsets = next(n for n in NEEDS if n.where == "offsets")
    nudges = next(n for n in NEEDS if "ALTER_CONFIGS" in n.operations)
    reads = next(n for n in NEEDS if n.where == "watched" and n.operations == ("READ",))
    assert offsets.applies(default) and offsets.applies(admin)  # admin mode: the check reads streams groups there
    assert not offsets.applies(Settings(offsets_source="admin", cluster_offsets_check=False))
    assert nudges.applies(default) and not nudges.applies(admin)
    # Read on the topics: the compaction service, and the cluster check of a commit made under an earlier leader
    assert reads.applies(service) and reads.applies(default)
    assert not reads.applies(Settings(cluster_check="off")) and not reads.applies(Settings(cluster_offsets_check=False))


def test_the_topics_checked() -> None:
    s = Settings(thresholds={"topic:orders": {"consumed.retention.ms": 1}, "partition:payments/3": {}})
    assert watched_topics(s, [], ["x"]) == ["orders", "payments"]
    assert watched_topics(s, ["given"], ["x"]) == ["given"]
    assert watched_topics(Settings(), [], ["a", "__consumer_offsets", "compactd.dlq", "a.compacted"]) == ["a"]
