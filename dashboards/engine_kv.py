"""Dashboard 2, "Engine and KV cache": the signals that move before users feel it.

The engine gauges come from each sidecar, which scrapes its engine's /metrics (vLLM names) and
re-exports them under goodput_engine_*, so the same panels work for vLLM, SGLang and the bundled
engine.
"""

from __future__ import annotations

from dashboards.contract import name as m
from dashboards.panels import MODEL, Query, dashboard, heat, series, single

UID = "goodput-engine"
RATE = "$__rate_interval"


def build():
    kv = m("goodput_engine_kv_cache_usage_ratio")
    hits = m("goodput_engine_prefix_cache_hits_total")
    queries = m("goodput_engine_prefix_cache_queries_total")
    itl = m("goodput_itl_seconds_bucket")
    status = [
        single("Engines up", [Query(f"sum({m('goodput_engine_up')})", "up")], "short",
               description="Sidecars whose last scrape of their engine's /metrics succeeded."),
        single("Engines down", [Query(f"count({m('goodput_engine_up')} == 0) or vector(0)", "down")], "short",
               description="Sidecars that cannot read their engine's /metrics (alert: GoodputEngineScrapeDown)."),
        single("Draining", [Query(f"sum({m('goodput_draining')})", "draining")], "short",
               description="Sidecars draining before shutdown (alert: GoodputDrainTooLong)."),
        single("Max KV-cache usage", [Query(f"max({kv}{{{MODEL}}})", "max")], "percentunit", decimals=1,
               description="Fullest KV cache among the selected models' engines."),
    ]
    cache = [
        series("KV-cache usage", [Query(f"{kv}{{{MODEL}}}", "{{model}} {{instance}}")], "percentunit",
               min=0, max=1, lines=[0.95],
               description="Share of KV-cache blocks in use, per engine; 95% is the saturation alert's line."),
        series("Preemptions", [
            Query(f"sum by (model) (rate({m('goodput_engine_preemptions_total')}{{{MODEL}}}[{RATE}]))", "{{model}}")
        ], "short", min=0, description="Running requests evicted for KV-cache space, per second."),
        series("Queue: waiting and running", [
            Query(f"sum by (model) ({m('goodput_engine_requests_waiting')}{{{MODEL}}})", "{{model}} waiting"),
            Query(f"sum by (model) ({m('goodput_engine_requests_running')}{{{MODEL}}})", "{{model}} running"),
            Query(f"{_rate('goodput_decode_batch_total')} / {_rate('goodput_decode_batch_requests_total')}",
                  "{{model}} decode batch per request"),
        ], "short", min=0, description="Requests queued in the engines and requests in their running batch (summed "
                                       "over engines); and, per request, the mean count decoding beside it at its "
                                       "sidecar, itself included: the batch its TPOT was measured at."),
        series("Prefix-cache hit rate", [
            Query(f"sum by (model) (rate({hits}{{{MODEL}}}[{RATE}])) / sum by (model) (rate({queries}{{{MODEL}}}[{RATE}]))",
                  "{{model}}")
        ], "percentunit", min=0, max=1, description="Prompt tokens found in the prefix cache / prompt tokens looked up."),
    ]
    latency = [
        heat("Inter-token latency", Query(f"sum by (le) (increase({itl}{{{MODEL}}}[{RATE}]))", "{{le}}"), "s",
             description="Every gap between streamed chunks, as seen by clients (a chunk of k tokens counts once)."),
        series("Inter-token latency percentiles", [
            Query(f"histogram_quantile({q}, sum by (le) (rate({itl}{{{MODEL}}}[{RATE}])))", f"p{round(q * 100)}")
            for q in (0.5, 0.9, 0.99)
        ], "s", min=0),
    ]
    return dashboard(UID, "goodput / Engine and KV cache", "dashboards/engine_kv.py",
                     "Engine state behind the sidecars: KV-cache usage, preemptions, queues, prefix-cache "
                     "hits, where TTFT goes, prompt-layout advice, inter-token latency, scrape health.",
                     [("Status", status), ("KV cache and queues", cache), ("Where TTFT goes", ttft_split()),
                      ("Streaming", latency)])


def _rate(metric: str) -> str:
    return f"sum by (model) (rate({m(metric)}{{{MODEL}}}[{RATE}]))"


def ttft_split() -> list:
    """The engine's per-request split of TTFT, and what the prompt layout leaves on the table."""
    requests = _rate("goodput_engine_prefill_time_seconds_count")
    per_token = f"({_rate('goodput_engine_prefill_time_seconds_sum')} / {_rate('goodput_engine_prompt_tokens_computed_total')})"
    analysed_tokens = _rate("goodput_prompt_tokens_total")
    return [
        series("Where TTFT goes", [
            Query(f"{_rate('goodput_engine_queue_time_seconds_sum')} / {_rate('goodput_engine_queue_time_seconds_count')}",
                  "{{model}} queue"),
            Query(f"{_rate('goodput_engine_prefill_time_seconds_sum')} / {requests}", "{{model}} prefill of uncached tokens"),
            Query(f"{_rate('goodput_engine_prompt_tokens_cached_total')} / {requests} * {per_token}",
                  "{{model}} cached tokens skipped (est.)"),
        ], "s", min=0, stacked=True,
            description="Mean per request, from the engine's own histograms: time queued before first scheduled, "
                        "prefill of the prompt tokens not in the prefix cache, and (not spent, estimated at the "
                        "engine's measured prefill time per token) the prefill the cached tokens skipped."),
        series("Engine time per request: p90 of queue, prefill and decode", [
            Query(f"histogram_quantile(0.9, sum by (model, le) (rate({m(f'goodput_engine_{part}_time_seconds_bucket')}"
                  f"{{{MODEL}}}[{RATE}])))", f"{{{{model}}}} {part}")
            for part in ("queue", "prefill", "decode")
        ], "s", min=0, description="The engine's per-request histograms (vLLM, the bundled engine; SGLang reports "
                                   "queue time only). Buckets are the engine's own, so p90s are coarse."),
        series("Prompt tokens: cached and computed", [
            Query(_rate("goodput_engine_prompt_tokens_cached_total"), "{{model}} cached"),
            Query(_rate("goodput_engine_prompt_tokens_computed_total"), "{{model}} computed"),
        ], "short", min=0, stacked=True, description="Prompt tokens per second the engine served from its prefix "
                                                     "cache and computed in prefill."),
        series("Prompt layout: what a prefix cache could reuse", [
            Query(f"{_rate('goodput_prompt_prefix_reusable_tokens_total')} / {analysed_tokens}",
                  "{{model}} exact prefix of a recent prompt"),
            Query(f"{_rate('goodput_prompt_movable_tokens_total')} / {analysed_tokens}",
                  "{{model}} shared, behind a volatile span"),
            Query(f"{_rate('goodput_prompt_volatile_span_requests_total')} / {_rate('goodput_prompt_requests_total')}",
                  "{{model}} requests with a volatile span"),
        ], "percentunit", min=0, max=1,
            description="From the sidecar's keyed hashes of each prompt (never text): the share of prompt tokens "
                        "that repeat a recent prompt exactly from the start, the share that repeats only after a "
                        "short divergent span (an id or timestamp near the top), and the share of requests with "
                        "such a span. /advice on a sidecar says where the span sits."),
        series("Prompt layout: TTFT the move would give back", [
            Query(f"{_rate('goodput_prompt_ttft_saving_seconds_total')} / {_rate('goodput_prompt_requests_total')}",
                  "{{model}}"),
        ], "s", min=0, description="Estimated prefill time per request (over all requests) that moving the "
                                   "volatile span to the end of the prompt would save, at the engine's measured "
                                   "prefill time per token."),
        heat("Prompt layout: where the volatile span starts",
             Query(f"sum by (le) (increase({m('goodput_prompt_volatile_span_offset_tokens_bucket')}{{{MODEL}}}[{RATE}]))",
                   "{{le}}"), "short",
             description="Token offset (estimated) at which requests' shared text is interrupted by a volatile span."),
    ]
