"""`compactd status`: what an operator asks first — which partitions are overdue, what holds data back."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

from compactd.clock import now_ms
from compactd.model import ActionRecord, PartitionView
from compactd.policy.rules import Evaluation, value
from compactd.policy.thresholds import resolve
from compactd.settings import Settings
from compactd.state.redis_store import RedisState

COLUMNS = ("partition", "compaction_delay_s", "min_committed", "deletable", "last_action")


def status_row(
    view: PartitionView, layers: Mapping[str, Mapping[str, Any]], last: ActionRecord | None, now: int
) -> dict[str, Any]:
    th = resolve(layers, view.topic, view.partition)
    ev = Evaluation.one(view, th, now)
    delay = None
    if th.max_compaction_lag_ms is not None and value(ev.q.earliest, 0) is not None:
        delay = round(int(ev.d.delay[0]) / 1000, 1)  # 0 until the lag is crossed
    before = value(ev.d.before, 0)
    return {
        "partition": view.key,
        "compaction_delay_s": delay,
        "min_committed": view.min_committed,
        "log_start": view.log_start,
        "deletable": 0 if before is None else before - view.log_start,
        "last_action": None if last is None else describe(last),
    }


def describe(rec: ActionRecord) -> str:
    target = f" <{rec.before_offset}" if rec.before_offset is not None else ""
    return f"{rec.action}{target} {rec.status}" + (" (answered)" if "answered_at" in rec.detail else "")


def status_rows(state: RedisState, layers: Mapping[str, Mapping[str, Any]], now: int) -> list[dict[str, Any]]:
    views = state.views(state.all_partitions())
    last = state.last_actions()
    return [status_row(v, layers, last.get(v.key), now) for v in views]


def format_table(rows: list[dict[str, Any]]) -> str:
    cells = [[("-" if r[c] is None else str(r[c])) for c in COLUMNS] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def rich_table(rows: list[dict[str, Any]], title: str | None = None, caption: str | None = None) -> Any:
    """The same table as `format_table`, drawn by rich for a terminal (numbers right-aligned)."""
    from rich.table import Table

    table = Table(title=title, caption=caption, caption_justify="left", title_justify="left")
    for c in COLUMNS:
        table.add_column(c, justify="left" if c in ("partition", "last_action") else "right")
    for r in rows:
        table.add_row(*(("-" if r[c] is None else str(r[c])) for c in COLUMNS))
    return table


def print_table(rows: list[dict[str, Any]]) -> None:
    """A rich table on a terminal; the plain one (`format_table`) when stdout is piped or captured."""
    if sys.stdout.isatty():
        from rich.console import Console

        Console().print(rich_table(rows))
    else:
        print(format_table(rows), flush=True)


def print_status(settings: Settings, as_json: bool = False) -> None:
    state = settings.redis_state()
    state.start()  # one line naming the setting if Redis does not answer
    rows = status_rows(state, settings.thresholds, now_ms())
    if as_json:
        for row in rows:
            print(json.dumps(row))
    else:
        print_table(rows)
