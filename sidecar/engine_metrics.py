"""Engine signals: scrape the upstream's /metrics and export normalised `goodput_engine_*` series.

Understands vLLM's current names (`vllm:kv_cache_usage_perc`, `vllm:prefix_cache_*`), its older
ones (`vllm:gpu_cache_usage_perc`, `vllm:gpu_prefix_cache_*`), SGLang's (`sglang:num_queue_reqs`,
`sglang:num_running_reqs`, `sglang:token_usage`), llama.cpp's (`llamacpp:requests_processing`,
`requests_deferred`, `prompt_tokens_*`; it publishes no KV-cache ratio or preemptions, so those are
absent for it), and the bundled engine (vLLM names). Series of one model are combined over other labels (data-parallel `engine`
ranks, tp ranks): counts and counters are summed, the KV-cache ratio is averaged, since each
rank owns its own equal share of the cache.

Where TTFT goes: vLLM's per-request histograms `vllm:request_{queue,prefill,decode}_time_seconds`
(the bundled engine exports them too) and SGLang's `sglang:queue_time_seconds` are re-exported as
`goodput_engine_{queue,prefill,decode}_time_seconds`, buckets as the engine has them, summed per
`le` over ranks. Prompt tokens split into cached (`vllm:prompt_tokens_cached_total`,
`sglang:cached_tokens_total` over every cache source) and computed (prompt tokens minus cached,
both counted at prefill by the engine). SGLang exposes prefix-cache hits only as a
`cache_hit_rate` gauge and retractions (its preemptions) only as a gauge of the last interval;
neither can become a counter, so those series are absent for SGLang rather than made up.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

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
    "vllm:prompt_tokens_total": ("prompt_tokens", "sum"),
    "vllm:prompt_tokens_cached_total": ("prompt_tokens_cached", "sum"),
    "sglang:prompt_tokens_total": ("prompt_tokens", "sum"),
    "sglang:cached_tokens_total": ("prompt_tokens_cached", "sum"),
    # For the forecaster's service model: tokens generated as they are (usage counts them at the
    # end) and engine iterations (vLLM observes iteration_tokens_total once per forward pass).
    "vllm:generation_tokens_total": ("generation_tokens", "sum"),
    "sglang:generation_tokens_total": ("generation_tokens", "sum"),
    "vllm:iteration_tokens_total_count": ("engine_steps", "sum"),
    # Not exported: with the prefill histogram's sum, the engine's prefill seconds per computed token.
    "vllm:request_prefill_kv_computed_tokens_sum": ("prefill_computed_tokens", "sum"),
    # llama.cpp (`llama-server --metrics`): slots busy and tasks deferred for want of a slot;
    # prefix-cache hits are its reused prompt tokens, lookups those plus the ones it processed.
    "llamacpp:requests_processing": ("requests_running", "sum"),
    "llamacpp:requests_deferred": ("requests_waiting", "sum"),
    "llamacpp:prompt_tokens_cached_total": ("prefix_cache_hits", "sum"),
    "llamacpp:prompt_tokens_total": ("prefix_cache_queries", "sum"),
}

# source histogram family -> goodput signal
HISTOGRAM_SOURCES: dict[str, str] = {
    "vllm:request_queue_time_seconds": "queue_time",
    "vllm:request_prefill_time_seconds": "prefill_time",
    "vllm:request_decode_time_seconds": "decode_time",
    "sglang:queue_time_seconds": "queue_time",
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
    "prompt_tokens_cached": ("goodput_engine_prompt_tokens_cached", "counter",
                             "Prompt tokens the engine served from its prefix cache (prefill skipped)."),
    "prompt_tokens_computed": ("goodput_engine_prompt_tokens_computed", "counter",
                               "Prompt tokens the engine computed in prefill (not cached)."),
    "generation_tokens": ("goodput_engine_generation_tokens", "counter",
                          "Tokens the engine generated, counted as it generates them."),
    "engine_steps": ("goodput_engine_steps", "counter",
                     "Engine iterations (forward passes), from vllm:iteration_tokens_total's count."),
    "queue_time": ("goodput_engine_queue_time_seconds", "histogram",
                   "Per request: time waiting in the engine before first scheduled."),
    "prefill_time": ("goodput_engine_prefill_time_seconds", "histogram",
                     "Per request: time from first scheduled to first token (prefill of the uncached tokens)."),
    "decode_time": ("goodput_engine_decode_time_seconds", "histogram", "Per request: time from first to last token."),
}

MODEL_LABELS = ("model_name", "model")


@dataclass
class HistogramValue:
    """One model's histogram: cumulative counts per upper bound (as exposed, `+Inf` included)."""

    buckets: dict[float, float] = field(default_factory=dict)
    sum: float = 0.0
    count: float = 0.0


@dataclass
class EngineSnapshot:
    """The normalised values of one scrape: signal -> model label -> value."""

    values: dict[str, dict[str, float]] = field(default_factory=dict)
    histograms: dict[str, dict[str, HistogramValue]] = field(default_factory=dict)
    flavour: str | None = None       # vllm | sglang | llamacpp | None (nothing recognised)

    def prefill_seconds_per_token(self, model: str) -> float | None:
        """The engine's measured prefill time per computed prompt token (vLLM and the bundled
        engine export both sides); None where the engine does not."""
        hist = self.histograms.get("prefill_time", {}).get(model)
        tokens = self.values.get("prefill_computed_tokens", {}).get(model)
        if hist is None or not tokens:
            return None
        return hist.sum / tokens


# Sample names normalise() reads; every other line is skipped unparsed (see _samples).
_HISTOGRAM_OF = {f"{h}{suffix}": h for h in HISTOGRAM_SOURCES for suffix in ("_bucket", "_sum", "_count")}
_WANTED_SAMPLES = frozenset(SOURCES) | frozenset(_HISTOGRAM_OF)
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|(?=\}))')
_ESCAPE = re.compile(r"\\(.)")


def _unescape(m: re.Match) -> str:
    return "\n" if m.group(1) == "n" else m.group(1)   # exposition escapes: \\, \" and \n


def _samples(text: str):
    """(sample name, labels, value, histogram family or None) of the samples normalise() reads,
    in page order. One pass, and only the wanted lines are parsed: a vLLM /metrics page is mostly
    histograms the sidecar ignores, and prometheus_client's parser, character by character, took
    2.1 ms of the event loop per scrape of the bundled engine's page (1.0 ms of vLLM's), a stall
    every request in flight felt. A histogram's samples count as one only after its `# TYPE ...
    histogram` line, as the exposition format puts it first. Raises ValueError on a wanted line
    that is not exposition format, or when nothing in `text` looks like exposition (an HTML page)."""
    types: dict[str, str] = {}
    exposition = False
    for line in text.splitlines():
        if not line or line[0].isspace():
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("TYPE", "HELP"):
                exposition = True
                if parts[1] == "TYPE" and len(parts) == 4 and parts[2] in HISTOGRAM_SOURCES:
                    types[parts[2]] = parts[3].strip()
            continue
        head = line.split("{", 1)[0].split(None, 1)
        name = head[0] if head else ""          # a line opening with "{" names nothing
        if name not in _WANTED_SAMPLES:
            continue
        exposition = True
        labels: dict[str, str] = {}
        rest = line[len(name):].lstrip()
        if rest.startswith("{"):
            pos = 1
            while True:
                m = _LABEL.match(rest, pos)
                if m is None:
                    break
                value = m.group(2)
                labels[m.group(1)] = _ESCAPE.sub(_unescape, value) if "\\" in value else value
                pos = m.end()
            close = rest.find("}", pos)
            if close < 0 or rest[pos:close].strip():
                raise ValueError(f"malformed labels in exposition line: {line[:200]!r}")
            rest = rest[close + 1:]
        fields = rest.split()
        if not fields:
            raise ValueError(f"no value in exposition line: {line[:200]!r}")
        family = _HISTOGRAM_OF.get(name)
        if family is not None and types.get(family) != "histogram":
            family = None
            if name not in SOURCES:
                continue
        yield name, labels, float(fields[0]), family
    if text.strip() and not exposition:
        raise ValueError("the upstream's /metrics is not Prometheus exposition text")


def normalise(text: str, models: ModelLabels, single_model: str | None = None) -> EngineSnapshot:
    """Parse Prometheus exposition text and combine the recognised series per model label.

    A series without a model label belongs to `single_model` when exactly one model is
    configured, else to `other`. Raises ValueError on text that is not exposition format.
    """
    sums: dict[tuple[str, str], list[float]] = {}
    how: dict[str, str] = {}
    flavour = None
    hists: dict[tuple[str, str], HistogramValue] = {}
    for name, labels, value, family in _samples(text):
        if family is not None:
            flavour = flavour or family.split(":", 1)[0]
            if not math.isnan(value):
                _add_histogram_sample(name, labels, value, HISTOGRAM_SOURCES[family], hists, models, single_model)
            continue
        if math.isnan(value):
            continue
        source = SOURCES[name]
        flavour = flavour or name.split(":", 1)[0]
        model = _model_of(labels, models, single_model)
        for signal, combine in (source, ALSO[name]) if name in ALSO else (source,):
            sums.setdefault((signal, model), []).append(value)
            how[signal] = combine
    snap = EngineSnapshot(flavour=flavour)
    for (signal, model), values in sums.items():
        combined = sum(values) / len(values) if how[signal] == "mean" else sum(values)
        snap.values.setdefault(signal, {})[model] = combined
    for model, prompt in snap.values.get("prompt_tokens", {}).items():
        cached = snap.values.get("prompt_tokens_cached", {}).get(model)
        if cached is not None:
            snap.values.setdefault("prompt_tokens_computed", {})[model] = max(0.0, prompt - cached)
    for (signal, model), hist in hists.items():
        snap.histograms.setdefault(signal, {})[model] = hist
    return snap


def _model_of(labels: dict, models: ModelLabels, single_model: str | None) -> str:
    raw_model = next((labels[k] for k in MODEL_LABELS if k in labels), None)
    return models.label(raw_model) if raw_model is not None else (single_model or ModelLabels.OTHER)


def _add_histogram_sample(name: str, labels: dict, value: float, signal: str, hists: dict, models: ModelLabels,
                          single_model: str | None) -> None:
    """Add one histogram sample into `hists`, per model, summing ranks bucket by bucket."""
    model = _model_of(labels, models, single_model)
    hist = hists.setdefault((signal, model), HistogramValue())
    if name.endswith("_bucket"):
        le = float(labels["le"])
        hist.buckets[le] = hist.buckets.get(le, 0.0) + value
    elif name.endswith("_sum"):
        hist.sum += value
    elif name.endswith("_count"):
        hist.count += value


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

    def prefill_seconds_per_token(self, model: str) -> float | None:
        return self._snapshot.prefill_seconds_per_token(model)

    def collect(self):
        up = GaugeMetricFamily("goodput_engine_up", "1 if the last scrape of the upstream's /metrics succeeded.")
        up.add_metric([], self._up)
        yield up
        snap = self._snapshot
        for signal, (name, kind, help_text) in SIGNALS.items():
            if kind == "histogram":
                if snap.histograms.get(signal):
                    yield _histogram_family(name, help_text, snap.histograms[signal])
                continue
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


def _histogram_family(name: str, help_text: str, per_model: dict[str, HistogramValue]) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, help_text, labels=["model"])
    for model, hist in sorted(per_model.items()):
        bounds = sorted(hist.buckets)
        if not bounds or bounds[-1] != math.inf:   # a truncated exposition: +Inf is the count
            bounds.append(math.inf)
            hist.buckets[math.inf] = hist.count
        buckets = [(_le(b), hist.buckets[b]) for b in bounds]
        fam.add_metric([model], buckets, hist.sum)
    return fam


def _le(bound: float) -> str:
    return "+Inf" if bound == math.inf else repr(float(bound))
