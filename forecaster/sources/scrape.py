"""Direct scraping of sidecar /metrics, summed into one fleet sample.

Counters are differenced per target (forecaster/series.CounterRate), so one sidecar restarting
(its counters back to zero) adds only what it counted since, not a negative jump of the fleet
sum; the fleet totals are sums of those per-target increases. A target that fails a scrape is
left out of that step: its counters carry the missed increase into its next good scrape.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from forecaster.fleet_sample import FleetSample, optional_totals
from forecaster.series import CounterRate

# Demand is counted when a request arrives (goodput_requests_arrived_total); a sidecar older than
# that counter is read through the requests it ended, which lag by a request's duration. Requests
# the sidecar's admission guard shed (outcome "shed") are in both: refused demand is still demand,
# and the replicas that would have served it are exactly what the autoscaler must add.
ARRIVED = "goodput_requests_arrived_total"
COUNTERS = {
    "arrivals": ("goodput_requests_total", None),
    "good": ("goodput_requests_total", ("outcome", "good")),
    "input_tokens": ("goodput_input_tokens_total", None),
    "output_tokens": ("goodput_output_tokens_total", None),
    "preemptions": ("goodput_engine_preemptions_total", None),
    # For the service model: requests that ended, and the latency histograms' sums and counts.
    "ended": ("goodput_requests_total", None),
    "ttft_sum": ("goodput_ttft_seconds_sum", None),
    "ttft_count": ("goodput_ttft_seconds_count", None),
    "tpot_sum": ("goodput_tpot_seconds_sum", None),
    "tpot_count": ("goodput_tpot_seconds_count", None),
    # The decode batch those TPOTs were measured at (per request, at the sidecar).
    "decode_batch": ("goodput_decode_batch_total", None),
    "decode_batch_count": ("goodput_decode_batch_requests_total", None),
    "prefill_sum": ("goodput_engine_prefill_time_seconds_sum", None),
    "prefill_count": ("goodput_engine_prefill_time_seconds_count", None),
    "queue_sum": ("goodput_engine_queue_time_seconds_sum", None),
    "queue_count": ("goodput_engine_queue_time_seconds_count", None),
    "generation_tokens": ("goodput_engine_generation_tokens_total", None),
    "engine_steps": ("goodput_engine_steps_total", None),
    "prompt_computed": ("goodput_engine_prompt_tokens_computed_total", None),
}
GAUGES = {
    "in_flight": "goodput_requests_in_flight",
    "queue_waiting": "goodput_engine_requests_waiting",
    "running": "goodput_engine_requests_running",
    "kv_cache_usage": "goodput_engine_kv_cache_usage_ratio",
    "engine_up": "goodput_engine_up",
}


def parse_slos(exposition) -> tuple:
    """The SLO classes a sidecar announces (goodput_slo_target_seconds, goodput_slo_objective_ratio),
    from its text exposition or its parsed families."""
    from forecaster.service_model import Slo

    targets: dict[str, dict[str, float]] = {}
    ratios: dict[str, float] = {}
    for family in _families(exposition):
        if family.name not in ("goodput_slo_target_seconds", "goodput_slo_objective_ratio"):
            continue
        for s in family.samples:
            name = s.labels.get("slo_class")
            if not name or not math.isfinite(s.value):
                continue
            if family.name == "goodput_slo_objective_ratio":
                ratios[name] = s.value
            else:
                targets.setdefault(name, {})[s.labels.get("objective", "")] = s.value
    out = []
    for name in sorted(targets):
        t = targets[name]
        try:
            out.append(Slo(ttft_s=t.get("ttft", math.inf), tpot_s=t.get("tpot", math.inf),
                           ratio=ratios.get(name, 0.99), name=name))
        except ValueError:
            continue  # a class without usable objectives cannot be planned for
    return tuple(s for s in out if math.isfinite(s.ttft_s) or math.isfinite(s.tpot_s))


def _families(exposition) -> list:
    """A Prometheus text exposition parsed once (or the families of one already parsed)."""
    return list(text_string_to_metric_families(exposition)) if isinstance(exposition, str) else exposition


def parse_metrics(exposition) -> dict[str, float]:
    """Sums of the samples the forecaster reads, from one Prometheus text exposition (or its
    parsed families)."""
    families = _families(exposition)
    out: dict[str, float] = {}
    counters = {name for name, _ in COUNTERS.values()} | {ARRIVED}
    wanted = counters | set(GAUGES.values())
    arrived = None
    for family in families:
        for s in family.samples:
            if s.name not in wanted or not math.isfinite(s.value):
                continue
            if s.value < 0 and s.name in counters:
                continue    # garbage: a counter is never negative (a reset goes to 0, not below)
            if s.name == ARRIVED:
                arrived = (arrived or 0.0) + s.value
                continue
            for key, (name, label) in COUNTERS.items():
                if s.name == name and (label is None or s.labels.get(label[0]) == label[1]):
                    out[key] = out.get(key, 0.0) + s.value
            for key, name in GAUGES.items():
                if s.name == name:
                    out[key] = out.get(key, 0.0) + s.value
                    out[key + "_n"] = out.get(key + "_n", 0.0) + 1
    if arrived is not None:
        out["arrivals"] = arrived
    out.update(_keyed_counters(families))
    return out


TOKEN_HISTOGRAMS = {"goodput_request_input_tokens": "inhist", "goodput_request_output_tokens": "outhist"}
# How clumped arrivals come (forecaster/service_learn.py): one counter per window length.
ARRIVED_SQUARED = "goodput_requests_arrived_squared_total"
KEYED = ("inhist:", "outhist:", "arrsq:")


def _keyed_counters(families: list) -> dict[str, float]:
    """Per-request token histograms as counters, one key per bucket ("inhist:<le>": cumulative
    requests with at most le prompt tokens), and the arrival-burstiness counters, one key per
    window ("arrsq:<window seconds>"), each summed over models."""
    out: dict[str, float] = {}
    for family in families:
        prefix = TOKEN_HISTOGRAMS.get(family.name)
        for s in family.samples:
            if not math.isfinite(s.value) or s.value < 0:
                continue
            try:
                if prefix is not None and s.name.endswith("_bucket"):
                    key = f"{prefix}:{float(s.labels['le'])!r}"
                elif s.name == ARRIVED_SQUARED:
                    key = f"arrsq:{float(s.labels['window_seconds'])!r}"
                else:
                    continue
            except (KeyError, ValueError):
                continue   # a bucket or window label that is not a number: not ours to read
            out[key] = out.get(key, 0.0) + s.value
    return out


def _hist(totals: dict[str, float], prefix: str) -> dict | None:
    found = {float(k.split(":", 1)[1]): v for k, v in totals.items() if k.startswith(prefix + ":")}
    return found or None


@dataclass
class _Target:
    counters: dict[str, CounterRate] = field(default_factory=lambda: {k: CounterRate() for k in COUNTERS})
    buckets: dict[str, CounterRate] = field(default_factory=dict)   # token-histogram buckets


class ScrapeSource:
    """Scrapes `targets()` (URLs of /metrics) every poll; `targets` may change between polls.
    `fetch(url) -> text` replaces the HTTP GET (a replay of recorded pages)."""

    def __init__(self, targets: Callable[[], list[str]], timeout: float = 5.0,
                 starting: Callable[[], int] | None = None,
                 cold_start: Callable[[], float | None] | None = None,
                 fetch: Callable[[str], str] | None = None):
        self._targets = targets
        self._fetch = fetch
        self._starting = starting
        self._cold_start = cold_start
        self._client = httpx.Client(timeout=timeout)
        self._state: dict[str, _Target] = {}
        self._totals = {k: 0.0 for k in COUNTERS}
        self._exported: set[str] = set()   # counters some sidecar has exported (at 0 or more)
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="scrape")
        self.last_errors: dict[str, str] = {}
        self.slos: tuple = ()

    def _scrape(self, url: str) -> dict[str, float] | None:
        try:
            if self._fetch is not None:
                text = self._fetch(url)
            else:
                resp = self._client.get(url)
                resp.raise_for_status()
                text = resp.text
            families = _families(text)   # parsed once for both readings
            found = parse_metrics(families)
            slos = parse_slos(families)
            if slos:
                self.slos = slos
            return found
        except (httpx.HTTPError, ValueError) as exc:
            self.last_errors[url] = f"{type(exc).__name__}: {exc}"
            return None

    def poll(self, now: float | None = None) -> FleetSample | None:
        now = time.time() if now is None else now
        urls = list(dict.fromkeys(self._targets()))
        results = dict(zip(urls, self._pool.map(self._scrape, urls)))
        ok = {u: r for u, r in results.items() if r is not None}
        for url in list(self._state):
            if url not in urls:
                del self._state[url]  # gone from discovery: forget its counters
        if not ok:
            return None
        gauges = {k: 0.0 for k in GAUGES}
        kv_sum, kv_n, ready = 0.0, 0, 0
        for url, metrics in ok.items():
            state = self._state.setdefault(url, _Target())
            for key in COUNTERS:
                if key in metrics:
                    self._exported.add(key)
                    got = state.counters[key].update(now, metrics[key])
                    if got is not None:
                        self._totals[key] += got[0]
            for key, value in metrics.items():
                if key.startswith(KEYED):
                    got = state.buckets.setdefault(key, CounterRate()).update(now, value)
                    if got is not None:
                        self._totals[key] = self._totals.get(key, 0.0) + got[0]
            for key in ("in_flight", "queue_waiting", "running"):
                gauges[key] += metrics.get(key, 0.0)
            if "kv_cache_usage" in metrics:
                kv_sum += metrics["kv_cache_usage"] / metrics["kv_cache_usage_n"]
                kv_n += 1
            # A sidecar without the engine_up gauge counts as ready when it answers.
            ready += 1 if metrics.get("engine_up", 1.0) >= 1.0 else 0
        return FleetSample(t=now, arrivals_total=self._totals["arrivals"],
                           input_tokens_total=self._totals["input_tokens"],
                           output_tokens_total=self._totals["output_tokens"], in_flight=gauges["in_flight"],
                           queue_waiting=gauges["queue_waiting"], running=gauges["running"],
                           kv_cache_usage=kv_sum / kv_n if kv_n else float("nan"),
                           preemptions_total=self._totals["preemptions"], ready_replicas=ready,
                           good_total=self._totals["good"], ended_total=self._totals["ended"],
                           ttft_sum_total=self._totals["ttft_sum"], ttft_count_total=self._totals["ttft_count"],
                           tpot_sum_total=self._totals["tpot_sum"], tpot_count_total=self._totals["tpot_count"],
                           **optional_totals(self._totals, self._exported),
                           input_token_hist_total=_hist(self._totals, "inhist"),
                           output_token_hist_total=_hist(self._totals, "outhist"),
                           arrivals_squared_total=_hist(self._totals, "arrsq"),
                           slos=self.slos or None)

    def starting_replicas(self) -> int:
        return self._starting() if self._starting else 0

    def cold_start_seconds(self) -> float | None:
        """Learned by the discovery (pods first not ready, then ready); None where it cannot tell."""
        return self._cold_start() if self._cold_start else None

    def close(self) -> None:
        self._client.close()
        self._pool.shutdown(wait=False)


def static_targets(targets: list[str]) -> Callable[[], list[str]]:
    """host:port or URLs → /metrics URLs."""
    urls = []
    for t in targets:
        url = t if "://" in t else f"http://{t}"
        if not url.rstrip("/").endswith("/metrics"):
            url = url.rstrip("/") + "/metrics"
        urls.append(url)
    return lambda: urls
