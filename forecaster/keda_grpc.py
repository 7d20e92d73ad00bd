"""KEDA's external-scaler gRPC service, answered from the forecaster's published decision.

KEDA (type: external) calls GetMetricSpec once per ScaledObject for the HPA target, then
GetMetrics every pollingInterval, and IsActive (or keeps a StreamIsActive open) to decide between
zero and minReplicaCount. The trigger's metadata reaches every call as `scalerMetadata`:
- `metric`: which number to report, one of METRICS (default goodput_desired_replicas);
- `targetValue`: the per-replica target (default 1). With the default pair, KEDA's HPA
  (AverageValue) lands on ceil(desired / 1) = the forecaster's decision, as in every other mode.

The service only reads ForecastState (one writer: the loop). Before the first decision every call
fails with UNAVAILABLE, which KEDA treats as a scaler error (the HPA holds, or `fallback` applies);
a 0 would instead tell it to scale down. The interface is forecaster/externalscaler.proto, compiled
at start by grpcio-tools (no generated code to keep in step with the grpcio version).
"""

from __future__ import annotations

import math
import threading
from concurrent import futures

import grpc

from forecaster.server import ForecastState, Published

PROTO = "forecaster/externalscaler.proto"
METRICS = {
    "goodput_desired_replicas": lambda p: float(p.decision.desired_replicas),
    "goodput_forecast_queue_depth_upper": lambda p: p.decision.queue_depth_upper,
    "goodput_forecast_arrival_rate_upper": lambda p: p.decision.arrival_rate_upper,
}
DEFAULT_METRIC = "goodput_desired_replicas"
_lock = threading.Lock()
_compiled: tuple | None = None


def load_proto() -> tuple:
    """(messages module, services module) of externalscaler.proto, compiled once per process."""
    global _compiled
    with _lock:
        if _compiled is None:
            _compiled = grpc.protos_and_services(PROTO)
        return _compiled


def _choice(metadata, context) -> tuple[str, float]:
    metric = metadata.get("metric", DEFAULT_METRIC) or DEFAULT_METRIC
    if metric not in METRICS:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                      f"trigger metadata metric={metric!r} is not served; use one of {', '.join(sorted(METRICS))}")
    try:
        target = float(metadata.get("targetValue", "1"))
        if not target > 0 or math.isinf(target):
            raise ValueError
    except ValueError:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                      f"trigger metadata targetValue={metadata.get('targetValue')!r} must be a number > 0 (default 1)")
    return metric, target


def _published(state: ForecastState, context) -> Published:
    p = state.get()
    if p is None:
        context.abort(grpc.StatusCode.UNAVAILABLE, "no forecast published yet: the forecaster has not completed a "
                                                   "step; KEDA keeps the current replicas until it has")
    return p


def make_servicer(state: ForecastState, poll_seconds: float = 1.0):
    messages, services = load_proto()

    class ExternalScaler(services.ExternalScalerServicer):
        def GetMetricSpec(self, request, context):  # noqa: N802 - gRPC's method names
            metric, target = _choice(request.scalerMetadata, context)
            return messages.GetMetricSpecResponse(metricSpecs=[messages.MetricSpec(
                metricName=metric, targetSize=math.ceil(target), targetSizeFloat=target)])

        def GetMetrics(self, request, context):  # noqa: N802
            metric, _ = _choice(request.scaledObjectRef.scalerMetadata, context)
            value = METRICS[metric](_published(state, context))
            return messages.GetMetricsResponse(metricValues=[messages.MetricValue(
                metricName=request.metricName or metric, metricValue=math.ceil(value), metricValueFloat=value)])

        def IsActive(self, request, context):  # noqa: N802
            metric, _ = _choice(request.scalerMetadata, context)
            return messages.IsActiveResponse(result=METRICS[metric](_published(state, context)) > 0)

        def StreamIsActive(self, request, context):  # noqa: N802
            # The current answer at once, then each change, until KEDA closes the stream.
            metric, _ = _choice(request.scalerMetadata, context)
            last = None
            stop = threading.Event()
            context.add_callback(stop.set)
            while context.is_active() and not stop.is_set():
                p = state.get()
                if p is not None:
                    active = METRICS[metric](p) > 0
                    if active != last:
                        last = active
                        yield messages.IsActiveResponse(result=active)
                stop.wait(poll_seconds)

    return ExternalScaler()


def start_grpc_server(state: ForecastState, host: str, port: int, cert_file: str | None = None,
                      key_file: str | None = None, poll_seconds: float = 1.0) -> tuple[grpc.Server, int]:
    """Serves the external scaler (TLS when a certificate is given); returns (server, bound port)."""
    _, services = load_proto()
    # Each open StreamIsActive holds a worker; KEDA keeps one per ScaledObject.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="keda-grpc"))
    services.add_ExternalScalerServicer_to_server(make_servicer(state, poll_seconds), server)
    address = f"{host}:{port}"
    if cert_file and key_file:
        with open(key_file, "rb") as k, open(cert_file, "rb") as c:
            creds = grpc.ssl_server_credentials([(k.read(), c.read())])
        bound = server.add_secure_port(address, creds)
    else:
        bound = server.add_insecure_port(address)
    if bound == 0:
        raise ValueError(f"cannot listen on {address} for the KEDA external scaler; pick another --keda-grpc-port")
    server.start()
    return server, bound
