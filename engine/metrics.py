"""The engine's /metrics under vLLM's own names (label model_name), so the sidecar treats the
bundled engine exactly like vLLM. Updated from the engine loop thread (prometheus_client is
thread-safe); counters mirror the engine's cumulative counts by adding the difference.

Only names current vLLM exports: none of those it removed (`gpu_cache_usage_perc`,
`gpu_prefix_cache_*` by vLLM #29330, `time_per_output_token_seconds` by #32661); the sidecar
still reads those from older vLLM servers."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# vLLM's buckets for these histograms.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0)
# vLLM's request_latency_buckets: e2e and the queue / prefill / decode / inference split share them.
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKEN_COUNT_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
# vLLM's buckets for vllm:iteration_tokens_total (tokens computed by one engine step).
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


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
                                    buckets=TOKEN_COUNT_BUCKETS, registry=registry)
        self.gen_len = Histogram("vllm:request_generation_tokens", "Generated tokens per request.", lab,
                                 buckets=TOKEN_COUNT_BUCKETS, registry=registry)
        self._add_request_split(registry, lab)
        # Create every labelled series now, so a scrape shows zeros instead of missing names.
        for metric in (self.running, self.waiting, self.kv_usage, self.preemptions, self.prefix_queries,
                       self.prefix_hits, self.prompt_tokens, self.generation_tokens, self.ttft, self.itl, self.e2e,
                       self.prompt_len, self.gen_len, *self._split_metrics):
            metric.labels(model_name)
        self._seen = {"preemptions": 0, "queries": 0, "hits": 0, "prompt": 0, "generation": 0}

    def _add_request_split(self, registry: CollectorRegistry, lab: list[str]) -> None:
        """vLLM's per-request split of where the time and the prompt went (its loggers.py names,
        buckets and meaning): queue = first scheduled - arrival, prefill = first token - first
        scheduled, decode = last token - first token, inference = prefill + decode; prefill KV
        computed = prompt tokens not served from the prefix cache."""
        def hist(name: str, doc: str, buckets) -> Histogram:
            return Histogram(name, doc, lab, buckets=buckets, registry=registry)

        self.queue_time = hist("vllm:request_queue_time_seconds", "Time requests spent waiting to be scheduled.", E2E_BUCKETS)
        self.prefill_time = hist("vllm:request_prefill_time_seconds", "Time from first scheduled to first token.", E2E_BUCKETS)
        self.decode_time = hist("vllm:request_decode_time_seconds", "Time from first token to last token.", E2E_BUCKETS)
        self.inference_time = hist("vllm:request_inference_time_seconds", "Time from first scheduled to last token.",
                                   E2E_BUCKETS)
        self.kv_computed = hist("vllm:request_prefill_kv_computed_tokens",
                                "New KV tokens computed during prefill (excluding cached tokens).", TOKEN_COUNT_BUCKETS)
        self.iteration_tokens = hist("vllm:iteration_tokens_total", "Tokens computed per engine step.", ITERATION_BUCKETS)
        self.prompt_cached = Counter("vllm:prompt_tokens_cached", "Prompt tokens served from the prefix cache.", lab,
                                     registry=registry)
        self._split_metrics = (self.queue_time, self.prefill_time, self.decode_time, self.inference_time,
                               self.kv_computed, self.iteration_tokens, self.prompt_cached)

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

    def step_done(self, num_tokens: int) -> None:
        self.iteration_tokens.labels(self.model_name).observe(num_tokens)

    def first_token(self, num_cached: int) -> None:
        """At a request's first token, as vLLM counts prompt tokens at prefill."""
        if num_cached > 0:
            self.prompt_cached.labels(self.model_name).inc(num_cached)

    def request_finished(self, reason: str, e2e: float, num_prompt: int, num_output: int,
                         times=None, num_cached: int = 0) -> None:
        m = self.model_name
        self.success.labels(m, reason).inc()
        self.e2e.labels(m).observe(e2e)
        self.prompt_len.labels(m).observe(num_prompt)
        self.gen_len.labels(m).observe(num_output)
        if times is not None:
            self.queue_time.labels(m).observe(times.queue)
            self.prefill_time.labels(m).observe(times.prefill)
            self.decode_time.labels(m).observe(times.decode)
            self.inference_time.labels(m).observe(times.inference)
            self.kv_computed.labels(m).observe(num_prompt - num_cached)
