"""Render each generated dashboard's panels from a live Prometheus to one PNG per dashboard.

The panels and their queries are read from the generated dashboard JSON itself, with Grafana's
variables filled in the way Grafana would ("All" models and classes), so the picture shows what
the dashboard shows, not a second copy of the queries.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    kind: str  # timeseries | stat | heatmap
    expr: str  # variables expanded, ready for the Prometheus API
    legend: str


def expand(expr: str, rate_interval: str, range_seconds: int) -> str:
    """Fill Grafana's variables: all models and classes, the rate interval, the dashboard range."""
    return (expr.replace("$__rate_interval", rate_interval).replace("$__range", f"{range_seconds}s")
            .replace("$model", ".*").replace("$slo_class", ".*"))


def panel_queries(dashboard: dict, rate_interval: str = "1m", range_seconds: int = 3600) -> list[PanelQuery]:
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            queries.append(PanelQuery(dashboard["title"], panel["title"], panel["type"],
                                      expand(target["expr"], rate_interval, range_seconds),
                                      target.get("legendFormat", "")))
    return queries


def legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda mo: labels.get(mo.group(1), ""), template) or str(labels)


class Prometheus:
    """The few Prometheus HTTP API calls the preview and the live test need."""

    def __init__(self, url: str, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self._client = httpx.Client(timeout=timeout)

    def _get(self, path: str, params: dict) -> dict:
        resp = self._client.get(f"{self.url}{path}", params=params)
        body = resp.json()
        if body.get("status") != "success":
            raise RuntimeError(f"{params.get('query')}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr}
        if at is not None:
            params["time"] = at
        return self._get("/api/v1/query", params)["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        return self._get("/api/v1/query_range", {"query": expr, "start": start, "end": end, "step": step})["result"]

    def close(self) -> None:
        self._client.close()


def _draw(ax, kind: str, queries: list[PanelQuery], results: list[list[dict]], start: float) -> None:
    if kind == "stat":
        texts = []
        for q, result in zip(queries, results):
            for s in result:
                value = float(s["values"][-1][1]) if s.get("values") else math.nan
                texts.append(f"{legend(q.legend, s['metric'])}: {value:.3g}")
        ax.text(0.5, 0.5, "\n".join(texts) or "no data", ha="center", va="center", fontsize=12, transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        return
    if kind == "heatmap":
        rows = sorted(((float(s["metric"].get("le", "inf")), s) for s in results[0]), key=lambda r: r[0])
        if rows:
            import numpy as np
            times = [float(t) - start for t, _ in rows[0][1]["values"]]
            cum = np.array([[float(v) for _, v in s["values"]] for _, s in rows if len(s["values"]) == len(times)])
            counts = np.diff(np.vstack([np.zeros(len(times)), cum]), axis=0)  # buckets are cumulative in le
            labels = [f"{le:g}" for le, _ in rows]
            ax.imshow(counts, aspect="auto", origin="lower", cmap="Oranges", interpolation="nearest",
                      extent=(times[0], times[-1], 0, len(labels)))
            ax.set_yticks([i + 0.5 for i in range(len(labels))][:: max(1, len(labels) // 6)])
            ax.set_yticklabels(labels[:: max(1, len(labels) // 6)], fontsize=7)
        return
    for q, result in zip(queries, results):
        for s in result:
            xs = [float(t) - start for t, _ in s["values"]]
            ys = [float(v) for _, v in s["values"]]
            ax.plot(xs, ys, label=legend(q.legend, s["metric"]), linewidth=1)
    if ax.lines:
        ax.legend(fontsize=6, loc="upper left")
    ax.tick_params(labelsize=7)


def render_dashboard(prom: Prometheus, dashboard: dict, out: Path, *, range_seconds: int,
                     rate_interval: str, end: float | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = end or time.time()
    start = end - range_seconds
    step = max(1.0, range_seconds / 240)
    queries = panel_queries(dashboard, rate_interval, range_seconds)
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(15, 2.8 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        mine = [q for q in queries if q.panel == panel["title"]]
        results = [prom.query_range(q.expr, start, end, step) for q in mine]
        _draw(ax, panel["type"], mine, results, start)
        ax.set_title(panel["title"], fontsize=9)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"{dashboard['title']} (last {range_seconds}s, seconds on the x axis)", fontsize=12)
    fig.tight_layout()
    path = out / f"{dashboard['uid']}.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def render_all(prometheus_url: str, dashboards_dir: Path, out: Path, *, range_seconds: int = 3600,
               rate_interval: str = "1m") -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    prom = Prometheus(prometheus_url)
    try:
        return [render_dashboard(prom, json.loads(path.read_text()), out, range_seconds=range_seconds,
                                 rate_interval=rate_interval)
                for path in sorted(dashboards_dir.glob("*.json"))]
    finally:
        prom.close()
