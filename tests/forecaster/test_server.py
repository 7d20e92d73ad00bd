"""The External Metrics API read by the official `kubernetes` client over HTTPS, and /metrics.

No Kubernetes API server runs here; the client talks to the forecaster directly, the way the
API server's aggregation layer forwards external.metrics.k8s.io requests to it.
"""

import json
import ssl
import urllib.request

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from forecaster.policy import Decision
from forecaster.server import (ExternalMetricsAPI, ForecastCollector, ForecastState, api_routes, metrics_routes,
                               quantity, start_server)
from forecaster.tls import self_signed, server_context
from tests.support import free_port

DECISION = Decision(desired_replicas=7, queue_depth_mean=12.5, queue_depth_upper=40.0, arrival_rate_mean=9.25,
                    arrival_rate_upper=11.0, capacity_rps=1.5, model_name="level", demand_estimate="recent")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    state = ForecastState(horizon_seconds=180.0)
    state.publish(DECISION, observed_replicas=5)
    cert, key = self_signed(tmp_path_factory.mktemp("tls"))
    api_port, metrics_port = free_port(), free_port()
    api = start_server(api_routes(ExternalMetricsAPI(state)), "127.0.0.1", api_port, server_context(cert, key))
    registry = CollectorRegistry()
    registry.register(ForecastCollector(state))
    metrics = start_server(metrics_routes(registry), "127.0.0.1", metrics_port)
    cfg = k8s.Configuration()
    cfg.host = f"https://127.0.0.1:{api_port}"
    cfg.ssl_ca_cert = str(cert)  # trust exactly the self-signed certificate: verification stays on
    api_client = k8s.ApiClient(cfg)
    yield api_client, metrics_port, cert, api_port
    api_client.close()
    api.shutdown()
    metrics.shutdown()


def test_kubernetes_client_reads_discovery_documents(servers):
    api_client, *_ = servers
    groups = k8s.ApisApi(api_client).get_api_versions()
    assert [g.name for g in groups.groups] == ["external.metrics.k8s.io"]
    assert groups.groups[0].preferred_version.group_version == "external.metrics.k8s.io/v1beta1"
    resources = k8s.CustomObjectsApi(api_client).get_api_resources("external.metrics.k8s.io", "v1beta1")
    assert resources.group_version == "external.metrics.k8s.io/v1beta1"
    assert sorted(r.name for r in resources.resources) == [
        "goodput_desired_replicas", "goodput_forecast_arrival_rate", "goodput_forecast_queue_depth"]
    raw = api_client.call_api("GET", f"{api_client.configuration.host}/apis/external.metrics.k8s.io")
    raw.read()
    assert json.loads(raw.data)["kind"] == "APIGroup"


def test_kubernetes_client_reads_desired_replicas(servers):
    api_client, *_ = servers
    got = k8s.CustomObjectsApi(api_client).list_namespaced_custom_object(
        "external.metrics.k8s.io", "v1beta1", "default", "goodput_desired_replicas")
    assert got["kind"] == "ExternalMetricValueList"
    [item] = got["items"]
    assert item["metricName"] == "goodput_desired_replicas" and item["value"] == "7"


def test_label_selector_picks_the_upper_bound(servers):
    api_client, *_ = servers
    got = k8s.CustomObjectsApi(api_client).list_namespaced_custom_object(
        "external.metrics.k8s.io", "v1beta1", "serving", "goodput_forecast_queue_depth",
        label_selector="horizon_seconds=180,bound=upper")
    assert [(i["metricLabels"], i["value"]) for i in got["items"]] == [
        ({"horizon_seconds": "180", "bound": "upper"}, "40")]
    got = k8s.CustomObjectsApi(api_client).list_namespaced_custom_object(
        "external.metrics.k8s.io", "v1beta1", "serving", "goodput_forecast_arrival_rate",
        label_selector="bound in (mean)")
    # 9.25 req/s as a Kubernetes quantity is 9250m
    assert [i["value"] for i in got["items"]] == ["9250m"]


def test_unknown_metric_is_a_404_status(servers):
    api_client, *_ = servers
    with pytest.raises(ApiException) as err:
        k8s.CustomObjectsApi(api_client).list_namespaced_custom_object(
            "external.metrics.k8s.io", "v1beta1", "default", "no_such_metric")
    assert err.value.status == 404
    body = json.loads(err.value.body)
    assert body["kind"] == "Status" and body["reason"] == "NotFound" and body["code"] == 404
    assert body["details"]["name"] == "no_such_metric"


def test_untrusted_client_is_refused(servers):
    *_, api_port = servers
    with pytest.raises(urllib.error.URLError) as err:
        urllib.request.urlopen(f"https://127.0.0.1:{api_port}/apis", context=ssl.create_default_context(), timeout=5)
    assert isinstance(err.value.reason, ssl.SSLCertVerificationError)


def test_metrics_endpoint_has_the_design_metrics(servers):
    _, metrics_port, *_ = servers
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert samples[("goodput_forecast_queue_depth", (("bound", "upper"), ("horizon_seconds", "180")))] == 40.0
    assert samples[("goodput_forecast_arrival_rate", (("bound", "mean"), ("horizon_seconds", "180")))] == 9.25
    assert samples[("goodput_desired_replicas", ())] == 7
    assert samples[("goodput_observed_replicas", ())] == 5
    assert samples[("goodput_replica_capacity_requests_per_second", ())] == 1.5
    assert samples[("goodput_forecast_model_info", (("model_name", "level"),))] == 1
    assert samples[("goodput_forecast_demand_estimate_info", (("estimate", "recent"),))] == 1


def test_quantity_and_bad_selector():
    assert quantity(3.0) == "3" and quantity(0.5) == "500m"
    code, body = ExternalMetricsAPI(ForecastState(180)).get(
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/x/goodput_desired_replicas", {"labelSelector": ["=>"]})
    assert code == 400 and body["reason"] == "BadRequest"
