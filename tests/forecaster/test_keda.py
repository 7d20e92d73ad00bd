"""KEDA's metrics-api scaler contract on the forecaster's HTTPS port, read the way KEDA reads it.

KEDA (Go) cannot run here. What it does per poll is: GET the trigger's `url` over HTTPS, verifying
the server against the CA it was given; require a 200; take the number at `valueLocation`, a GJSON
path. The test does exactly that with httpx (CA verification on) and gjson-py, a GJSON
implementation, against a real `goodput forecaster run` process, and checks the number against
what the same forecaster publishes on /metrics at the same step.
"""

from __future__ import annotations

import ssl
import time

import gjson
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from forecaster import keda
from forecaster.policy import Decision
from forecaster.server import ExternalMetricsAPI, ForecastState, api_routes, start_server
from forecaster.tls import self_signed, server_context
from tests.support import free_port, goodput_command

DECISION = Decision(desired_replicas=7, queue_depth_mean=12.5, queue_depth_upper=40.0, arrival_rate_mean=9.25,
                    arrival_rate_upper=11.0, capacity_rps=1.5, model_name="level")


def _values(body: dict) -> dict[str, float]:
    return {path: gjson.get(body, path) for path in keda.VALUE_LOCATIONS}


def test_document_carries_the_decision_at_the_chart_value_locations():
    state = ForecastState(horizon_seconds=180.0)
    assert keda.scaler_document(state)[0] == 503  # nothing published: a failed read, not a 0
    state.publish(DECISION, observed_replicas=5)
    code, body = keda.scaler_document(state)
    assert code == 200
    assert _values(body) == {"desiredReplicas": 7, "forecast.queueDepth.upper": 40.0, "forecast.arrivalRate.upper": 11.0}
    assert (body["observedReplicas"], body["horizonSeconds"], body["model"]) == (5, 180.0, "level")


def test_https_with_ca_verification_and_503_before_the_first_step(tmp_path):
    state = ForecastState(horizon_seconds=60.0)
    cert, key = self_signed(tmp_path)
    port = free_port()
    server = start_server(api_routes(ExternalMetricsAPI(state)), "127.0.0.1", port, server_context(cert, key))
    url = f"https://127.0.0.1:{port}{keda.PATH}"
    try:
        with httpx.Client(verify=ssl.create_default_context(cafile=str(cert)), timeout=10) as client:
            early = client.get(url)
            assert early.status_code == 503 and "no forecast published yet" in early.json()["error"]
            state.publish(DECISION, observed_replicas=3)
            resp = client.get(url)
            assert resp.status_code == 200 and resp.headers["content-type"] == "application/json"
            assert gjson.get(resp.json(), "desiredReplicas") == 7
        # A client that does not trust the forecaster's CA is refused: verification is real.
        with httpx.Client(timeout=10) as untrusting, pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            untrusting.get(url)
    finally:
        server.shutdown()


def _desired_on_metrics(port: int) -> float | None:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        if family.name == "goodput_desired_replicas":
            return family.samples[0].value
    return None


def test_live_forecaster_serves_keda_what_it_publishes(start_server, tmp_path):
    """A real `goodput forecaster run` scraping a sidecar stand-in; KEDA's read equals /metrics."""
    from tests.dashboards.alert_stack import GrowingCounters

    # 6 req/s arriving at a fleet of one whose capacity is 2 req/s: the forecaster must ask for 3+.
    sidecar = GrowingCounters({("interactive", "ok"): 6.0})
    metrics_port, api_port = free_port(), free_port()
    try:
        start_server(goodput_command("forecaster", "run", "--targets", sidecar.address, "--host", "127.0.0.1",
                                     "--metrics-port", str(metrics_port), "--api-port", str(api_port), "--self-signed",
                                     "--tls-dir", str(tmp_path / "tls"), "--step", "1", "--horizon", "5",
                                     "--capacity", "2", "--max-replicas", "8"),
                     f"http://127.0.0.1:{metrics_port}/metrics", timeout=60, name="forecaster")
        url = f"https://127.0.0.1:{api_port}{keda.PATH}"
        with httpx.Client(verify=ssl.create_default_context(cafile=str(tmp_path / "tls" / "cert.pem")), timeout=10) as client:
            deadline = time.monotonic() + 30
            while True:
                resp = client.get(url)
                if resp.status_code == 200 and gjson.get(resp.json(), "desiredReplicas") >= 3:
                    break
                assert time.monotonic() < deadline, f"no decision >= 3 replicas within 30 s: {resp.status_code} {resp.text}"
                time.sleep(0.5)
            # One step is 1 s: read both within the same step (retry on a step boundary).
            for _ in range(5):
                before = _desired_on_metrics(metrics_port)
                body = client.get(url).json()
                if _desired_on_metrics(metrics_port) == before:
                    break
            assert gjson.get(body, "desiredReplicas") == before
            assert body["horizonSeconds"] == 5.0 and body["forecast"]["arrivalRate"]["mean"] > 4
    finally:
        sidecar.close()
