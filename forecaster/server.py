"""What the forecaster publishes: Prometheus `/metrics` and the Kubernetes External Metrics API.

`ForecastState` owns the latest decision; the loop (forecaster/runner.py) writes it, the two
HTTP servers only read it. The External Metrics API answers what kube-apiserver's aggregation
layer forwards to an `APIService` for external.metrics.k8s.io/v1beta1: the discovery documents
and, per metric, an `ExternalMetricValueList` filtered by the request's label selector; an
unknown metric gets a 404 `Status` object like the API server's own.

The metrics port (plain HTTP, default 9090) and the API port (HTTPS, default 8443) are separate:
Prometheus scrapes the first without TLS, the API server's aggregation layer requires the second.
The API port also answers KEDA's metrics-api scaler at /keda/v1/scaler (forecaster/keda.py).
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from forecaster.policy import Decision
from forecaster.selectors import parse_selector

log = logging.getLogger("goodput.forecaster")

GROUP = "external.metrics.k8s.io"
VERSION = "v1beta1"
GROUP_VERSION = f"{GROUP}/{VERSION}"
EXTERNAL_METRICS = ("goodput_desired_replicas", "goodput_forecast_queue_depth", "goodput_forecast_arrival_rate")
# Why a step kept the last decision (forecaster/runner.py says what each means).
SOURCE_ERROR_REASONS = ("unreachable", "no_sample", "non_finite", "negative", "bad_decision")


@dataclass
class Published:
    decision: Decision
    observed_replicas: int
    horizon_seconds: float
    timestamp: datetime
    scores: dict | None = None   # forecaster.scoring.Score per quantity


class ForecastState:
    """The latest published decision (one writer: the loop; many readers: the servers)."""

    def __init__(self, horizon_seconds: float):
        self.horizon_seconds = horizon_seconds
        self._lock = threading.Lock()
        self._published: Published | None = None
        self.source_errors = {reason: 0 for reason in SOURCE_ERROR_REASONS}

    def note_source_error(self, reason: str) -> None:
        """A step that kept the last decision because its input was bad (forecaster/runner.py)."""
        with self._lock:
            self.source_errors[reason] = self.source_errors.get(reason, 0) + 1

    def publish(self, decision: Decision, observed_replicas: int, scores: dict | None = None) -> None:
        with self._lock:
            self._published = Published(decision, observed_replicas, self.horizon_seconds,
                                        datetime.now(timezone.utc), dict(scores) if scores else None)

    def get(self) -> Published | None:
        with self._lock:
            return self._published


def _horizon_label(seconds: float) -> str:
    return f"{seconds:g}"


class ForecastCollector:
    """prometheus_client collector reading ForecastState at scrape time."""

    def __init__(self, state: ForecastState):
        self.state = state

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        errors = CounterMetricFamily("goodput_forecaster_source_errors", "Steps that kept the last decision because "
                                     "their input was bad, by reason", labels=["reason"])
        for reason, count in sorted(self.state.source_errors.items()):
            errors.add_metric([reason], count)
        yield errors
        p = self.state.get()
        if p is None:
            return
        d, h = p.decision, _horizon_label(p.horizon_seconds)
        q = GaugeMetricFamily("goodput_forecast_queue_depth", "Predicted fleet queue depth (requests) at the horizon "
                              "with the current replicas", labels=["horizon_seconds", "bound"])
        q.add_metric([h, "mean"], d.queue_depth_mean)
        q.add_metric([h, "upper"], d.queue_depth_upper)
        yield q
        a = GaugeMetricFamily("goodput_forecast_arrival_rate", "Forecast arrival rate (requests/s) at the horizon",
                              labels=["horizon_seconds", "bound"])
        a.add_metric([h, "mean"], d.arrival_rate_mean)
        a.add_metric([h, "upper"], d.arrival_rate_upper)
        yield a
        yield GaugeMetricFamily("goodput_desired_replicas", "Replicas the forecaster asks for", value=d.desired_replicas)
        yield GaugeMetricFamily("goodput_observed_replicas", "Ready replicas observed", value=p.observed_replicas)
        yield GaugeMetricFamily("goodput_replica_capacity_requests_per_second",
                                "Per-replica capacity while SLOs hold (configured or learned)", value=d.capacity_rps)
        info = GaugeMetricFamily("goodput_forecast_model_info", "The model that made the current forecast",
                                 labels=["model_name"])
        info.add_metric([d.model_name], 1.0)
        yield info
        demand = GaugeMetricFamily("goodput_forecast_demand_estimate_info", "Which estimate gave the mean demand "
                                   "the replicas are planned on: the forecast or the last window observed",
                                   labels=["estimate"])
        demand.add_metric([d.demand_estimate], 1.0)
        yield demand
        yield from _latency_families(d, h)
        yield from _service_families(d)
        if p.scores:
            yield from _score_families(p.scores, h)


def _latency_families(d: Decision, h: str):
    from prometheus_client.core import GaugeMetricFamily

    for name, values, what in (("goodput_forecast_ttft_seconds", d.ttft_s, "TTFT"),
                               ("goodput_forecast_tpot_seconds", d.tpot_s, "TPOT")):
        g = GaugeMetricFamily(name, f"Predicted {what} at the horizon with the current replicas (service model): "
                              f"bound=mean is the mean at the demand's mean; bound=upper what the class's objective "
                              f"ratio of requests stay under at the demand's upper bound",
                              labels=["horizon_seconds", "bound", "slo_class"])
        for slo_class, (mean, upper) in sorted(values.items()):
            g.add_metric([h, "mean", slo_class], mean)
            g.add_metric([h, "upper", slo_class], upper)
        yield g


def _service_families(d: Decision):
    """The learned service model of one replica, each parameter with its 90 % band."""
    from prometheus_client.core import GaugeMetricFamily

    yield GaugeMetricFamily("goodput_replica_cold_start_seconds", "Replica cold start the decision assumes: learned "
                            "from EndpointSlices (not ready until ready) unless --cold-start sets it",
                            value=d.cold_start_s)
    src = GaugeMetricFamily("goodput_replica_capacity_info", "Where the per-replica capacity comes from "
                            "(configured, service-model, throughput, prior)", labels=["source"])
    src.add_metric([d.capacity_source], 1.0)
    yield src
    p = d.service
    if p is None:
        return
    m = p.model
    for name, doc, mean, band in (
            ("goodput_replica_decode_step_seconds", "Decode step time of one sequence alone (learned apart from "
             "the batched line a + c·b where low load shows it; a + c until then)", m.step_s(1.0), p.decode_single_s),
            ("goodput_replica_decode_step_base_seconds", "Decode step time's fixed part a of the batched curve "
             "a + c·b + d·ln(b) (two sequences and more)", m.decode_base_s, p.decode_base_s),
            ("goodput_replica_decode_step_log_seconds", "Decode step time's concave part d of the batched curve "
             "a + c·b + d·ln(b) (0 where the step is a line)", m.decode_log_s, p.decode_log_s),
            ("goodput_replica_decode_step_per_sequence_seconds", "Decode step time added by each sequence in the batch",
             m.decode_per_seq_s, p.decode_per_seq_s),
            ("goodput_replica_prefill_tokens_per_second", "Prefill throughput of one replica",
             m.prefill_tokens_per_s, p.prefill_tokens_per_s),
            ("goodput_replica_kv_capacity_tokens", "KV cache capacity of one replica, tokens", m.kv_capacity_tokens,
             p.kv_capacity_tokens),
            ("goodput_replica_ttft_overhead_seconds", "What every request's TTFT holds beyond queue and prefill "
             "(tokenisation, network, proxy)", m.ttft_overhead_s, p.ttft_overhead_s)):
        g = GaugeMetricFamily(name, doc + " (learned online; bound=lower/upper: 90 % band)", labels=["bound"])
        g.add_metric(["mean"], mean)
        g.add_metric(["lower"], band[0])
        g.add_metric(["upper"], band[1])
        yield g
    t = GaugeMetricFamily("goodput_replica_tokens_per_request", "Mean tokens per request in the recent mix",
                          labels=["kind"])
    t.add_metric(["prompt"], p.prompt_mean)
    t.add_metric(["output"], p.output_mean)
    yield t
    yield GaugeMetricFamily("goodput_replica_arrival_dispersion", "Index of dispersion (variance / mean) of the "
                            "requests one replica receives per second, from the sidecars' "
                            "goodput_requests_arrived_squared_total: 1 for Poisson arrivals, more where they come "
                            "in clumps (the service model queues them so; 1 until 50 arrivals are counted)",
                            value=p.arrival_dispersion)
    w = GaugeMetricFamily("goodput_replica_wait_scale", "How much less prompts wait than in one replica's own queue "
                          "(the engines' queue time over the model's, from steps with no burst in memory; at most 1, "
                          "below where a load-aware router pools the replicas; state=learned: its 90 % upper bound, "
                          "state=planned: what capacity is planned with now, 1 while a burst is in memory)",
                          labels=["state"])
    w.add_metric(["learned"], p.wait_scale)
    w.add_metric(["planned"], p.wait_scale_planned)
    yield w


def _score_families(scores: dict, h: str):
    """Each published forecast scored against what was observed one horizon later."""
    from prometheus_client.core import GaugeMetricFamily

    mae = GaugeMetricFamily("goodput_forecast_error_absolute", "Mean absolute error of the mean forecast one horizon "
                            "later (recent forecasts weighted most; units of the quantity)",
                            labels=["quantity", "horizon_seconds"])
    rel = GaugeMetricFamily("goodput_forecast_error_ratio", "Mean absolute error over the mean actual",
                            labels=["quantity", "horizon_seconds"])
    cov = GaugeMetricFamily("goodput_forecast_error_upper_coverage_ratio", "Share of actuals at or under the "
                            "published upper bound", labels=["quantity", "horizon_seconds"])
    for quantity, s in sorted(scores.items()):
        if not s.num_scored:
            continue
        mae.add_metric([quantity, h], s.mean_absolute_error)
        rel.add_metric([quantity, h], s.relative_error)
        cov.add_metric([quantity, h], s.upper_coverage)
    yield mae
    yield rel
    yield cov


def quantity(value: float) -> str:
    """A Kubernetes resource.Quantity string: integers plain, else milli-units ("1500m")."""
    if float(value).is_integer():
        return str(int(value))
    return f"{round(value * 1000)}m"


def _status(code: int, reason: str, message: str, name: str | None = None) -> dict:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
    if name is not None:
        body["details"] = {"name": name, "group": GROUP, "kind": name}
    return body


class ExternalMetricsAPI:
    """GET path + query → (status code, JSON body). No I/O, so tests can call it directly."""

    def __init__(self, state: ForecastState):
        self.state = state

    def discovery(self, path: str) -> dict | None:
        version = {"groupVersion": GROUP_VERSION, "version": VERSION}
        group = {"name": GROUP, "versions": [version], "preferredVersion": version}
        if path == "/apis":
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]}
        if path == f"/apis/{GROUP}":
            return {"kind": "APIGroup", "apiVersion": "v1", **group}
        if path == f"/apis/{GROUP_VERSION}":
            resources = [{"name": m, "singularName": "", "namespaced": True, "kind": "ExternalMetricValueList",
                          "verbs": ["get"]} for m in EXTERNAL_METRICS]
            return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GROUP_VERSION,
                    "resources": resources}
        return None

    def items(self, metric: str) -> list[tuple[dict, float]]:
        p = self.state.get()
        if p is None:
            return []
        d, h = p.decision, _horizon_label(p.horizon_seconds)
        if metric == "goodput_desired_replicas":
            return [({}, d.desired_replicas)]
        if metric == "goodput_forecast_queue_depth":
            return [({"horizon_seconds": h, "bound": "mean"}, d.queue_depth_mean),
                    ({"horizon_seconds": h, "bound": "upper"}, d.queue_depth_upper)]
        return [({"horizon_seconds": h, "bound": "mean"}, d.arrival_rate_mean),
                ({"horizon_seconds": h, "bound": "upper"}, d.arrival_rate_upper)]

    def get(self, path: str, query: dict[str, list[str]]) -> tuple[int, dict]:
        path = path.rstrip("/") or "/"
        doc = self.discovery(path)
        if doc is not None:
            return 200, doc
        prefix = f"/apis/{GROUP_VERSION}/namespaces/"
        parts = path[len(prefix):].split("/") if path.startswith(prefix) else []
        if len(parts) != 2 or not all(parts):
            return 404, _status(404, "NotFound", f"the server could not find the requested resource {path}")
        namespace, metric = parts
        if metric not in EXTERNAL_METRICS:
            return 404, _status(404, "NotFound", f"the server could not find the metric {metric} for namespace "
                                f"{namespace}; served: {', '.join(EXTERNAL_METRICS)}", name=metric)
        try:
            selector = parse_selector(query.get("labelSelector", [""])[0])
        except ValueError as exc:
            return 400, _status(400, "BadRequest", f"invalid labelSelector: {exc}")
        p = self.state.get()
        stamp = (p.timestamp if p else datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
        items = [{"metricName": metric, "metricLabels": labels, "timestamp": stamp, "value": quantity(value)}
                 for labels, value in self.items(metric) if selector(labels)]
        return 200, {"kind": "ExternalMetricValueList", "apiVersion": GROUP_VERSION, "metadata": {}, "items": items}


def _handler(routes):
    """A request handler class answering GETs through `routes(path, query) -> (code, type, bytes)`."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 10    # a client that stalls (mid-handshake or mid-request) is dropped, not waited for

        def setup(self):
            super().setup()
            if isinstance(self.request, ssl.SSLSocket):
                # The handshake runs here, in this connection's thread, not in the accept loop
                # (where one client that never finishes it would stop every other).
                self.request.do_handshake()

        def do_GET(self):  # noqa: N802 - http.server's naming
            url = urlsplit(self.path)
            code, ctype, body = routes(url.path, parse_qs(url.query))
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt, *args):  # quiet: one line per request would flood the log
            pass

    return Handler


def metrics_routes(registry):
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    def routes(path, query):
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(registry)
        if path in ("/healthz", "/readyz", "/livez"):
            return 200, "text/plain", b"ok"
        return 404, "text/plain", b"not found; try /metrics\n"

    return routes


def api_routes(api: ExternalMetricsAPI):
    from forecaster import keda

    def routes(path, query):
        if path in ("/healthz", "/readyz", "/livez"):
            return 200, "text/plain", b"ok"
        if path == keda.PATH:
            code, body = keda.scaler_document(api.state)
            return code, "application/json", json.dumps(body).encode()
        code, body = api.get(path, query)
        return code, "application/json", json.dumps(body).encode()

    return routes


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        # socketserver prints a traceback to stderr for every failed connection; a refused TLS
        # client (no or wrong certificate) or a dropped one is routine, and any client can cause
        # it: one line at DEBUG.
        import sys
        exc = sys.exc_info()[1]
        log.debug("API connection from %s ended: %s: %s", client_address[0], type(exc).__name__, str(exc)[:120])


def start_server(routes, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> ThreadingHTTPServer:
    """Starts a threaded HTTP(S) server in a daemon thread; call .shutdown() to stop it."""
    server = _Server((host, port), _handler(routes))
    server.daemon_threads = True
    if ssl_context is not None:
        server.socket = ssl_context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    threading.Thread(target=server.serve_forever, name=f"http-{port}", daemon=True).start()
    return server
