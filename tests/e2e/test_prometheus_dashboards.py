"""A real Prometheus (Debian package) scrapes a running job: every panel query of every dashboard returns series,
the alert rules load against the real metrics, and the overview renders to PNG from the scraped data."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import urllib.request

import pytest

from compactd.app.cli import main
from compactd.control.metrics import Metrics
from compactd.daemon.application import Application
from compactd.dashboards.build import BUILDERS
from compactd.dashboards.render import panel_results, render
from compactd.local.servers import free_port, prometheus_server
from tests.support import waiting
from tests.support.compaction import history, produce
from tests.support.waiting import wait_until

H = 3_600_000


def query(url: str, expr: str) -> list:
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=10) as r:
        return json.load(r)["data"]["result"]


def wait_for(what: str, check, timeout_s: float) -> None:
    """tests.support.waiting's, with Prometheus still starting (refused connections) as an answer not there yet."""
    waiting.wait_for(what, check, timeout_s, 0.5, tolerate=lambda exc: isinstance(exc, OSError))


@pytest.mark.spark
def test_every_panel_query_returns_series_from_a_real_prometheus(
    spark, cluster, job_settings, tmp_path, capsys, monkeypatch
) -> None:
    topic = cluster.name("orders")
    viewed = cluster.name("accounts")  # a real topic with the compaction service on: the service's row has data
    metrics_port = free_port()
    s = job_settings(
        trigger_interval_ms=1000,
        compaction_check_interval_ms=500,
        metrics_port=metrics_port,
        metrics={"top_n": 100, "sample_interval_ms": 1000},
        thresholds={
            f"topic:{topic}": {
                "max.compaction.lag.ms": H,
                "consumed.retention.ms": H,
                "forced.retention.ms": 2 * H,
            },
            f"topic:{viewed}": {"compaction.service": True, "dry.run": False, "max.compaction.lag.ms": H},
        },
    )
    for t in (s.topics.segments, s.topics.commits, s.topics.config):
        cluster.create(t)
    cluster.create(viewed)
    produce(cluster, viewed, history(seed=5, n=40, keys=10, partitions=1), partitions=1)
    now = int(time.time() * 1000)

    def seg(base: int, ts: int, closed: int) -> dict:
        return {
            "type": "segment_rolled",
            "topic": topic,
            "partition": 0,
            "base_offset": base,
            "end_offset": base + 100,
            "first_batch_max_ts": ts,
            "size_bytes": 4096,
            "ts": closed,
        }

    # an overdue dirty segment, read by every group and past forced retention; a fresh one that crosses later
    cluster.send(s.topics.segments, [seg(0, now - 3 * H, now - 3 * H), seg(100, now - 60_000, now - 60_000)])
    cluster.send(
        s.topics.commits,
        [{"type": "offset_commit", "group": "g", "topic": topic, "partition": 0, "offset": 200, "ts": now}],
    )
    cluster.send_raw(s.topics.segments, b"{not json", b"bad")
    cluster.flush()
    flags = ["--bootstrap-servers", s.bootstrap_servers, "--redis-url", s.redis_url]

    prom = prometheus_server(tmp_path / "prometheus", metrics_port)
    prom_url = f"http://127.0.0.1:{prom.port}"
    stop = threading.Event()
    try:
        with Application(s, spark=spark, metrics=Metrics(cluster=s.cluster, top_n=s.metrics.top_n)) as job:
            runner = threading.Thread(target=job.run, kwargs={"stop": stop})
            runner.start()
            try:
                monkeypatch.setenv("COMPACTD_TOPICS__CONFIG", s.topics.config)
                assert main(["config", "set", "global", "action.retry.ms=600000", *flags]) == 0
                wait_for(
                    "Prometheus scraping the job",
                    lambda: any(r["value"][1] == "1" for r in query(prom_url, 'up{job="compactd"}')),
                    90,
                )
                wait_for(
                    "the job's data in Prometheus",
                    lambda: (
                        query(prom_url, f'compactd_compaction_delay_seconds{{topic="{topic}"}}')
                        and query(prom_url, 'compactd_config_version{scope="global"}')
                        and query(prom_url, f'compactd_compaction_last{{topic="{viewed}",figure="generation"}} > 0')
                        and query(prom_url, f'compactd_compaction_max_lag_seconds{{topic="{viewed}"}}')
                    ),
                    180,
                )
                variables = {"topic": topic, "partition": "0", "cluster": "default"}

                def panels() -> tuple[dict[str, int], dict]:
                    """(the queries without a series, every panel's results)."""
                    results = {n: panel_results(prom_url, n, variables) for n in BUILDERS}
                    return {f"{n}/{q}": c for n, qs in results.items() for q, c in qs.items() if c == 0}, results

                # a few more scrapes: rate() needs two points in every window
                _, results = wait_until("every panel query returning series", panels, lambda seen: not seen[0], 90, 1.0)
                total = sum(len(qs) for qs in results.values())
                assert total >= 35  # every query of the three dashboards ran
                png = render(prom_url, tmp_path / "img", "overview", range_s=300)
                assert png.stat().st_size > 20_000
                rules = json.load(urllib.request.urlopen(f"{prom_url}/api/v1/rules", timeout=10))["data"]["groups"]
                assert len(rules[0]["rules"]) == 13 and all(r["health"] == "ok" for r in rules[0]["rules"])
            finally:
                stop.set()
                runner.join(120)
    finally:
        prom.stop()
    capsys.readouterr()
