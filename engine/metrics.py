"""The engine's /metrics under vLLM's own names (label model_name), so the sidecar treats the
bundled engine exactly like vLLM. Updated from the engine loop thread (prometheus_client is
thread-safe); counters mirror the engine's cumulative counts by adding the difference."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# vLLM's buckets for these histograms.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0, 7680.0)


class EngineMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str):
        self.model_name = model_name
        lab = ["model_name"]
        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch.", lab, registry=registry)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", lab, registry=registry)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = full.", lab, registry=registry)
        self.preemptions = Counter("vllm:num_preemptions", "Cumulative preemptions.", lab, registry=registry)
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "Prefix-cache queries, in tokens.", lab, registry=registry)
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "Prefix-cache hits, in tokens.", lab, registry=registry)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefill tokens processed.", lab, registry=registry)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generation tokens processed.", lab, registry=registry)
        self.success = Counter("vllm:request_success", "Finished requests.", lab + ["finished_reason"], registry=registry)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.", lab, buckets=TTFT_BUCKETS, registry=registry)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Inter-token latency.", lab, buckets=ITL_BUCKETS, registry=registry)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.", lab, buckets=E2E_BUCKETS, registry=registry)
        self.prompt_len = Histogram("vllm:request_prompt_tokens", "Prompt tokens per request.", lab,
                                    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000), registry=registry)
        self.gen_len = Histogram("vllm:request_generation_tokens", "Generated tokens per request.", lab,
                                 buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000), registry=registry)
        # Create every labelled series now, so a scrape shows zeros instead of missing names.
        for metric in (self.running, self.waiting, self.kv_usage, self.preemptions, self.prefix_queries,
                       self.prefix_hits, self.prompt_tokens, self.generation_tokens, self.ttft, self.itl, self.e2e,
                       self.prompt_len, self.gen_len):
            metric.labels(model_name)
        self._seen = {"preemptions": 0, "queries": 0, "hits": 0, "prompt": 0, "generation": 0}

    def _add(self, counter: Counter, key: str, total: int) -> None:
        delta = total - self._seen[key]
        if delta > 0:
            counter.labels(self.model_name).inc(delta)
        self._seen[key] = total

    def update_engine(self, engine) -> None:
        """Gauges and counters from the engine's state after a step (engine loop thread)."""
        m, s = self.model_name, engine.scheduler
        self.running.labels(m).set(len(s.running))
        self.waiting.labels(m).set(len(s.waiting))
        self.kv_usage.labels(m).set(engine.kv.usage())
        self._add(self.preemptions, "preemptions", s.num_preemptions)
        self._add(self.prefix_queries, "queries", engine.kv.num_queries)
        self._add(self.prefix_hits, "hits", engine.kv.num_hits)
        self._add(self.prompt_tokens, "prompt", engine.num_prompt_tokens)
        self._add(self.generation_tokens, "generation", engine.num_generation_tokens)

    def request_finished(self, reason: str, e2e: float, num_prompt: int, num_output: int) -> None:
        m = self.model_name
        self.success.labels(m, reason).inc()
        self.e2e.labels(m).observe(e2e)
        self.prompt_len.labels(m).observe(num_prompt)
        self.gen_len.labels(m).observe(num_output)
