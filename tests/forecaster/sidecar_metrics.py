"""A sidecar-shaped /metrics endpoint for tests: real prometheus_client counters and gauges with
DESIGN.md's names, served by prometheus_client's own HTTP server. The tests drive the values, so
they know exactly what the forecaster must read."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class FakeSidecarMetrics:
    def __init__(self, port: int):
        self.port = port
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("goodput_requests", "requests", ["model", "slo_class", "outcome"], registry=r)
        self.input_tokens = Counter("goodput_input_tokens", "in", ["model", "slo_class"], registry=r)
        self.output_tokens = Counter("goodput_output_tokens", "out", ["model", "slo_class"], registry=r)
        self.in_flight = Gauge("goodput_requests_in_flight", "in flight", ["model"], registry=r)
        self.waiting = Gauge("goodput_engine_requests_waiting", "waiting", ["model"], registry=r)
        self.running = Gauge("goodput_engine_requests_running", "running", ["model"], registry=r)
        self.kv = Gauge("goodput_engine_kv_cache_usage_ratio", "kv", ["model"], registry=r)
        self.preemptions = Counter("goodput_engine_preemptions", "preemptions", ["model"], registry=r)
        self.prefill = Histogram("goodput_engine_prefill_time_seconds", "prefill", ["model"], registry=r)
        self.queue = Histogram("goodput_engine_queue_time_seconds", "queue", ["model"], registry=r)
        self.generation = Counter("goodput_engine_generation_tokens", "generated", ["model"], registry=r)
        self.steps = Counter("goodput_engine_steps", "iterations", ["model"], registry=r)
        token_buckets = tuple(float(2 ** k) for k in range(18))
        self.input_hist = Histogram("goodput_request_input_tokens", "prompt tokens", ["model"],
                                    buckets=token_buckets, registry=r)
        self.output_hist = Histogram("goodput_request_output_tokens", "output tokens", ["model"],
                                     buckets=token_buckets, registry=r)
        self.arrived_squared = Counter("goodput_requests_arrived_squared", "arrival clumps", ["model", "window_seconds"],
                                       registry=r)
        self.up = Gauge("goodput_engine_up", "up", registry=r)
        self.up.set(1)
        self.server, self.thread = start_http_server(port, addr="127.0.0.1", registry=r)

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def serve(self, good: int, violated: int = 0, waiting: float = 0.0, kv: float = 0.0) -> None:
        self.requests.labels("m", "default", "good").inc(good)
        if violated:
            self.requests.labels("m", "default", "slo_violated").inc(violated)
        self.input_tokens.labels("m", "default").inc(100 * (good + violated))
        self.output_tokens.labels("m", "default").inc(10 * (good + violated))
        for _ in range(good + violated):   # each request: 100 prompt tokens, 10 out, 0.2 s prefill, 0.05 s queued
            self.input_hist.labels("m").observe(100)
            self.output_hist.labels("m").observe(10)
            self.prefill.labels("m").observe(0.2)
            self.queue.labels("m").observe(0.05)
        self.generation.labels("m").inc(10 * (good + violated))
        for window, per_request in (("0.1", 3), ("1", 5), ("10", 9)):   # as if clumped, more so at longer windows
            self.arrived_squared.labels("m", window).inc(per_request * (good + violated))
        self.steps.labels("m").inc(5 * (good + violated))
        self.waiting.labels("m").set(waiting)
        self.kv.labels("m").set(kv)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
