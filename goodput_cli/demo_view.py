"""The demo's live terminal view, read from the sidecar's and forecaster's own /metrics.

Goodput is the rate of `outcome="good"` over the last 10 s; attainment and percentiles cover
the run so far; engine signals are the sidecar's normalised `goodput_engine_*` gauges.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

import httpx

from goodput_cli import promtext

WINDOW_S = 10.0


class DemoView:
    def __init__(self, sidecar_url: str, forecaster_url: str | None, stats, total: int):
        self.sidecar_url = sidecar_url
        self.forecaster_url = forecaster_url
        self.stats = stats
        self.total = total
        self.history: deque = deque()
        self.last_snapshot: dict = {}

    async def _scrape(self, client: httpx.AsyncClient, url: str) -> promtext.Samples:
        try:
            resp = await client.get(f"{url}/metrics", timeout=2)
            return promtext.parse(resp.text)
        except (httpx.HTTPError, ValueError):
            return {}

    def snapshot(self, side: promtext.Samples, fc: promtext.Samples) -> dict:
        now = time.monotonic()
        good = promtext.total(side, "goodput_requests_total", outcome="good")
        done = promtext.total(side, "goodput_requests_total")
        self.history.append((now, good))
        while self.history and now - self.history[0][0] > WINDOW_S:
            self.history.popleft()
        t_old, g_old = self.history[0]
        q = lambda name, p: promtext.histogram_quantile(side, name, p)  # noqa: E731
        snap = {
            "goodput_req_per_s": (good - g_old) / (now - t_old) if now > t_old else 0.0,
            "attainment": good / done if done else None,
            "requests_done": done,
            "ttft_p50": q("goodput_ttft_seconds", 0.5), "ttft_p99": q("goodput_ttft_seconds", 0.99),
            "tpot_p50": q("goodput_tpot_seconds", 0.5), "tpot_p99": q("goodput_tpot_seconds", 0.99),
            "kv_cache_usage": promtext.total(side, "goodput_engine_kv_cache_usage_ratio"),
            "queue_waiting": promtext.total(side, "goodput_engine_requests_waiting"),
            "running": promtext.total(side, "goodput_engine_requests_running"),
            "preemptions": promtext.total(side, "goodput_engine_preemptions_total"),
        }
        if fc:
            snap["forecast_queue_upper"] = max((v for (n, l), v in fc.items() if n == "goodput_forecast_queue_depth"
                                                and dict(l).get("bound") == "upper"), default=None)
            snap["desired_replicas"] = promtext.total(fc, "goodput_desired_replicas")
            snap["forecast_model"] = next((dict(l).get("model_name") for (n, l), _ in fc.items()
                                           if n == "goodput_forecast_model_info"), None)
        self.last_snapshot = snap
        return snap

    def render(self, snap: dict):
        from rich.table import Table

        def ms(v):
            return "-" if v is None else f"{v * 1000:.0f} ms"

        t = Table(title="goodput demo — live (from the sidecar's /metrics)", show_header=False, min_width=60)
        t.add_row("requests", f"sent {self.stats.sent}/{self.total}, finished {self.stats.finished}, errors {self.stats.errors}")
        t.add_row("goodput (10 s)", f"{snap['goodput_req_per_s']:.2f} req/s")
        att = snap["attainment"]
        t.add_row("SLO attainment", "-" if att is None else f"{att * 100:.1f} %")
        t.add_row("TTFT p50 / p99", f"{ms(snap['ttft_p50'])} / {ms(snap['ttft_p99'])}")
        t.add_row("TPOT p50 / p99", f"{ms(snap['tpot_p50'])} / {ms(snap['tpot_p99'])}")
        t.add_row("KV-cache usage", f"{snap['kv_cache_usage'] * 100:.1f} %")
        t.add_row("queue waiting / running", f"{snap['queue_waiting']:.0f} / {snap['running']:.0f}")
        t.add_row("preemptions", f"{snap['preemptions']:.0f}")
        if "desired_replicas" in snap:
            fq = snap.get("forecast_queue_upper")
            t.add_row("forecast", f"queue (upper) {'-' if fq is None else f'{fq:.1f}'}, desired replicas "
                                  f"{snap['desired_replicas']:.0f}, model {snap.get('forecast_model')}")
        return t

    async def run_until(self, task: asyncio.Future):
        """Refresh once a second until `task` (the load run) is done; returns its result."""
        from rich.live import Live

        async with httpx.AsyncClient() as client:
            with Live(self.render(self.snapshot({}, {})), refresh_per_second=2) as live:
                while not task.done():
                    side = await self._scrape(client, self.sidecar_url)
                    fc = await self._scrape(client, self.forecaster_url) if self.forecaster_url else {}
                    live.update(self.render(self.snapshot(side, fc)))
                    await asyncio.wait([task], timeout=1.0)
                side = await self._scrape(client, self.sidecar_url)
                fc = await self._scrape(client, self.forecaster_url) if self.forecaster_url else {}
                live.update(self.render(self.snapshot(side, fc)))
        return task.result()
