"""The reference tables of docs/benchmarks.md and the README, rendered from the last `make bench` (bench/results.json).

Each row names the command that measured it; a throughput stands beside its yardstick from the same run (a bare
consumer of the same records, Kafka's own cleaner on the same broker), as a ratio from that one run: this machine's
speed varies by a quarter from one run to the next, a ratio much less. The tables sit between markers in both files,
and nothing else there holds a figure, so every published figure is the last run's; a row whose benchmark is missing
from the results says so rather than keep an older figure (their history is in git).

Usage: python bench/report.py [--results bench/results.json] [--write]   (without --write: print both tables)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOC, README = ROOT / "docs" / "benchmarks.md", ROOT / "README.md"
TIMES, DASH = "\u00d7", "\u2013"  # the multiplication sign and the en dash the docs use

Result = dict[str, Any]
Render = Callable[[Result], str]


def n(x: float | None) -> str:
    return DASH if x is None else f"{round(x):,}"


def x(ratio: float | None) -> str:
    return DASH if ratio is None else f"{ratio:.2f} {TIMES}"


def s(seconds: float | None) -> str:
    return DASH if seconds is None else f"{seconds:.2f} s"


@dataclass(frozen=True)
class Row:
    """One figure: which result measured it (`benchmark` and, where one benchmark runs with several arguments,
    `when`), how it reads, its yardstick from the same run, the target and whether the result meets it."""

    benchmark: str
    command: str  # bench/<command>, as the Makefile's BENCHES run it
    figure: str
    measured: Render
    beside: Render
    target: str = ""
    met: Callable[[Result], bool] | None = None
    when: Callable[[Result], bool] = lambda _r: True
    readme: bool = False


def _name(r: Result) -> str:
    return str(r.get("benchmark") or r.get("bench") or "")


def _rounds(r: Result) -> str:
    by_round = ", ".join(n(v) for v in r["events_per_second_by_round"])
    return f"{n(r['events_per_second'])} events/s (by round: {by_round})"


def _bare(r: Result) -> str:
    return f"bare consumer {n(r['bare_consumer']['records_per_second'])}/s: **{x(r['ratio_to_bare_consumer'])}**"


def _heap(r: Result) -> str:
    heap = [rd.get("heap_after_gc_mb") for rd in r["rounds"]]
    return "" if None in heap else f"; heap after GC {heap[0]} {DASH} {heap[-1]} MB over the rounds"


def _stages(r: Result) -> str:
    st = r["spark_stages"]
    return (f"Spark's read alone {n(st['read_per_second'])}/s; read + decode + reduce + collect "
            f"{n(st['read_decode_reduce_collect_per_second'])}/s")  # fmt: skip


def _curve(r: Result) -> str:
    return " / ".join(n(c["events_per_second"]) for c in r["curve"]) + " events/s"


def _worst(r: Result) -> float:
    return max(c["ratio_to_smallest"] for c in r["curve"])


def _spread(d: dict[str, float]) -> str:
    return f"{d['median']:.2f} s ({d['min']:.2f}{DASH}{d['max']:.2f})"


def _cleaner(r: Result, threads: int) -> float:
    return r["full_and_incremental"]["kafka_cleaner"][f"threads_{threads}"]["records_per_second"]


def _full(r: Result) -> Result:
    return r["full_and_incremental"]


def _poll(r: Result) -> str:
    secs = [p["seconds"] for p in r["polls"]]
    calls = r["polls"][0].get("requests_sent_total")
    return f"{min(secs):.2f}{DASH}{max(secs):.2f} s a poll ({len(secs)} polls); {calls} requests the first"


def _checks(r: Result) -> str:
    first = [rd["first_check_s"] for rd in r["rounds"]]
    fresh = [rd["fresh_check_s"] for rd in r["rounds"]]
    return (f"{min(first):.2f}{DASH}{max(first):.2f} s the round that reads every listed group; a fresh read of one "
            f"topic's groups {min(fresh):.2f}{DASH}{max(fresh):.2f} s")  # fmt: skip


def _p(d: dict[str, float]) -> str:
    return f"p50 {d['p50']:.2f} / p99 {d['p99']:.2f} s"


def _ms(d: dict[str, float]) -> str:
    return f"p50 {d['p50']:,.0f} / p99 {d['p99']:,.0f} ms"


ROWS = [
    Row("run_once_throughput_json", "throughput.py --events 2000000 --nothing-due",
        "`run --once`, 2M JSON offset commits a round in batches of 1M, steady state (median of the last 3 of 8 "
        "rounds, one JVM)", lambda r: _rounds(r) + _heap(r), _bare, f"≥ 1.5 {TIMES} the bare consumer",
        lambda r: r["ratio_to_bare_consumer"] >= 1.5, lambda r: r["events"] == 2_000_000, readme=True),
    Row("run_once_throughput_binary", "throughput.py --events 2000000 --nothing-due --format binary",
        "`run --once`, 2M binary `__consumer_offsets` commits a round (value v4, as Kafka 4.x writes them), "
        "steady state",
        lambda r: _rounds(r) + _heap(r), _bare, f"≥ 1.5 {TIMES} the bare consumer",
        lambda r: r["ratio_to_bare_consumer"] >= 1.5, lambda r: r["events"] == 2_000_000, readme=True),
    Row("run_once_throughput_binary", "throughput.py --events 2000000 --nothing-due --format binary",
        "the same rounds' batches as a continuous job's running query pays them (Spark's trigger: offsets, the batch "
        "with its merge, decisions and actions, the commit; not the query's start and stop), steady state",
        lambda r: f"{n(r['running_query_events_per_second'])} events/s",
        lambda r: f"bare consumer {n(r['bare_consumer']['records_per_second'])}/s: "
                  f"**{x(r['running_query_ratio_to_bare_consumer'])}**", f"≥ 1.5 {TIMES} the bare consumer",
        lambda r: r["running_query_ratio_to_bare_consumer"] >= 1.5,
        lambda r: r["events"] == 2_000_000 and "running_query_events_per_second" in r),
    Row("run_once_throughput_binary", "throughput.py --events 2000000 --nothing-due --format binary",
        "where the binary rounds' time goes: one 2M-record Spark job after the rounds", _stages,
        lambda r: f"bare consumer {n(r['bare_consumer']['records_per_second'])}/s: Spark's read alone "
                  f"**{x(r['spark_stages']['read_per_second'] / r['bare_consumer']['records_per_second'])}**",
        when=lambda r: r["events"] == 2_000_000),
    Row("run_once_throughput_json", "throughput.py --rounds 3",
        "cold: the first 600k JSON commits' batch after a 1-event run (JVM and query started, nothing warm)",
        lambda r: f"{n(r['cold_events_per_second'])} events/s (warm, the same run: {n(r['events_per_second'])}/s)",
        lambda r: f"bare consumer {n(r['bare_consumer']['records_per_second'])}/s: "
                  f"**{x(r['cold_ratio_to_bare_consumer'])}**", f"≥ 1.0 {TIMES} the bare consumer",
        lambda r: r["cold_ratio_to_bare_consumer"] >= 1.0, lambda r: r["events"] == 600_000, readme=True),
    Row("scaling_curve", "scaling.py",
        "300k events (30 % segment events) at 1k / 10k / 100k / 1M partitions, decisions due, the warm round",
        _curve, lambda r: f"**{x(_worst(r))}** the 1k rate at worst", f"within 2 {TIMES} of 1k",
        lambda r: _worst(r) <= 2, readme=True),
    Row("scaling_curve_nothing_due", "scaling.py --nothing-due",
        "the Spark time of the first batch against the warm one, 100k partitions, nothing due",
        lambda r: (lambda c: f"{s(c['spark_batch_seconds_first_round'])} / {s(c['spark_batch_seconds'])}")(
            next(c for c in r["curve"] if c["partitions"] == 100_000)),
        lambda r: f"**{x(next(c for c in r['curve'] if c['partitions'] == 100_000)['first_to_warm_spark'])}**",
        f"≤ 2 {TIMES}",
        lambda r: next(c for c in r["curve"] if c["partitions"] == 100_000)["first_to_warm_spark"] <= 2),
    Row("scaling_curve_nothing_due", "scaling.py --nothing-due", "the same, nothing due", _curve,
        lambda r: f"**{x(_worst(r))}** the 1k rate at worst", f"within 2 {TIMES} of 1k", lambda r: _worst(r) <= 2),
    Row("decode_binary", "decode.py",
        "decode + reduce over cached rows, `local[2]`: binary, 20 % group metadata and tombstones",
        lambda r: f"{n(r['decode_reduce_collect_records_per_second'])} records/s (decode alone "
                  f"{n(r['decode_records_per_second'])}/s)",
        lambda r: f"the Python reference on one core {n(r['reference_one_core_records_per_second'])}/s"),
    Row("decode_json", "decode.py --format json --records 1000000", "the same, JSON",
        lambda r: f"{n(r['decode_reduce_collect_records_per_second'])} records/s (decode alone "
                  f"{n(r['decode_records_per_second'])}/s)",
        lambda r: f"the Python reference on one core {n(r['reference_one_core_records_per_second'])}/s"),
    Row("state_footprint", "state_footprint.py",
        "Redis per partition (5 segments) / per (group, partition), 100k partitions, 10 groups, `REDIS_CONFIG`",
        lambda r: f"{r['bytes_per_partition_with_segments']} B / {r['bytes_per_group_partition']} B",
        lambda r: f"{r['used_memory_bytes'] / 1e6:,.0f} MB in all", "150 B / 40 B",
        lambda r: r["bytes_per_partition_with_segments"] <= 150 and r["bytes_per_group_partition"] <= 40,
        lambda r: r["partitions"] < 1_000_000),
    Row("state_footprint", "state_footprint.py --partitions 1000000",
        "Redis per partition (5 segments) / per (group, partition), 1M partitions, 10 groups, `REDIS_CONFIG`",
        lambda r: f"{r['bytes_per_partition_with_segments']} B / {r['bytes_per_group_partition']} B; "
                  f"**{r['used_memory_bytes'] / 1e6:,.0f} MB** in all",
        lambda r: f"merges {n(r['merge_updates_per_second']['offsets'])} offset updates/s", "≤ 550 MB",
        lambda r: r["used_memory_bytes"] <= 550e6, lambda r: r["partitions"] >= 1_000_000, readme=True),
    Row("driver_batch", "driver_batch.py",
        "the driver's share of a batch touching 100k partitions (2 groups, nothing due); Redis a partition with its "
        "segment and groups after it",
        lambda r: f"{s(r['seconds'])} ({r['us_per_partition']} µs a partition); **{r['redis_bytes_per_partition']} B**",
        lambda r: f"Redis CPU {r['redis_cpu_us_per_partition']} µs a partition", "≤ 30 µs; ≤ 230 B",
        lambda r: r["us_per_partition"] <= 30 and r["redis_bytes_per_partition"] <= 230,
        lambda r: r["partitions"] < 1_000_000, readme=True),
    Row("driver_batch", "driver_batch.py --partitions 1000000",
        "the driver's share of a batch touching 1M partitions (2 groups, nothing due)",
        lambda r: f"{s(r['seconds'])} ({r['us_per_partition']} µs a partition); {r['redis_bytes_per_partition']} B",
        lambda r: f"Redis CPU {r['redis_cpu_us_per_partition']} µs a partition", "≤ 30 s (30 µs)",
        lambda r: r["us_per_partition"] <= 30, lambda r: r["partitions"] >= 1_000_000, readme=True),
    Row("cold_start", "cold_start.py",
        "start → first micro-batch: clean start / after a clean stop / after `kill -9` in a batch (median of 3)",
        lambda r: " / ".join(_spread(r[k]["start_to_first_batch_s"])
                             for k in ("clean_start", "restart_after_clean_stop", "restart_after_kill9")),
        lambda r: "the first batch's Spark time " + " / ".join(
            f"{r[k]['first_batch_spark_s']['median']:.2f}"
            for k in ("clean_start", "restart_after_clean_stop", "restart_after_kill9")) + " s",
        "≤ 12 s", lambda r: r["restart_after_kill9"]["start_to_first_batch_s"]["median"] <= 12, readme=True),
    Row("restart_at_scale", "restart.py", "restart after `kill -9` at 10,000 partitions → first decision",
        lambda r: s(r["restart_to_decision_seconds"]),
        lambda r: f"first batch {s(r['restart_to_first_batch_seconds'])}, its Spark time "
                  f"{s(r['first_batch_spark_seconds'])}", "≤ 30 s", lambda r: r["restart_to_decision_seconds"] <= 30),
    Row("decision_latency", "latency.py", "decision latency at a 1 s trigger: event-driven / deadline-driven",
        lambda r: f"{_p(r['event_driven_seconds'])} / {_p(r['deadline_driven_seconds'])}",
        lambda r: f"a batch of ≤ 10 records: Spark p50 {r['tiny_batch_spark_seconds']['p50']:.2f} s",
        "p99 ≤ 2 s", lambda r: max(r["event_driven_seconds"]["p99"], r["deadline_driven_seconds"]["p99"]) <= 2,
        readme=True),
    Row("explain", "explain.py", "`compactd explain TOPIC` on a topic of 100k partitions: the command / one partition",
        lambda r: f"{s(r['command_seconds']['text']['median'])} / {s(r['command_seconds']['partition_text']['median'])}"
                  " (medians of 3)",
        lambda r: f"the ranking alone {s(r['rank_seconds']['median'])}"),
    Row("admin_poll", "admin_poll.py", f"one admin-agent poll, 1,000 groups {TIMES} 10,000 partitions", _poll,
        lambda r: f"{r['peak_rss_mb']} MB RSS"),
    Row("group_check", "group_check.py", "the check before a consumed-retention delete, 2,000 groups over 20 topics",
        _checks, lambda r: f"ttl {r['ttl_s']:g} s"),
    Row("metrics_scrape", "metrics_scrape.py", "`/metrics` at 10,000 partitions",
        lambda r: f"{r['scrape_ms_median']:.0f} ms median, {r['scrape_bytes'] / 1000:,.0f} KB",
        lambda r: f"{r['compactd_series']:,} series"),
    Row("cleaner_loop", "cleaner_loop.py", "KIP-354 loop on Kafka: due → nudge / due → cleaned / nudge → put back",
        lambda r: f"{_ms(r['due_to_nudge_ms'])} / {_ms(r['due_to_cleaned_ms'])} / {_ms(r['nudge_to_put_back_ms'])}",
        lambda r: f"log.cleaner.backoff.ms {r['log_cleaner_backoff_ms']}"),
    Row("compaction", "compaction.py",
        "compaction, full run: 2M records, 200k keys, 16 partitions, warm session, beside Kafka's LogCleaner on the "
        "same broker (run as Kafka's start script runs it) and records",
        lambda r: f"{n(_full(r)['full_run']['records_per_second'])} records/s ({s(_full(r)['full_run']['seconds'])})",
        lambda r: f"cleaner 1 thread {n(_cleaner(r, 1))}/s: **{x(_full(r)['full_to_cleaner_rate']['threads_1'])}**; "
                  f"2 threads {n(_cleaner(r, 2))}/s: {x(_full(r)['full_to_cleaner_rate']['threads_2'])}",
        f"≥ 1.5 {TIMES} the 1-thread cleaner", lambda r: _full(r)["full_to_cleaner_rate"]["threads_1"] >= 1.5,
        readme=True),
    Row("compaction", "compaction.py",
        "compaction of the same records through `compactd compact`, a process of its own (cold: its own JVM)",
        lambda r: f"{n(_full(r)['cli_run']['records_per_second'])} records/s by its summary, "
                  f"{n(_full(r)['cli_run']['records_per_second_process'])}/s exec to exit",
        lambda r: f"**{x(_full(r)['cli_to_cleaner_rate']['threads_1']['run'])}** the 1-thread cleaner",
        f"≥ 1.5 {TIMES} the 1-thread cleaner", lambda r: _full(r)["cli_to_cleaner_rate"]["threads_1"]["run"] >= 1.5,
        readme=True),
    Row("compaction", "compaction.py",
        "compaction, incremental run after 10 % more records (the delta's winners appended to the view)",
        lambda r: f"{x(_full(r)['incremental_to_full_seconds'])} the full run's time",
        lambda r: f"rewriting the view instead: {x(_full(r)['incremental_rewrite_to_full_seconds'])}",
        f"≤ 0.2 {TIMES}", lambda r: _full(r)["incremental_to_full_seconds"] <= 0.2, readme=True),
    Row("compaction", "compaction.py", "compaction, 5M distinct keys in one partition, 1 GiB driver heap",
        lambda r: (f"completes, {s(r['big_key_space']['run']['seconds'])}" if r["big_key_space"].get("completed")
                   else f"**failed**: {r['big_key_space'].get('error', '')[:80]}"),
        lambda r: f"peak RSS: JVM {r['big_key_space'].get('peak_rss_mb', {}).get('jvm', DASH)} MB",
        "completes", lambda r: bool(r["big_key_space"].get("completed"))),
]  # fmt: skip


def _pick(results: list[Result], row: Row) -> Result | None:
    for r in reversed(results):
        if _name(r) == row.benchmark:
            try:
                if row.when(r):
                    return r
            except (KeyError, TypeError):
                continue
    return None


def cells(results: list[Result], row: Row) -> tuple[str, str, str]:
    """(measured, beside, met) of one row; a result missing or not shaped as expected says so."""
    r = _pick(results, row)
    if r is None:
        return f"not in this run (`python bench/{row.command}`)", "", ""
    try:
        met = "" if row.met is None else ("yes" if row.met(r) else "**no**")
        return row.measured(r), row.beside(r), met
    except KeyError as exc:  # a figure the benchmark reports since its last run
        return f"not in this run's result (`{exc.args[0]}`: `python bench/{row.command}`)", "", ""
    except (TypeError, ValueError, ZeroDivisionError, StopIteration) as exc:
        return f"unreadable result ({type(exc).__name__}: {exc})", "", ""


def doc_table(results: list[Result]) -> str:
    out = ["| figure | measured | beside it, the same run | target | met | command |", "|---|---|---|---|---|---|"]
    for row in ROWS:
        measured, beside, met = cells(results, row)
        out.append(f"| {row.figure} | {measured} | {beside} | {row.target} | {met} | `bench/{row.command}` |")
    return "\n".join(out)


def readme_table(results: list[Result]) -> str:
    out = ["| figure | measured | beside it, the same run | target |", "|---|---|---|---|"]
    for row in (r for r in ROWS if r.readme):
        measured, beside, _ = cells(results, row)
        out.append(f"| {row.figure} | {measured} | {beside} | {row.target} |")
    return "\n".join(out)


def provenance(path: Path) -> str:
    from compactd.local.broker import kafka_version

    when = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (f"Measured by `make bench` ({when}; Apache Kafka {kafka_version()} in KRaft mode, one node; Redis; Spark "
            f"`local[2]`; {os.cpu_count()} cores, Python {platform.python_version()}).")  # fmt: skip


def splice(text: str, mark: str, body: str) -> str:
    """`text` with what lies between `<!-- mark:start -->` and `<!-- mark:end -->` replaced by `body`."""
    pattern = re.compile(rf"(<!-- {mark}:start -->\n).*?(\n<!-- {mark}:end -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"no <!-- {mark}:start --> ... <!-- {mark}:end --> markers")
    return pattern.sub(lambda m: m.group(1) + body + m.group(2), text)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results.json")
    ap.add_argument("--write", action="store_true", help="write the tables into docs/benchmarks.md and README.md")
    args = ap.parse_args()
    if not args.results.exists():
        raise SystemExit(f"{args.results} not found: run `make bench` first")
    results = json.loads(args.results.read_text())
    doc = provenance(args.results) + "\n\n" + doc_table(results)
    readme = provenance(args.results) + "\n\n" + readme_table(results)
    if not args.write:
        print(doc, readme, sep="\n\n")
        return
    DOC.write_text(splice(DOC.read_text(), "bench-reference", doc))
    README.write_text(splice(README.read_text(), "bench-readme", readme))
    print(f"wrote the tables of {DOC.relative_to(ROOT)} and {README.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
