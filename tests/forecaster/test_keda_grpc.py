"""KEDA's external-scaler gRPC protocol on the forecaster, called by a real gRPC client over TLS.

KEDA itself (Go) cannot run here; the client makes the calls KEDA makes for a `type: external`
trigger (GetMetricSpec, GetMetrics, IsActive, StreamIsActive) with the trigger metadata it would
send, through grpcio's channel with the forecaster's CA as the only trusted root.
"""

from __future__ import annotations

import time

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from forecaster.keda_grpc import load_proto, start_grpc_server
from forecaster.policy import Decision
from forecaster.server import ForecastState
from forecaster.tls import self_signed
from tests.support import free_port, goodput_command

MESSAGES, SERVICES = load_proto()
DECISION = Decision(desired_replicas=4, queue_depth_mean=2.0, queue_depth_upper=9.5, arrival_rate_mean=7.0,
                    arrival_rate_upper=8.25, capacity_rps=2.0, model_name="level")


def _ref(**metadata) -> object:
    return MESSAGES.ScaledObjectRef(name="demo-goodput", namespace="serving", scalerMetadata=metadata)


def test_wire_numbers_are_keda_s():
    # Field numbers and types of KEDA's published externalscaler.proto (kedacore/keda,
    # pkg/scalers/externalscaler): a renumbered field would be read as garbage by KEDA.
    expected = {
        "ScaledObjectRef": {"name": (1, "string"), "namespace": (2, "string"), "scalerMetadata": (3, "message")},
        "IsActiveResponse": {"result": (1, "bool")},
        "GetMetricSpecResponse": {"metricSpecs": (1, "message")},
        "MetricSpec": {"metricName": (1, "string"), "targetSize": (2, "int64"), "targetSizeFloat": (3, "double")},
        "GetMetricsRequest": {"scaledObjectRef": (1, "message"), "metricName": (2, "string")},
        "GetMetricsResponse": {"metricValues": (1, "message")},
        "MetricValue": {"metricName": (1, "string"), "metricValue": (2, "int64"), "metricValueFloat": (3, "double")},
    }
    from google.protobuf.descriptor import FieldDescriptor as F

    names = {F.TYPE_STRING: "string", F.TYPE_BOOL: "bool", F.TYPE_INT64: "int64", F.TYPE_DOUBLE: "double",
             F.TYPE_MESSAGE: "message"}
    seen = {m: {f.name: (f.number, names[f.type]) for f in getattr(MESSAGES, m).DESCRIPTOR.fields} for m in expected}
    assert seen == expected
    service = MESSAGES.DESCRIPTOR.services_by_name["ExternalScaler"]
    assert MESSAGES.DESCRIPTOR.package == "externalscaler"
    assert sorted(m.name for m in service.methods) == ["GetMetricSpec", "GetMetrics", "IsActive", "StreamIsActive"]
    # A MetricValue of 4 encodes as KEDA expects: field 1 (len) "m", field 2 varint 4, field 3 double 4.0.
    raw = MESSAGES.MetricValue(metricName="m", metricValue=4, metricValueFloat=4.0).SerializeToString()
    assert raw == b"\x0a\x01m" + b"\x10\x04" + b"\x19" + bytes.fromhex("0000000000001040")


@pytest.fixture
def scaler(tmp_path):
    state = ForecastState(horizon_seconds=120.0)
    cert, key = self_signed(tmp_path)
    server, port = start_grpc_server(state, "127.0.0.1", 0, str(cert), str(key), poll_seconds=0.05)
    creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    channel = grpc.secure_channel(f"localhost:{port}", creds)
    yield state, SERVICES.ExternalScalerStub(channel), port
    channel.close()
    server.stop(grace=None)


def test_every_call_before_and_after_the_first_decision(scaler):
    state, stub, _ = scaler
    with pytest.raises(grpc.RpcError) as err:
        stub.GetMetrics(MESSAGES.GetMetricsRequest(scaledObjectRef=_ref(), metricName="s0-goodput"), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "no forecast published yet" in err.value.details()
    spec = stub.GetMetricSpec(_ref(), timeout=5)
    assert [(s.metricName, s.targetSize, s.targetSizeFloat) for s in spec.metricSpecs] == [("goodput_desired_replicas", 1, 1.0)]

    stream = stub.StreamIsActive(_ref(), timeout=10)
    state.publish(DECISION, observed_replicas=2)
    assert next(stream).result is True  # the current answer, as soon as there is one
    # KEDA names the metric it asks for (its own "s0-..." name); the value is the decision.
    got = stub.GetMetrics(MESSAGES.GetMetricsRequest(scaledObjectRef=_ref(), metricName="s0-goodput"), timeout=5)
    assert [(v.metricName, v.metricValue, v.metricValueFloat) for v in got.metricValues] == [("s0-goodput", 4, 4.0)]
    assert stub.IsActive(_ref(), timeout=5).result is True
    upper = stub.GetMetrics(MESSAGES.GetMetricsRequest(scaledObjectRef=_ref(metric="goodput_forecast_queue_depth_upper",
                                                                            targetValue="5")), timeout=5)
    assert (upper.metricValues[0].metricValue, upper.metricValues[0].metricValueFloat) == (10, 9.5)  # ceil for the int form
    # An empty forecast queue is "inactive" for that metric: the stream says so when it changes.
    qstream = stub.StreamIsActive(_ref(metric="goodput_forecast_queue_depth_upper"), timeout=10)
    assert next(qstream).result is True
    state.publish(Decision(4, 0.0, 0.0, 7.0, 8.25, 2.0, "level"), observed_replicas=2)
    assert next(qstream).result is False
    stream.cancel()
    qstream.cancel()


def test_bad_trigger_metadata_is_refused_with_what_to_set(scaler):
    _, stub, _ = scaler
    for metadata, text in (({"metric": "goodput_queue"}, "use one of goodput_desired_replicas"),
                           ({"targetValue": "zero"}, "must be a number > 0")):
        with pytest.raises(grpc.RpcError) as err:
            stub.GetMetricSpec(_ref(**metadata), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and text in err.value.details()


def test_untrusted_client_cannot_connect(scaler):
    _, _, port = scaler
    other_ca = grpc.ssl_channel_credentials()  # the system roots: not the forecaster's CA
    with grpc.secure_channel(f"localhost:{port}", other_ca) as channel:
        with pytest.raises(grpc.RpcError) as err:
            SERVICES.ExternalScalerStub(channel).IsActive(_ref(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_live_forecaster_process_serves_the_external_scaler(start_server, tmp_path):
    from tests.dashboards.alert_stack import GrowingCounters

    sidecar = GrowingCounters({("interactive", "ok"): 6.0})  # 6 req/s at 2 req/s a replica: 3+ replicas
    metrics_port, grpc_port = free_port(), free_port()
    try:
        start_server(goodput_command("forecaster", "run", "--targets", sidecar.address, "--host", "127.0.0.1",
                                     "--metrics-port", str(metrics_port), "--api-port", "0", "--keda-grpc-port", str(grpc_port),
                                     "--self-signed", "--tls-dir", str(tmp_path / "tls"), "--step", "1", "--horizon", "5",
                                     "--capacity", "2", "--max-replicas", "8"),
                     f"http://127.0.0.1:{metrics_port}/metrics", timeout=60, name="forecaster")
        creds = grpc.ssl_channel_credentials(root_certificates=(tmp_path / "tls" / "cert.pem").read_bytes())
        with grpc.secure_channel(f"localhost:{grpc_port}", creds) as channel:
            stub = SERVICES.ExternalScalerStub(channel)
            request = MESSAGES.GetMetricsRequest(scaledObjectRef=_ref(), metricName="s0-goodput")
            deadline = time.monotonic() + 30
            while True:
                try:
                    value = stub.GetMetrics(request, timeout=5).metricValues[0].metricValue
                    if value >= 3:
                        break
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                assert time.monotonic() < deadline, "no decision >= 3 replicas within 30 s"
                time.sleep(0.5)
            for _ in range(5):  # read /metrics and gRPC within one 1-s step
                before = _desired(metrics_port)
                value = stub.GetMetrics(request, timeout=5).metricValues[0].metricValue
                if _desired(metrics_port) == before:
                    break
            assert value == before
    finally:
        sidecar.close()


def _desired(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "goodput_desired_replicas"]
    return family.samples[0].value
