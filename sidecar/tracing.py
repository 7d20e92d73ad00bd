"""OpenTelemetry: one SERVER span per measured request, GenAI attribute names, W3C propagation.

The tracer provider is injected (tests pass one with an InMemorySpanExporter). In production
`provider_from_env()` exports over OTLP/HTTP when the standard `OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` variable is set (the exporter reads the rest of the
`OTEL_EXPORTER_OTLP_*` variables itself), and otherwise records nothing.

Prompt and completion text and the Authorization header are never attributes unless content
capture is switched on, and even then Authorization is not: only `gen_ai.input.messages` and
`gen_ai.output.messages` are added.
"""

from __future__ import annotations

import json
import os
import time

from opentelemetry.propagators.textmap import DefaultGetter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sidecar.slo import SloClass, Verdict
from sidecar.timing import RequestTiming

_PROPAGATOR = TraceContextTextMapPropagator()
_CONTENT_LIMIT = 16_384


def provider_from_env(service_name: str = "goodput-sidecar") -> TracerProvider:
    """OTLP/HTTP export when an endpoint is configured. Without one, spans are not recorded
    (sampler off, unless OTEL_TRACES_SAMPLER says otherwise): recording them for nobody cost
    about 90 µs of CPU per request. The sidecar then creates no span at all (`NoSpan`), and the
    client's trace context reaches the upstream as the client sent it."""
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        return provider
    if os.environ.get("OTEL_TRACES_SAMPLER"):
        return TracerProvider(resource=resource)
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
    return TracerProvider(resource=resource, sampler=ALWAYS_OFF)


def records_spans(provider) -> bool:
    """False for a provider that can record nothing: the SDK's with its sampler off (what
    `provider_from_env` builds without an endpoint) or the API's no-op one."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
    from opentelemetry.trace import NoOpTracerProvider
    return not (isinstance(provider, NoOpTracerProvider) or getattr(provider, "sampler", None) is ALWAYS_OFF)


class NoSpan:
    """A request's span when nothing records spans: every call does nothing.

    A span that is never sampled would still cost a trace-context parse, an SDK span and an
    injection per request (a median 132 µs of CPU in the server here, 12 µs in a hot loop), and
    with the sampler off it would rewrite the client's `traceparent` with the sampled flag
    cleared, so an engine that traces would drop the client's sampled trace. Without one, the
    headers the client sent (`traceparent`, `tracestate`) are forwarded unchanged, as by any proxy
    that is not instrumented.
    """

    __slots__ = ("operation",)

    def __init__(self, operation: str):
        self.operation = operation

    def inject(self, headers: dict) -> None:
        pass

    def request_attributes(self, model, stream, max_tokens) -> None:
        pass

    def capture_input(self, body: dict) -> None:
        pass

    def admission(self, ticket) -> None:
        pass

    def end(self, timing, verdict, slo, error_type, end_perf, capture_output: bool = False) -> None:
        pass


class _HeaderGetter(DefaultGetter):
    def get(self, carrier, key):
        value = carrier.get(key)
        return [value] if value is not None else None


class RequestSpan:
    """The span of one request: opened at receipt, ended exactly once by `end()`."""

    __slots__ = ("span", "_start_wall_ns", "_start_perf", "_operation", "_ended")

    def __init__(self, tracer, operation: str, incoming_headers, start_perf: float,
                 server_address: str, server_port: int | None, provider_name: str = "openai"):
        context = _PROPAGATOR.extract(incoming_headers, getter=_HeaderGetter())
        self._start_wall_ns = time.time_ns()
        self._start_perf = start_perf
        self._operation = operation
        attrs = {"gen_ai.operation.name": operation, "gen_ai.provider.name": provider_name,
                 "server.address": server_address}
        if server_port is not None:
            attrs["server.port"] = server_port
        # Named `{operation} {model}` once the body has been read (request_attributes).
        self.span = tracer.start_span(operation, context=context, kind=SpanKind.SERVER, attributes=attrs,
                                      start_time=self._start_wall_ns)
        self._ended = False

    @property
    def operation(self) -> str:
        return self._operation

    def inject(self, headers: dict) -> None:
        """Write `traceparent` (and `tracestate`) for the upstream request into `headers`."""
        from opentelemetry import trace
        _PROPAGATOR.inject(headers, context=trace.set_span_in_context(self.span))

    def request_attributes(self, model: str | None, stream: bool, max_tokens: int | None) -> None:
        attrs: dict = {"gen_ai.request.stream": stream}
        if model:
            self.span.update_name(f"{self._operation} {model}")
            attrs["gen_ai.request.model"] = model
        if isinstance(max_tokens, int):
            attrs["gen_ai.request.max_tokens"] = max_tokens
        self.span.set_attributes(attrs)

    def capture_input(self, body: dict) -> None:
        content = body.get("messages", body.get("prompt"))
        if content is not None:
            self.span.set_attribute("gen_ai.input.messages", json.dumps(content)[:_CONTENT_LIMIT])

    def admission(self, ticket) -> None:
        """The guard's predictions for this request (sidecar/admission.py `Ticket`), and why it was shed."""
        attrs = {}
        if ticket.predicted_ttft is not None:
            attrs["goodput.admission.predicted_ttft_seconds"] = ticket.predicted_ttft
        if ticket.predicted_tpot is not None:
            attrs["goodput.admission.predicted_tpot_seconds"] = ticket.predicted_tpot
        if ticket.reason is not None:
            attrs["goodput.admission.shed_reason"] = ticket.reason
        if ticket.was_held:
            attrs["goodput.admission.held_seconds"] = ticket.held_seconds
        if attrs:
            self.span.set_attributes(attrs)

    def end(self, timing: RequestTiming, verdict: Verdict, slo: SloClass, error_type: str | None, end_perf: float,
            capture_output: bool = False) -> None:
        if self._ended:
            return
        self._ended = True
        span = self.span
        # One set_attributes call: the SDK takes its lock and validates once, not per attribute.
        attrs = {"goodput.slo_class": slo.name, "gen_ai.usage.output_tokens": timing.output_tokens,
                 "goodput.e2e_seconds": timing.e2e, "goodput.outcome": verdict.outcome,
                 "goodput.slo_violated": list(verdict.violated)}
        if timing.model:
            attrs["gen_ai.response.model"] = timing.model
        if timing.finish_reasons:
            attrs["gen_ai.response.finish_reasons"] = list(timing.finish_reasons)
        if timing.input_tokens is not None:
            attrs["gen_ai.usage.input_tokens"] = timing.input_tokens
        if timing.ttft is not None:
            attrs["goodput.ttft_seconds"] = attrs["gen_ai.response.time_to_first_chunk"] = timing.ttft
        if timing.tpot is not None:
            attrs["goodput.tpot_seconds"] = timing.tpot
        # Where the TTFT went, as far as the upstream says: cached prompt tokens (OpenAI usage;
        # GenAI's cache_read attribute) and its own queue / prefill time per request.
        if timing.cached_tokens is not None:
            attrs["gen_ai.usage.cache_read.input_tokens"] = timing.cached_tokens
        if timing.engine_queue is not None:
            attrs["goodput.engine.queue_seconds"] = timing.engine_queue
        if timing.engine_prefill is not None:
            attrs["goodput.engine.prefill_seconds"] = timing.engine_prefill
        if capture_output and timing.output_text is not None:
            attrs["gen_ai.output.messages"] = timing.output_text[:_CONTENT_LIMIT]
        if error_type is not None:
            attrs["error.type"] = error_type
        span.set_attributes(attrs)
        if timing.first_token_at is not None:
            span.add_event("gen_ai.first_token", timestamp=self._wall(timing.first_token_at))
        if error_type is not None:
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=self._wall(end_perf))

    def _wall(self, perf: float) -> int:
        return self._start_wall_ns + int((perf - self._start_perf) * 1e9)
