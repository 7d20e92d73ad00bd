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
        ], "short", min=0, description="Requests queued in the engines and requests in their running batch."),
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
                     "hits, inter-token latency, scrape health.",
                     [("Status", status), ("KV cache and queues", cache), ("Streaming", latency)])
