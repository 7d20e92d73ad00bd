"""OpenTelemetry metrics: the sidecar's measurements under the GenAI semantic conventions' names.

Exported only when an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`), beside the Prometheus series, never instead of them.
Names follow the GenAI conventions now kept in open-telemetry/semantic-conventions-genai
(status: development). The sidecar measures the way a model server does (it is the server its
clients talk to), so its latencies use the model-server instruments; tokens use the inference
token counters, the only token instruments the current conventions define:

| instrument | type, unit | recorded for | same values as |
|---|---|---|---|
| `gen_ai.server.request.duration` | histogram, s | every request, `error.type` on failures | `goodput_e2e_seconds` |
| `gen_ai.server.time_to_first_token` | histogram, s | successful requests | `goodput_ttft_seconds` |
| `gen_ai.server.time_per_output_token` | histogram, s | successful requests | `goodput_tpot_seconds` |
| `gen_ai.client.inference.usage.input_tokens` | counter, {token} | every request | `goodput_input_tokens_total` |
| `gen_ai.client.inference.usage.output_tokens` | counter, {token} | every request | `goodput_output_tokens_total` |

With `legacy=True` (`--otel-legacy-metrics`) the names of semantic-conventions v1.36-v1.41 are
emitted too, which many existing dashboards query: `gen_ai.client.operation.duration` (s) and
`gen_ai.client.token.usage` (histogram, {token}, `gen_ai.token.type` = input | output).

Histogram buckets are the sidecar's own (sidecar.metrics), not the conventions' advisory ones:
the conventions' TPOT buckets start at 10 ms, where fast GPUs already stream, and equal buckets
let an OTel backend and Prometheus show the same percentiles.

Attributes: `gen_ai.operation.name`, `gen_ai.provider.name`, `gen_ai.request.model` (the
bounded model label, so a client inventing names cannot grow the series), `server.address` and
`server.port` of the upstream, `goodput.slo_class`, `error.type` on the duration of failed
requests, and `gen_ai.token.modality` = `unknown` on the token counters. `gen_ai.response.model` is left out: it comes from the upstream unbounded.

Cost on the request path: one deque append. prometheus_client and the OTel SDK both take a lock
per observation; the SDK's is dearer (attribute hashing, exemplar checks), so measurements are
queued and recorded in one batch by the exporter's own thread when it collects (from an
observable instrument's callback, which the SDK runs before it reads the histograms).
"""

from __future__ import annotations

import os
from collections import deque

from opentelemetry.metrics import CallbackOptions, Observation

from sidecar.metrics import E2E_BUCKETS, TOKEN_BUCKETS, TTFT_BUCKETS
from sidecar.timing import RequestTiming

# The conventions' advisory buckets for token counts (powers of 4), kept for the legacy histogram.
TOKEN_COUNT_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)


# OpenAI-style usage does not split tokens by modality; the conventions ask for `unknown` then.
_MODALITY = ("gen_ai.token.modality", "unknown")
_INPUT, _OUTPUT = ("gen_ai.token.type", "input"), ("gen_ai.token.type", "output")


def metrics_endpoint_configured() -> bool:
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"))


def meter_provider_from_env(service_name: str = "goodput-sidecar"):
    """A MeterProvider exporting over OTLP/HTTP every `OTEL_METRIC_EXPORT_INTERVAL` ms (default
    60 s), or None without an endpoint: then no OTel metric is recorded at all."""
    if not metrics_endpoint_configured():
        return None
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    return MeterProvider(resource=resource, metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())])


class GenAiMetrics:
    """Queues one entry per ended request; records them into the OTel instruments in batches."""

    def __init__(self, meter_provider, provider_name: str, server_address: str, server_port: int | None,
                 legacy: bool = False):
        meter = meter_provider.get_meter("goodput.sidecar")
        self._base = {"gen_ai.provider.name": provider_name, "server.address": server_address}
        if server_port is not None:
            self._base["server.port"] = server_port
        self._pending: deque = deque()   # append (event loop) and popleft (exporter thread) are thread-safe
        self._attrs: dict[tuple, dict] = {}
        self.duration = meter.create_histogram(
            "gen_ai.server.request.duration", unit="s", explicit_bucket_boundaries_advisory=E2E_BUCKETS,
            description="Time from receipt of the request to the end of the response.")
        self.ttft = meter.create_histogram(
            "gen_ai.server.time_to_first_token", unit="s", explicit_bucket_boundaries_advisory=TTFT_BUCKETS,
            description="Time from receipt of the request to the first content chunk sent to the client.")
        self.tpot = meter.create_histogram(
            "gen_ai.server.time_per_output_token", unit="s", explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
            description="Per-request mean decode time per output token: (E2E - TTFT) / (output_tokens - 1).")
        self.input_tokens = meter.create_counter(
            "gen_ai.client.inference.usage.input_tokens", unit="{token}",
            description="Prompt tokens, from the upstream's usage.")
        self.output_tokens = meter.create_counter(
            "gen_ai.client.inference.usage.output_tokens", unit="{token}",
            description="Generated tokens, from usage when sent, else counted from the stream.")
        self._legacy = legacy
        if legacy:
            self.legacy_duration = meter.create_histogram(
                "gen_ai.client.operation.duration", unit="s", explicit_bucket_boundaries_advisory=E2E_BUCKETS,
                description="GenAI operation duration (semantic conventions <= v1.41).")
            self.legacy_tokens = meter.create_histogram(
                "gen_ai.client.token.usage", unit="{token}", explicit_bucket_boundaries_advisory=TOKEN_COUNT_BUCKETS,
                description="Number of input and output tokens used (semantic conventions <= v1.41).")
        # NOTE: observes nothing; the SDK calls it at the start of every collection, before it
        # reads the synchronous instruments, which is when the queue is recorded.
        meter.create_observable_gauge("goodput.otel.flush", callbacks=[self._flush_callback],
                                      description="Internal: flushes queued measurements; never has data points.")

    def record(self, operation: str, model: str, slo_name: str, timing: RequestTiming, error_type: str | None,
               successful: bool) -> None:
        """One ended request (from the proxy's finally). `successful`: neither failed nor cancelled."""
        self._pending.append((operation, model, slo_name, timing.e2e, timing.ttft, timing.tpot,
                              timing.input_tokens, timing.output_tokens, error_type, successful))

    def flush(self) -> int:
        """Record everything queued; returns how many requests it recorded. Token counts are summed
        per attribute set first: one add per set and flush instead of two per request (each SDK
        call cleans and hashes the attributes, which is most of its cost)."""
        pending, count = self._pending, 0
        tokens: dict[int, list] = {}          # id(attrs) -> [attrs, input, output]
        while True:
            try:
                (operation, model, slo_name, e2e, ttft, tpot, input_tokens, output_tokens, error_type,
                 successful) = pending.popleft()
            except IndexError:
                break
            count += 1
            attrs = self._attributes(operation, model, slo_name, None)
            failed = self._attributes(operation, model, slo_name, error_type) if error_type else attrs
            self.duration.record(e2e, failed)
            if successful:
                if ttft is not None:
                    self.ttft.record(ttft, attrs)
                if tpot is not None:
                    self.tpot.record(tpot, attrs)
            sums = tokens.get(id(attrs))
            if sums is None:
                sums = tokens[id(attrs)] = [self._attributes(operation, model, slo_name, None, _MODALITY), 0, 0]
            sums[1] += input_tokens or 0
            sums[2] += output_tokens or 0
            if self._legacy:
                self.legacy_duration.record(e2e, failed)
                # Only counts the request had: input from usage, output from usage or the stream.
                if input_tokens is not None:
                    self.legacy_tokens.record(input_tokens, self._attributes(operation, model, slo_name, None, _INPUT))
                if output_tokens or input_tokens is not None:
                    self.legacy_tokens.record(output_tokens, self._attributes(operation, model, slo_name, None, _OUTPUT))
        for attrs, input_sum, output_sum in tokens.values():
            if input_sum:
                self.input_tokens.add(input_sum, attrs)
            if output_sum:
                self.output_tokens.add(output_sum, attrs)
        return count

    def _attributes(self, operation: str, model: str, slo_name: str, error_type: str | None,
                    extra: tuple[str, str] | None = None) -> dict:
        key = (operation, model, slo_name, error_type, extra)
        found = self._attrs.get(key)
        if found is None:
            found = dict(self._base)
            found.update({"gen_ai.operation.name": operation, "gen_ai.request.model": model,
                          "goodput.slo_class": slo_name})
            if error_type:
                found["error.type"] = error_type
            if extra:
                found[extra[0]] = extra[1]
            # error.type comes from bounded sets (http_NNN, the upstream's error type); cap the
            # cache anyway so a misbehaving upstream cannot grow it without bound.
            if len(self._attrs) < 4096:
                self._attrs[key] = found
        return found

    def _flush_callback(self, options: CallbackOptions) -> list[Observation]:
        self.flush()
        return []
