"""Fleet samples from a Prometheus server (PromQL over its HTTP API).

Counters are read as fleet-wide rates (`sum(rate(...))`, which handles each series' resets
inside Prometheus) and integrated here into running totals, so the policy gets the cumulative
counters of FleetSample whatever the number of pods. After a restart, `history()` reads the
recent past with range queries at the forecast step, so forecasts start warm.

Every query is configurable; `{window}` in a query is replaced by the rate window.
Arrivals come from `goodput_requests_arrived_total` (counted when a request arrives); sidecars
older than that counter fall back to `goodput_requests_total`, which counts a request when it
ends and so lags, and understates demand, exactly when the engine is overloaded. Both count the
requests the admission guard shed (outcome "shed"): refused demand is still demand.
"""

from __future__ import annotations

import math
import time

import httpx

from forecaster.fleet_sample import FleetSample, optional_totals

DEFAULT_QUERIES = {
    "arrivals": "sum(rate(goodput_requests_arrived_total[{window}])) or sum(rate(goodput_requests_total[{window}]))",
    "good": 'sum(rate(goodput_requests_total{outcome="good"}[{window}]))',
    "input_tokens": "sum(rate(goodput_input_tokens_total[{window}]))",
    "output_tokens": "sum(rate(goodput_output_tokens_total[{window}]))",
    "preemptions": "sum(rate(goodput_engine_preemptions_total[{window}]))",
    "ended": "sum(rate(goodput_requests_total[{window}]))",
    "ttft_sum": "sum(rate(goodput_ttft_seconds_sum[{window}]))",
    "ttft_count": "sum(rate(goodput_ttft_seconds_count[{window}]))",
    "tpot_sum": "sum(rate(goodput_tpot_seconds_sum[{window}]))",
    "tpot_count": "sum(rate(goodput_tpot_seconds_count[{window}]))",
    # The decode batch those TPOTs were measured at (per request, at the sidecars).
    "decode_batch": "sum(rate(goodput_decode_batch_total[{window}]))",
    "decode_batch_count": "sum(rate(goodput_decode_batch_requests_total[{window}]))",
    # For the service model (forecaster/service_learn.py): the engines' queue / prefill split and
    # iterations, normalised by the sidecars, and the per-request token histograms by bucket.
    "prefill_sum": "sum(rate(goodput_engine_prefill_time_seconds_sum[{window}]))",
    "prefill_count": "sum(rate(goodput_engine_prefill_time_seconds_count[{window}]))",
    "queue_sum": "sum(rate(goodput_engine_queue_time_seconds_sum[{window}]))",
    "queue_count": "sum(rate(goodput_engine_queue_time_seconds_count[{window}]))",
    "generation_tokens": "sum(rate(goodput_engine_generation_tokens_total[{window}]))",
    "engine_steps": "sum(rate(goodput_engine_steps_total[{window}]))",
    "prompt_computed": "sum(rate(goodput_engine_prompt_tokens_computed_total[{window}]))",
    # How clumped arrivals come, per window length of the sidecars' counters.
    "arrivals_sq": "sum by (window_seconds) (rate(goodput_requests_arrived_squared_total[{window}]))",
    "input_token_hist": "sum by (le) (rate(goodput_request_input_tokens_bucket[{window}]))",
    "output_token_hist": "sum by (le) (rate(goodput_request_output_tokens_bucket[{window}]))",
    "in_flight": "sum(goodput_requests_in_flight)",
    "queue_waiting": "sum(goodput_engine_requests_waiting)",
    "running": "sum(goodput_engine_requests_running)",
    "kv_cache_usage": "avg(goodput_engine_kv_cache_usage_ratio)",
    "ready_replicas": "sum(goodput_engine_up)",
    "starting_replicas": "",  # e.g. kube-state-metrics: sum(kube_deployment_status_replicas_unavailable{...})
}
RATES = ("arrivals", "good", "input_tokens", "output_tokens", "preemptions", "ended", "ttft_sum", "ttft_count",
         "tpot_sum", "tpot_count", "decode_batch", "decode_batch_count", "prefill_sum", "prefill_count", "queue_sum",
         "queue_count", "generation_tokens", "engine_steps", "prompt_computed")
# Rates per histogram bucket (one series per `le`), integrated into cumulative counts per bucket.
BUCKETED = {"input_token_hist": "le", "output_token_hist": "le", "arrivals_sq": "window_seconds"}
SLO_QUERIES = ("max by (slo_class, objective) (goodput_slo_target_seconds)",
               "max by (slo_class) (goodput_slo_objective_ratio)")


class PrometheusError(RuntimeError):
    pass


class PrometheusSource:
    def __init__(self, url: str, queries: dict[str, str] | None = None, window: str = "1m",
                 step_seconds: float = 15.0, timeout: float = 10.0):
        unknown = set(queries or {}) - set(DEFAULT_QUERIES)
        if unknown:
            raise ValueError(f"unknown query names {sorted(unknown)}; known: {sorted(DEFAULT_QUERIES)}")
        merged = {**DEFAULT_QUERIES, **(queries or {})}
        self.queries = {k: v.replace("{window}", window) for k, v in merged.items()}
        self.step_seconds = step_seconds
        self._client = httpx.Client(base_url=url.rstrip("/"), timeout=timeout)
        self._totals = {k: 0.0 for k in RATES}
        self._exported: set[str] = set()   # rates whose query has returned a series (at 0 or more)
        self._buckets: dict[str, dict[float, float]] = {k: {} for k in BUCKETED}
        self._last_t: float | None = None
        self._starting = 0
        self.slos: tuple = ()

    def _get(self, path: str, params: dict) -> list:
        try:
            resp = self._client.get(path, params=params)
            body = resp.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise PrometheusError(f"{path}: {type(exc).__name__}: {exc}") from exc
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params.get('query')!r}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]["result"]

    def instant(self, query: str, t: float) -> float:
        """The single value of `query` at t; NaN when it returns nothing (no series yet)."""
        result = self._get("/api/v1/query", {"query": query, "time": f"{t:.3f}"})
        if not result:
            return float("nan")
        return sum(float(r["value"][1]) for r in result)

    def by_le(self, query: str, t: float, label: str = "le") -> dict[float, float]:
        """A `sum by (le)` query at t as {le: value} (or by another numeric label); empty when it
        returns nothing."""
        out: dict[float, float] = {}
        for r in self._get("/api/v1/query", {"query": query, "time": f"{t:.3f}"}):
            try:
                le, v = float(r["metric"][label]), float(r["value"][1])
            except (KeyError, ValueError):
                continue
            if math.isfinite(v):
                out[le] = out.get(le, 0.0) + v
        return out

    def _integrate(self, t: float, values: dict, buckets: dict | None = None) -> FleetSample | None:
        if self._last_t is not None and t <= self._last_t:
            return None  # late: Prometheus answered for a time we already have
        dt = self.step_seconds if self._last_t is None else t - self._last_t
        for k in RATES:
            v = values.get(k, float("nan"))
            if math.isfinite(v):
                # Rate × elapsed time; a gap longer than the rate window is bridged at the newest rate.
                self._totals[k] += v * dt
                self._exported.add(k)
        for k, rates in (buckets or {}).items():
            totals = self._buckets[k]
            for le, v in rates.items():
                totals[le] = totals.get(le, 0.0) + v * dt
        self._last_t = t
        ready = values.get("ready_replicas", float("nan"))
        starting = values.get("starting_replicas", float("nan"))
        self._starting = int(starting) if math.isfinite(starting) else 0
        return FleetSample(t=t, arrivals_total=self._totals["arrivals"],
                           input_tokens_total=self._totals["input_tokens"],
                           output_tokens_total=self._totals["output_tokens"],
                           in_flight=values.get("in_flight", float("nan")),
                           queue_waiting=values.get("queue_waiting", float("nan")),
                           running=values.get("running", float("nan")),
                           kv_cache_usage=values.get("kv_cache_usage", float("nan")),
                           preemptions_total=self._totals["preemptions"],
                           ready_replicas=int(ready) if math.isfinite(ready) else 0,
                           good_total=self._totals["good"], ended_total=self._totals["ended"],
                           ttft_sum_total=self._totals["ttft_sum"], ttft_count_total=self._totals["ttft_count"],
                           tpot_sum_total=self._totals["tpot_sum"], tpot_count_total=self._totals["tpot_count"],
                           **optional_totals(self._totals, self._exported),
                           arrivals_squared_total=dict(self._buckets["arrivals_sq"]) or None,
                           input_token_hist_total=dict(self._buckets["input_token_hist"]) or None,
                           output_token_hist_total=dict(self._buckets["output_token_hist"]) or None,
                           slos=self.slos or None)

    def _read_slos(self, t: float) -> None:
        """The SLO classes the sidecars announce; kept as they were when the query fails."""
        from forecaster.service_model import Slo

        try:
            targets, ratios = (self._get("/api/v1/query", {"query": q, "time": f"{t:.3f}"}) for q in SLO_QUERIES)
        except PrometheusError:
            return
        by_class: dict[str, dict[str, float]] = {}
        for r in targets:
            by_class.setdefault(r["metric"].get("slo_class", ""), {})[r["metric"].get("objective", "")] = float(r["value"][1])
        ratio = {r["metric"].get("slo_class", ""): float(r["value"][1]) for r in ratios}
        found = []
        for name, t_ in sorted(by_class.items()):
            try:
                found.append(Slo(ttft_s=t_.get("ttft", math.inf), tpot_s=t_.get("tpot", math.inf),
                                 ratio=ratio.get(name, 0.99), name=name or "default"))
            except ValueError:
                continue
        if found:
            self.slos = tuple(found)

    def poll(self, now: float | None = None) -> FleetSample | None:
        now = time.time() if now is None else now
        values = {k: self.instant(q, now) for k, q in self.queries.items() if q and k not in BUCKETED}
        if not math.isfinite(values.get("arrivals", float("nan"))):
            return None  # no request counter at all yet: nothing to forecast from
        buckets = {k: self.by_le(self.queries[k], now, label) for k, label in BUCKETED.items() if self.queries.get(k)}
        self._read_slos(now)
        return self._integrate(now, values, buckets)

    def history(self, seconds: float, now: float | None = None) -> list[FleetSample]:
        """Samples at the forecast step over the last `seconds`, from range queries."""
        now = time.time() if now is None else now
        start = now - seconds
        by_time: dict[float, dict[str, float]] = {}
        bucket_time: dict[float, dict[str, dict[float, float]]] = {}
        for key, q in self.queries.items():
            if not q:
                continue
            params = {"query": q, "start": f"{start:.3f}", "end": f"{now:.3f}", "step": f"{self.step_seconds:g}"}
            for series in self._get("/api/v1/query_range", params):
                le = series.get("metric", {}).get(BUCKETED[key]) if key in BUCKETED else None
                for ts, val in series["values"]:
                    if key in BUCKETED:
                        if le is None or not math.isfinite(float(val)):
                            continue
                        try:
                            le_value = float(le)
                        except ValueError:
                            continue
                        slot_b = bucket_time.setdefault(float(ts), {}).setdefault(key, {})
                        slot_b[le_value] = slot_b.get(le_value, 0.0) + float(val)
                        continue
                    slot = by_time.setdefault(float(ts), {})
                    slot[key] = slot.get(key, 0.0) + float(val)
        samples = []
        for t in sorted(by_time):
            if math.isfinite(by_time[t].get("arrivals", float("nan"))):
                s = self._integrate(t, by_time[t], bucket_time.get(t))
                if s is not None:
                    samples.append(s)
        return samples

    def starting_replicas(self) -> int:
        return self._starting

    def close(self) -> None:
        self._client.close()
