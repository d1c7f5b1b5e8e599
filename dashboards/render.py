"""Draw a dashboard's panels from Prometheus query results to PNG (matplotlib): a picture of the overview without
a Grafana server. Each panel's queries run against Prometheus' HTTP API exactly as Grafana would send them.
"""

from __future__ import annotations

import json
import math
import time
import urllib.parse
import urllib.request
from pathlib import Path

from compactd.dashboards.build import load
from compactd.errors import DependencyUnavailable

UNITS = {"s": "seconds", "bytes": "bytes", "ops": "per second", "short": ""}


def prom_query(prometheus_url: str, expr: str, end: float, start: float | None = None, step: float = 15.0) -> list:
    """Run one query (range when `start` is given, else instant); returns Prometheus' result list."""
    params = {"query": expr.replace("$__rate_interval", "1m"), "time": f"{end:.3f}"}
    path = "query"
    if start is not None:
        params = {"query": params["query"], "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        path = "query_range"
    url = f"{prometheus_url.rstrip('/')}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            body = json.load(resp)
    except OSError as exc:
        raise DependencyUnavailable("Prometheus", prometheus_url, "--prometheus-url", str(exc)) from None
    if body.get("status") != "success":
        raise DependencyUnavailable("Prometheus", prometheus_url, "--prometheus-url", body.get("error", "query failed"))
    return body["data"]["result"]


def _legend(fmt: str, labels: dict[str, str]) -> str:
    out = fmt or ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__") or "value"
    for key, value in labels.items():
        out = out.replace("{{" + key + "}}", value)
    return out


def render(
    prometheus_url: str,
    out_dir: Path,
    name: str = "overview",
    range_s: float = 3600.0,
    variables: dict[str, str] | None = None,
) -> Path:
    """Draw every panel of dashboard `name` into one PNG; returns its path. `variables`: values for $topic, ..."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    text = json.dumps(load(name))
    for var, value in (variables or {}).items():
        text = text.replace(f"${var}", value)
    board = json.loads(text)
    panels = [p for p in board["panels"] if p.get("type") != "row"]
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.2 * rows), squeeze=False)
    end = time.time()
    start = end - range_s
    for ax, panel in zip(axes.flat, panels, strict=False):
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        ax.set_title(panel["title"], fontsize=10)
        targets = panel.get("targets", [])
        if panel["type"] == "timeseries":
            for t in targets:
                for series in prom_query(prometheus_url, t["expr"], end, start, step=max(range_s / 240, 1)):
                    xs = [float(v[0]) - end for v in series["values"]]
                    ys = [float(v[1]) for v in series["values"]]
                    ax.plot([x / 60 for x in xs], ys, label=_legend(t.get("legendFormat", ""), series["metric"]))
            ax.set_xlabel("minutes ago")
            ax.set_ylabel(UNITS.get(unit, unit), fontsize=8)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=6, loc="upper left")
            else:
                _no_data(ax)
        elif panel["type"] == "stat":
            result = prom_query(prometheus_url, targets[0]["expr"], end)
            value = float(result[0]["value"][1]) if result else float("nan")
            shown = "no data" if math.isnan(value) else f"{value:,.0f}"
            ax.text(0.5, 0.45, shown, ha="center", va="center", fontsize=26 if result else 16)
            ax.text(0.5, 0.12, UNITS.get(unit, unit), ha="center", fontsize=9, color="grey")
            ax.set_axis_off()
        else:  # table: one bar per row, largest first
            bars: list[tuple[str, float]] = []
            for t in targets:
                for series in prom_query(prometheus_url, t["expr"], end):
                    bars.append((_legend(t.get("legendFormat", ""), series["metric"]), float(series["value"][1])))
            bars = bars[:12]
            if not bars:
                _no_data(ax)
                continue
            ax.barh([b[0] for b in bars][::-1], [b[1] for b in bars][::-1])
            ax.tick_params(axis="y", labelsize=6)
            ax.set_xlabel(UNITS.get(unit, unit), fontsize=8)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_axis_off()
    fig.suptitle(board["title"], fontsize=14)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def _no_data(ax: object) -> None:
    ax.text(0.5, 0.5, "no data now", ha="center", va="center", fontsize=11, color="grey", transform=ax.transAxes)  # type: ignore[attr-defined]
    ax.set_xticks([])  # type: ignore[attr-defined]
    ax.set_yticks([])  # type: ignore[attr-defined]


def panel_results(prometheus_url: str, name: str, variables: dict[str, str]) -> dict[str, int]:
    """Series returned by every query of a dashboard (instant, variables substituted): "title: expr" → count."""
    out: dict[str, int] = {}
    board = load(name)
    from compactd.dashboards.build import panel_queries

    for title, expr in panel_queries(board):
        for var, value in variables.items():
            expr = expr.replace(f"${var}", value)
        out[f"{title}: {expr}"] = len(prom_query(prometheus_url, expr, time.time()))
    return out
