"""The advisor: prompt windows per model and tenant (sidecar.advice), aggregated into advice.

The sidecar feeds it each measured request's body after the response has gone out; `goodput
advise` feeds it records or a trace. It answers three ways from the same state: `advice()`
(dataclasses), `report()` (the /advice JSON) and, registered as a collector, the
`goodput_prompt_*` metrics (label `model`; tenants are summed there, since tenants never become
labels, and appear only in /advice). Nothing in any of them is prompt text: counts, offsets,
lengths and estimates.
"""

from __future__ import annotations

import statistics
from bisect import bisect_left
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Callable

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

from sidecar.advice import DEFAULT_TOKENS_PER_CHAR, Chunks, PromptReuse, PromptWindow
from sidecar.metrics import ModelLabels

OFFSET_BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
DEFAULT_TENANT = "default"


@dataclass(frozen=True)
class Advice:
    """One model and tenant over its window. Token figures are estimates; per-request figures
    about the span are means over the requests that have it."""
    model: str
    tenant: str
    requests: int
    prompt_tokens_per_request: float
    prefix_reusable_share: float          # of prompt tokens: an exact prefix of a recent prompt
    span_share: float                     # of requests: a volatile span breaks the prefix
    span_offset_tokens: float | None      # median start of the span (None: no advice)
    span_length_tokens: float | None
    cacheable_tokens_per_request: float   # would become cacheable with the span at the end
    reusable_share_if_moved: float
    prefill_seconds_per_token: float | None
    ttft_saving_seconds: float | None     # per request with the span

    @property
    def has_span(self) -> bool:
        return self.span_offset_tokens is not None

    def message(self) -> str:
        if not self.has_span:
            return "no volatile span found: prompts share what they can as an exact prefix already"
        saving = (f", saving about {self.ttft_saving_seconds * 1e3:.0f} ms of TTFT each"
                  if self.ttft_saving_seconds is not None else "")
        return (f"a volatile span of ~{self.span_length_tokens:.0f} tokens at token ~{self.span_offset_tokens:.0f} "
                f"breaks the shared prefix in {self.span_share:.0%} of requests; moved to the end of the prompt, "
                f"~{self.cacheable_tokens_per_request:.0f} more tokens per request become cacheable{saving}")

    def to_json(self) -> dict:
        doc = asdict(self)
        doc["advice"] = self.message()
        return doc


@dataclass
class _Group:
    window: PromptWindow
    recent: deque                       # PromptReuse in tokens, the last `window` requests


@dataclass
class _ModelTotals:
    """Cumulative per model, for the counters; offsets as histogram bucket counts."""
    requests: int = 0
    tokens: float = 0.0
    prefix: float = 0.0
    span_requests: int = 0
    movable: float = 0.0
    saving: float = 0.0
    offset_counts: list[int] = field(default_factory=lambda: [0] * (len(OFFSET_BUCKETS) + 1))
    offset_sum: float = 0.0
    # Token calibration (usage.prompt_tokens over rendered characters) and the per-request prefill
    # rate from upstream timings, both as running sums.
    cal_tokens: float = 0.0
    cal_units: float = 0.0
    prefill_seconds: float = 0.0
    prefill_tokens: float = 0.0


class Advisor:
    def __init__(self, window: int = 256, max_span_tokens: float = 64, min_run_tokens: float = 32,
                 min_share: float = 0.2, max_tenants: int = 8,
                 prefill_rate: Callable[[str], float | None] | None = None):
        if window < 0 or max_span_tokens <= 0 or min_run_tokens <= 0 or not 0 < min_share <= 1:
            raise ValueError("advice: window >= 0 (0 = unbounded), max_span_tokens > 0, min_run_tokens > 0, "
                             "0 < min_share <= 1")
        self.window, self.max_span, self.min_run, self.min_share = window, max_span_tokens, min_run_tokens, min_share
        self._tenants = ModelLabels((), max_auto=max_tenants)
        self._groups: dict[tuple[str, str], _Group] = {}
        self._totals: dict[str, _ModelTotals] = {}
        self._prefill_rate = prefill_rate

    # ---- feeding ------------------------------------------------------------------------------
    def observe(self, model: str, tenant: str | None, chunks: Chunks, prompt_tokens: int | None = None,
                tokens_per_unit: float | None = None, prefill_seconds: float | None = None,
                computed_tokens: int | None = None) -> PromptReuse:
        """Analyse one prompt against its group's window, then add it. `tokens_per_unit` is 1 for
        chunks measured in tokens (traces); otherwise the model's learned tokens per character.
        Returns the result in tokens."""
        totals = self._totals.setdefault(model, _ModelTotals())
        if tokens_per_unit is None and prompt_tokens and chunks.size:
            totals.cal_tokens += prompt_tokens
            totals.cal_units += chunks.size
        if prefill_seconds is not None and computed_tokens:
            totals.prefill_seconds += prefill_seconds
            totals.prefill_tokens += computed_tokens
        ratio = tokens_per_unit or (totals.cal_tokens / totals.cal_units if totals.cal_units else DEFAULT_TOKENS_PER_CHAR)
        tenant = DEFAULT_TENANT if not tenant else self._tenants.label(tenant)
        group = self._groups.get((model, tenant))
        if group is None:
            group = self._groups[(model, tenant)] = _Group(PromptWindow(self.window),
                                                           deque(maxlen=self.window or None))
        raw = group.window.analyse_and_add(chunks, self.max_span / ratio, self.min_run / ratio)
        size = float(prompt_tokens) if prompt_tokens and tokens_per_unit is None else raw.size * ratio
        scale = size / raw.size if raw.size else 0.0
        reuse = PromptReuse(size, raw.prefix * scale,
                            raw.span_offset * scale if raw.span_offset is not None else None,
                            raw.span_length * scale, raw.movable * scale)
        group.recent.append(reuse)
        totals.requests += 1
        totals.tokens += reuse.size
        totals.prefix += reuse.prefix
        if reuse.span_offset is not None:
            totals.span_requests += 1
            totals.movable += reuse.movable
            totals.offset_counts[bisect_left(OFFSET_BUCKETS, reuse.span_offset)] += 1
            totals.offset_sum += reuse.span_offset
            rate = self.prefill_seconds_per_token(model)
            if rate is not None:
                totals.saving += reuse.movable * rate
        return reuse

    def prefill_seconds_per_token(self, model: str) -> float | None:
        """The engine's scraped prefill rate, else the upstream's per-request timings, else None."""
        rate = self._prefill_rate(model) if self._prefill_rate is not None else None
        if rate is None:
            totals = self._totals.get(model)
            if totals is not None and totals.prefill_tokens:
                rate = totals.prefill_seconds / totals.prefill_tokens
        return rate

    # ---- answers ------------------------------------------------------------------------------
    def advice(self) -> list[Advice]:
        out = []
        for (model, tenant), group in sorted(self._groups.items()):
            recent = list(group.recent)
            n, tokens = len(recent), sum(r.size for r in recent) or 1.0
            prefix = sum(r.prefix for r in recent)
            spans = [r for r in recent if r.span_offset is not None]
            share = len(spans) / n if n else 0.0
            rate = self.prefill_seconds_per_token(model)
            if spans and share >= self.min_share:
                movable = statistics.fmean(r.movable for r in spans)
                offset = statistics.median(r.span_offset for r in spans)
                length = statistics.median(r.span_length for r in spans)
                saving = movable * rate if rate is not None else None
            else:
                movable, offset, length, saving = 0.0, None, None, None
            out.append(Advice(model, tenant, n, tokens / n if n else 0.0, prefix / tokens, share, offset, length,
                              movable, (prefix + sum(r.movable for r in spans)) / tokens if offset is not None
                              else prefix / tokens, rate, saving))
        return out

    def report(self) -> dict:
        groups = [a.to_json() for a in self.advice()]
        return {"window_requests": self.window, "max_span_tokens": self.max_span, "min_run_tokens": self.min_run,
                "groups": groups, "with_advice": sum(1 for g in groups if g["span_offset_tokens"] is not None)}

    # ---- Prometheus ---------------------------------------------------------------------------
    def collect(self):
        items = sorted(self._totals.items())

        def counter(name: str, doc: str, value):
            fam = CounterMetricFamily(name, doc, labels=["model"])
            for model, t in items:
                fam.add_metric([model], value(t))
            return fam

        yield counter("goodput_prompt_requests", "Requests whose prompt layout was analysed.", lambda t: t.requests)
        yield counter("goodput_prompt_tokens", "Prompt tokens analysed (estimated from characters).", lambda t: t.tokens)
        yield counter("goodput_prompt_prefix_reusable_tokens",
                      "Prompt tokens that repeat a recent prompt as an exact prefix (a prefix cache can reuse them).",
                      lambda t: t.prefix)
        yield counter("goodput_prompt_volatile_span_requests",
                      "Requests whose shared text resumes after a short volatile span.", lambda t: t.span_requests)
        yield counter("goodput_prompt_movable_tokens",
                      "Prompt tokens behind a volatile span: cacheable if the span moved to the end.", lambda t: t.movable)
        yield counter("goodput_prompt_ttft_saving_seconds",
                      "Estimated prefill time those movable tokens cost (seconds, summed over requests).",
                      lambda t: t.saving)
        fam = HistogramMetricFamily("goodput_prompt_volatile_span_offset_tokens",
                                    "Where the volatile span starts, in prompt tokens (estimated).", labels=["model"])
        for model, t in items:
            cumulative, buckets = 0, []
            for bound, count in zip(OFFSET_BUCKETS + (float("inf"),), t.offset_counts):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else str(float(bound)), cumulative))
            fam.add_metric([model], buckets, t.offset_sum)
        yield fam

    def describe(self):
        return []
