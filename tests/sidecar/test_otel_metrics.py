"""OpenTelemetry GenAI metrics, exported over real OTLP/HTTP to an in-test receiver.

The receiver decodes the protobuf the SDK's OTLPMetricExporter sends. Every OTel value is
compared with the sidecar's own Prometheus series for the same requests: the two exports come
from one measurement, so counts, sums and bucket counts must be equal, not merely close.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

from sidecar.bench.otlp_sink import make_server
from sidecar.metrics import E2E_BUCKETS, TOKEN_BUCKETS, TTFT_BUCKETS
from tests.support import free_port

CHAT = "/v1/chat/completions"


@pytest.fixture
def receiver():
    port = free_port()
    server, received = make_server(port, keep=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{port}/v1/metrics", received
    server.shutdown()


@pytest.fixture
def meters(receiver):
    # An interval far beyond the test: exports happen only at force_flush, so the test decides when.
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=receiver[0]), export_interval_millis=3_600_000)
    provider = MeterProvider(metric_readers=[reader])
    yield provider
    provider.shutdown()


def _exported(bodies: list[bytes]) -> dict:
    """name -> (unit, [data points]) from the last export (temporality is cumulative)."""
    req = ExportMetricsServiceRequest()
    req.ParseFromString(bodies[-1])
    out = {}
    for rm in req.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                out[m.name] = (m.unit, kind, list(getattr(m, kind).data_points))
    return out


def _attrs(point) -> dict:
    return {a.key: (a.value.string_value or a.value.int_value) for a in point.attributes}


def _drive(live) -> None:
    sidecar_url = live.url
    with httpx.Client(timeout=10) as client:
        for ttft, itl, n in ((0.02, 0.005, 4), (0.06, 0.01, 6), (0.0, 0.0, 3)):
            r = client.post(sidecar_url + CHAT, json={"model": "scripted", "stream": True, "max_tokens": n,
                                                      "messages": [{"role": "user", "content": "hi"}],
                                                      "script": {"ttft": ttft, "itl": itl}})
            assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
        r = client.post(sidecar_url + "/v1/completions", json={"model": "scripted", "prompt": "x", "max_tokens": 5,
                                                              "stream": True, "script": {"ttft": 0.01, "itl": 0.002}})
        assert r.status_code == 200
        r = client.post(sidecar_url + "/v1/completions", json={"model": "scripted", "prompt": "x", "max_tokens": 2,
                                                              "script": {"status": 500}})
        assert r.status_code == 500
    # The client can have its answer before the handler's finally has run: wait for the record.
    deadline = time.monotonic() + 5
    while live.value("goodput_e2e_seconds_count", model="scripted", slo_class="interactive") < 5:
        assert time.monotonic() < deadline, "the sidecar did not account 5 requests"
        time.sleep(0.01)


def _prom_buckets(live, name: str, bounds) -> list[int]:
    """Per-bucket (not cumulative) counts of a Prometheus histogram, +Inf last."""
    labels = {"model": "scripted", "slo_class": "interactive"}
    cumulative = [live.value(f"{name}_bucket", **labels, le=str(float(b))) for b in bounds]
    cumulative.append(live.value(f"{name}_count", **labels))
    return [int(c - p) for c, p in zip(cumulative, [0.0] + cumulative[:-1])]


def _merged(points) -> tuple[int, float, list[int]]:
    counts = [0] * len(points[0].bucket_counts)
    for p in points:
        counts = [a + b for a, b in zip(counts, p.bucket_counts)]
    return sum(p.count for p in points), sum(p.sum for p in points), counts


def test_genai_metrics_equal_the_prometheus_histograms(sidecars, upstream, receiver, meters):
    live = sidecars.start(upstream, models=("scripted",), meter_provider=meters)
    _drive(live)
    # Measurements wait in the queue until a collection: nothing was recorded on the request path.
    assert len(live.app.otel._pending) == 5
    meters.force_flush()
    assert len(live.app.otel._pending) == 0
    got = _exported(receiver[1].metrics)
    assert "gen_ai.client.operation.duration" not in got          # legacy names only behind the flag
    assert "goodput.otel.flush" not in got                        # the flush hook never has data points

    port = int(upstream.rsplit(":", 1)[1])
    base = {"gen_ai.provider.name": "openai", "gen_ai.request.model": "scripted", "goodput.slo_class": "interactive",
            "server.address": "127.0.0.1", "server.port": port}
    for name, prom, bounds in (("gen_ai.server.request.duration", "goodput_e2e_seconds", E2E_BUCKETS),
                               ("gen_ai.server.time_to_first_token", "goodput_ttft_seconds", TTFT_BUCKETS),
                               ("gen_ai.server.time_per_output_token", "goodput_tpot_seconds", TOKEN_BUCKETS)):
        unit, kind, points = got[name]
        assert (unit, kind) == ("s", "histogram")
        assert all(tuple(p.explicit_bounds) == bounds for p in points)
        count, total, buckets = _merged(points)
        labels = {"model": "scripted", "slo_class": "interactive"}
        assert count == live.value(f"{prom}_count", **labels)
        assert total == pytest.approx(live.value(f"{prom}_sum", **labels), rel=1e-12)
        assert buckets == _prom_buckets(live, prom, bounds)
    # Durations: 3 chats and 2 completions, one of which failed with the upstream's 500.
    duration = {tuple(sorted(_attrs(p).items())): p.count for p in got["gen_ai.server.request.duration"][2]}
    assert duration == {tuple(sorted((base | {"gen_ai.operation.name": "chat"}).items())): 3,
                        tuple(sorted((base | {"gen_ai.operation.name": "text_completion"}).items())): 1,
                        tuple(sorted((base | {"gen_ai.operation.name": "text_completion",
                                              "error.type": "http_500"}).items())): 1}
    # TTFT and TPOT only for the 4 successful requests (the failed one has none to give).
    assert sum(p.count for p in got["gen_ai.server.time_to_first_token"][2]) == 4
    for name, prom in (("gen_ai.client.inference.usage.input_tokens", "goodput_input_tokens_total"),
                       ("gen_ai.client.inference.usage.output_tokens", "goodput_output_tokens_total")):
        unit, kind, points = got[name]
        assert (unit, kind) == ("{token}", "sum")
        assert {_attrs(p)["gen_ai.token.modality"] for p in points} == {"unknown"}
        # Scripted usage: 7 prompt tokens per request that sent usage; output 4+6+3+5 from the streams.
        assert sum(p.as_int for p in points) == live.value(prom, model="scripted", slo_class="interactive") > 0
    assert sum(p.as_int for p in got["gen_ai.client.inference.usage.output_tokens"][2]) == 18


def test_legacy_names_behind_the_flag(sidecars, upstream, receiver, meters):
    live = sidecars.start(upstream, models=("scripted",), meter_provider=meters, otel_legacy_metrics=True,
                          genai_provider="vllm")
    _drive(live)
    meters.force_flush()
    got = _exported(receiver[1].metrics)
    unit, kind, points = got["gen_ai.client.operation.duration"]
    assert (unit, kind) == ("s", "histogram")
    assert sum(p.count for p in points) == live.value("goodput_e2e_seconds_count", model="scripted",
                                                      slo_class="interactive") == 5
    assert {_attrs(p)["gen_ai.provider.name"] for p in points} == {"vllm"}
    unit, kind, points = got["gen_ai.client.token.usage"]
    assert (unit, kind) == ("{token}", "histogram")
    by_type = {}
    for p in points:
        by_type[_attrs(p)["gen_ai.token.type"]] = by_type.get(_attrs(p)["gen_ai.token.type"], 0) + p.sum
    assert by_type == {"input": live.value("goodput_input_tokens_total", model="scripted", slo_class="interactive"),
                       "output": 18}
    assert "gen_ai.server.request.duration" in got              # the current names stay on


def test_span_carries_the_provider_name(sidecar):
    httpx.post(sidecar.url + CHAT, timeout=10, json={"model": "scripted", "max_tokens": 2, "stream": True,
                                                     "messages": [{"role": "user", "content": "x"}],
                                                     "script": {"ttft": 0, "itl": 0}})
    span = sidecar.finished_spans(1)[0]
    assert span.attributes["gen_ai.provider.name"] == "openai"
    assert span.attributes["gen_ai.operation.name"] == "chat"


def test_empty_provider_name_is_refused_with_the_flag_name():
    from sidecar.config import ProxyConfig
    with pytest.raises(ValueError, match="--genai-provider"):
        ProxyConfig(upstream="http://127.0.0.1:8000", genai_provider="")


def test_no_endpoint_means_no_meter_provider(monkeypatch):
    from sidecar.otel_metrics import meter_provider_from_env
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    assert meter_provider_from_env() is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://127.0.0.1:1/v1/metrics")
    provider = meter_provider_from_env()
    assert provider is not None
    provider.shutdown(timeout_millis=100)
