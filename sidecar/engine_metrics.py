"""Engine signals: scrape the upstream's /metrics and export normalised `goodput_engine_*` series.

Understands vLLM's current names (`vllm:kv_cache_usage_perc`, `vllm:prefix_cache_*`), its older
ones (`vllm:gpu_cache_usage_perc`, `vllm:gpu_prefix_cache_*`), SGLang's (`sglang:num_queue_reqs`,
`sglang:num_running_reqs`, `sglang:token_usage`), llama.cpp's (`llamacpp:requests_processing`,
`requests_deferred`, `prompt_tokens_*`; it publishes no KV-cache ratio or preemptions, so those are
absent for it), and the bundled engine (vLLM names). Series of one model are combined over other labels (data-parallel `engine`
ranks, tp ranks): counts and counters are summed, the KV-cache ratio is averaged, since each
rank owns its own equal share of the cache. SGLang exposes prefix-cache hits only as a
`cache_hit_rate` gauge and retractions (its preemptions) only as a gauge of the last interval;
neither can become a counter, so those series are absent for SGLang rather than made up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from sidecar.metrics import ModelLabels

# source sample name -> (goodput signal, how series of one model combine)
SOURCES: dict[str, tuple[str, str]] = {
    "vllm:num_requests_waiting": ("requests_waiting", "sum"),
    "vllm:num_requests_running": ("requests_running", "sum"),
    "vllm:kv_cache_usage_perc": ("kv_cache_usage_ratio", "mean"),
    "vllm:gpu_cache_usage_perc": ("kv_cache_usage_ratio", "mean"),
    "vllm:num_preemptions_total": ("preemptions", "sum"),
    "vllm:prefix_cache_queries_total": ("prefix_cache_queries", "sum"),
    "vllm:prefix_cache_hits_total": ("prefix_cache_hits", "sum"),
    "vllm:gpu_prefix_cache_queries_total": ("prefix_cache_queries", "sum"),
    "vllm:gpu_prefix_cache_hits_total": ("prefix_cache_hits", "sum"),
    "sglang:num_queue_reqs": ("requests_waiting", "sum"),
    "sglang:num_running_reqs": ("requests_running", "sum"),
    "sglang:token_usage": ("kv_cache_usage_ratio", "mean"),
    # llama.cpp (`llama-server --metrics`): slots busy and tasks deferred for want of a slot;
    # prefix-cache hits are its reused prompt tokens, lookups those plus the ones it processed.
    "llamacpp:requests_processing": ("requests_running", "sum"),
    "llamacpp:requests_deferred": ("requests_waiting", "sum"),
    "llamacpp:prompt_tokens_cached_total": ("prefix_cache_hits", "sum"),
    "llamacpp:prompt_tokens_total": ("prefix_cache_queries", "sum"),
}
# A source that also feeds a second signal: llama.cpp's cached prompt tokens were looked up too.
ALSO: dict[str, tuple[str, str]] = {"llamacpp:prompt_tokens_cached_total": ("prefix_cache_queries", "sum")}

# goodput signal -> (exported family name, type, help)
SIGNALS: dict[str, tuple[str, str, str]] = {
    "requests_waiting": ("goodput_engine_requests_waiting", "gauge", "Requests queued in the engine, not yet scheduled."),
    "requests_running": ("goodput_engine_requests_running", "gauge", "Requests the engine is running (prefill or decode)."),
    "kv_cache_usage_ratio": ("goodput_engine_kv_cache_usage_ratio", "gauge", "Share of the engine's KV cache in use, 0-1."),
    "preemptions": ("goodput_engine_preemptions", "counter", "Requests the engine preempted (vLLM and the bundled engine)."),
    "prefix_cache_queries": ("goodput_engine_prefix_cache_queries", "counter", "Prompt tokens looked up in the prefix cache."),
    "prefix_cache_hits": ("goodput_engine_prefix_cache_hits", "counter", "Prompt tokens found in the prefix cache."),
}

MODEL_LABELS = ("model_name", "model")


@dataclass
class EngineSnapshot:
    """The normalised values of one scrape: signal -> model label -> value."""

    values: dict[str, dict[str, float]] = field(default_factory=dict)
    flavour: str | None = None       # vllm | sglang | llamacpp | None (nothing recognised)


def normalise(text: str, models: ModelLabels, single_model: str | None = None) -> EngineSnapshot:
    """Parse Prometheus exposition text and combine the recognised series per model label.

    A series without a model label belongs to `single_model` when exactly one model is
    configured, else to `other`. Raises ValueError on text that is not exposition format.
    """
    sums: dict[tuple[str, str], list[float]] = {}
    how: dict[str, str] = {}
    flavour = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            source = SOURCES.get(sample.name)
            if source is None:
                continue
            value = float(sample.value)
            if math.isnan(value):
                continue
            flavour = flavour or sample.name.split(":", 1)[0]
            raw_model = next((sample.labels[k] for k in MODEL_LABELS if k in sample.labels), None)
            model = models.label(raw_model) if raw_model is not None else (single_model or ModelLabels.OTHER)
            for signal, combine in (source, ALSO[sample.name]) if sample.name in ALSO else (source,):
                sums.setdefault((signal, model), []).append(value)
                how[signal] = combine
    snap = EngineSnapshot(flavour=flavour)
    for (signal, model), values in sums.items():
        combined = sum(values) / len(values) if how[signal] == "mean" else sum(values)
        snap.values.setdefault(signal, {})[model] = combined
    return snap


class EngineCollector:
    """A prometheus_client collector that exports the last snapshot and `goodput_engine_up`.

    The scraper owns the state and replaces it whole with `update()`; collect() only reads.
    Counters keep their last known value while a scrape fails, so rate() sees no false reset.
    """

    def __init__(self):
        self._snapshot = EngineSnapshot()
        self._up = 0.0

    def update(self, snapshot: EngineSnapshot | None) -> None:
        if snapshot is None:
            self._up = 0.0
            return
        self._snapshot = snapshot
        self._up = 1.0

    @property
    def up(self) -> bool:
        return self._up == 1.0

    def collect(self):
        up = GaugeMetricFamily("goodput_engine_up", "1 if the last scrape of the upstream's /metrics succeeded.")
        up.add_metric([], self._up)
        yield up
        snap = self._snapshot
        for signal, (name, kind, help_text) in SIGNALS.items():
            per_model = snap.values.get(signal)
            if not per_model:
                continue
            if kind == "counter":
                fam = CounterMetricFamily(name, help_text, labels=["model"])
            else:
                fam = GaugeMetricFamily(name, help_text, labels=["model"])
            for model, value in sorted(per_model.items()):
                fam.add_metric([model], value)
            yield fam

    def describe(self):
        return []
