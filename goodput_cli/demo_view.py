"""The demo's live terminal view and its time series, read once a second from the sidecar's and the
forecaster's own /metrics (plus the client's own records for latency over the last 10 s).

Throughput and goodput are rates over the last 10 s of the sidecar's `goodput_requests_total`
(answered, and `outcome="good"`); attainment is good / all outcomes, shed included. Each scrape
becomes one entry of `series` (seconds from the replay's start), which the report plots.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

import httpx

from goodput_cli import promtext

WINDOW_S = 10.0


def outcomes_by_class(side: promtext.Samples) -> dict[str, dict[str, float]]:
    """`goodput_requests_total` summed per SLO class and outcome."""
    out: dict[str, dict[str, float]] = {}
    for (name, labels), v in side.items():
        if name == "goodput_requests_total":
            lab = dict(labels)
            cls = out.setdefault(lab.get("slo_class", "?"), {})
            cls[lab.get("outcome", "?")] = cls.get(lab.get("outcome", "?"), 0.0) + v
    return out


def _outcomes(side: promtext.Samples, exclude_class: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for cls, counts in outcomes_by_class(side).items():
        if cls != exclude_class:
            for outcome, v in counts.items():
                out[outcome] = out.get(outcome, 0.0) + v
    return out


def _forecast(fc: promtext.Samples, name: str, bound: str) -> float | None:
    vals = [v for (n, labels), v in fc.items() if n == name and dict(labels).get("bound") == bound]
    return max(vals) if vals else None


class DemoView:
    def __init__(self, sidecar_url: str, forecaster_url: str | None, stats, phases, total: int,
                 exclude_class: str, slo: dict, procs=()):
        self.sidecar_url = sidecar_url
        self.forecaster_url = forecaster_url
        self.stats = stats
        self.phases = phases
        self.total = total
        self.exclude_class = exclude_class
        self.slo = slo
        self.procs = procs
        self.history: deque = deque()
        self.series: list[dict] = []
        self.records: list = []          # appended by the load run's on_record
        self.last_snapshot: dict = {}

    async def _scrape(self, client: httpx.AsyncClient, url: str) -> promtext.Samples:
        try:
            resp = await client.get(f"{url}/metrics", timeout=2)
            return promtext.parse(resp.text)
        except (httpx.HTTPError, ValueError):
            return {}

    def _t(self) -> float:
        return time.perf_counter() - self.stats.started_at if self.stats.started_at else 0.0

    def snapshot(self, side: promtext.Samples, fc: promtext.Samples) -> dict:
        now = self._t()
        oc = _outcomes(side, self.exclude_class)
        good, answered = oc.get("good", 0.0), oc.get("good", 0.0) + oc.get("slo_violated", 0.0)
        done = sum(oc.values())
        self.history.append((now, good, answered, done, oc.get("shed", 0.0)))
        while self.history and now - self.history[0][0] > WINDOW_S:
            self.history.popleft()
        t0, g0, a0, d0, s0 = self.history[0]
        dt = now - t0
        recent = [r for r in self.records if r.ttft is not None and r.sent + (r.e2e or 0) > now - WINDOW_S]
        med = lambda xs: sorted(xs)[len(xs) // 2] if xs else None  # noqa: E731
        snap = {
            "t": now,
            "throughput": (answered - a0) / dt if dt > 0 else 0.0,
            "goodput": (good - g0) / dt if dt > 0 else 0.0,
            "attainment_recent": (good - g0) / (done - d0) if done > d0 else None,
            "attainment": good / done if done else None,
            "requests_done": done, "good": good, "shed": oc.get("shed", 0.0), "outcomes": oc,
            "ttft_p50_recent": med([r.ttft for r in recent]),
            "tpot_p50_recent": med([r.tpot for r in recent if r.tpot is not None]),
            "queue_waiting": promtext.total(side, "goodput_engine_requests_waiting"),
            "running": promtext.total(side, "goodput_engine_requests_running"),
            "kv_cache_usage": promtext.total(side, "goodput_engine_kv_cache_usage_ratio"),
        }
        if fc:
            snap["desired_replicas"] = promtext.total(fc, "goodput_desired_replicas")
            snap["capacity_rps"] = promtext.total(fc, "goodput_replica_capacity_requests_per_second")
            snap["forecast_rate_mean"] = _forecast(fc, "goodput_forecast_arrival_rate", "mean")
            snap["forecast_rate_upper"] = _forecast(fc, "goodput_forecast_arrival_rate", "upper")
            snap["forecast_ttft_mean"] = _forecast(fc, "goodput_forecast_ttft_seconds", "mean")
            snap["forecast_ttft_upper"] = _forecast(fc, "goodput_forecast_ttft_seconds", "upper")
            snap["forecast_tpot_mean"] = _forecast(fc, "goodput_forecast_tpot_seconds", "mean")
            snap["forecast_tpot_upper"] = _forecast(fc, "goodput_forecast_tpot_seconds", "upper")
        if self.stats.started_at:
            self.series.append({k: v for k, v in snap.items() if k != "outcomes"})
        self.last_snapshot = snap
        return snap

    def _phase(self, t: float):
        for k, p in enumerate(self.phases):
            if t < p.end:
                return k, p
        return None, None

    def render(self, snap: dict):
        from rich.table import Table

        def ms(v):
            if v is not None and v == float("inf"):
                return "unbounded (overloaded)"
            return "-" if v is None else f"{v * 1000:.0f} ms"

        def pc(v):
            return "-" if v is None else f"{v * 100:.1f} %"

        t = Table(title="goodput demo: live, from the sidecar's and forecaster's /metrics", show_header=False,
                  min_width=72)
        k, p = self._phase(snap["t"])
        if not self.stats.started_at:
            t.add_row("phase", "starting")
        elif p is None:
            t.add_row("phase", f"draining: {self.stats.sent - self.stats.finished} requests still in flight")
        else:
            t.add_row("phase", f"{k + 1}/{len(self.phases)} {p.name}: {snap['t'] - p.start:.0f}/{p.end - p.start:.0f} s, "
                               f"offered {p.rate:.2f} req/s ({p.load:g}x capacity), {p.what}")
        t.add_row("requests", f"sent {self.stats.sent}/{self.total}, finished {self.stats.finished}, "
                              f"shed {snap['shed']:.0f}, errors {self.stats.errors}")
        t.add_row("throughput / goodput (10 s)", f"{snap['throughput']:.2f} / {snap['goodput']:.2f} req/s")
        t.add_row("SLO attainment", f"{pc(snap['attainment_recent'])} last 10 s, {pc(snap['attainment'])} so far "
                                    f"(objective {self.slo['objective']:.0%})")
        pred = "" if snap.get("forecast_ttft_mean") is None else \
            f", forecast {ms(snap['forecast_ttft_mean'])} (upper {ms(snap['forecast_ttft_upper'])})"
        t.add_row("TTFT p50 (10 s)", f"{ms(snap['ttft_p50_recent'])}{pred}; objective {self.slo['ttft']:g} s")
        pred = "" if snap.get("forecast_tpot_mean") is None else \
            f", forecast {ms(snap['forecast_tpot_mean'])} (upper {ms(snap['forecast_tpot_upper'])})"
        t.add_row("TPOT p50 (10 s)", f"{ms(snap['tpot_p50_recent'])}{pred}; objective {self.slo['tpot']:g} s")
        t.add_row("engine", f"running {snap['running']:.0f}, waiting {snap['queue_waiting']:.0f}, "
                            f"KV cache {snap['kv_cache_usage'] * 100:.0f} %")
        if "desired_replicas" in snap:
            rate = snap.get("forecast_rate_upper")
            t.add_row("forecaster", f"desired replicas {snap['desired_replicas']:.0f}; one replica serves "
                                    f"{snap['capacity_rps']:.2f} req/s (service model); demand forecast (upper) "
                                    f"{'-' if rate is None else f'{rate:.2f}'} req/s")
        return t

    def _dead(self) -> str | None:
        for p in self.procs:
            if p.proc.poll() is not None:
                return f"{p.name} exited with {p.proc.returncode}; its log: {p.log_path}\n{p.log()[-1500:]}"
        return None

    async def run_until(self, task: asyncio.Future):
        """Refresh once a second until `task` (the load run) is done; returns its result. A
        component that exits meanwhile ends the run with its log (RuntimeError)."""
        from rich.live import Live

        async with httpx.AsyncClient() as client:
            with Live(self.render(self.snapshot({}, {})), refresh_per_second=2) as live:
                while not task.done():
                    side = await self._scrape(client, self.sidecar_url)
                    fc = await self._scrape(client, self.forecaster_url) if self.forecaster_url else {}
                    live.update(self.render(self.snapshot(side, fc)))
                    dead = self._dead()
                    if dead:
                        task.cancel()
                        try:
                            await task
                        except asyncio.CancelledError:
                            pass
                        raise RuntimeError(dead)
                    await asyncio.wait([task], timeout=1.0)
                side = await self._scrape(client, self.sidecar_url)
                fc = await self._scrape(client, self.forecaster_url) if self.forecaster_url else {}
                live.update(self.render(self.snapshot(side, fc)))
        return task.result()
