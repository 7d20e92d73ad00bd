"""How the rendered pieces find each other: names, ports, labels, flags and certificates agree.

Container arguments are parsed with goodput's own command-line parser, so a flag the chart passes
that the sidecar, engine or forecaster does not have fails here, not in a cluster.
"""

from __future__ import annotations

import base64

import pytest
from cryptography import x509

from goodput_cli.main import build_parser
from tests.helm.chart import FORECASTER, FULLNAME, NAMESPACE, container, one, render


def _args(c: dict):
    assert c["command"] == ["goodput"]
    return build_parser().parse_args(c["args"])


def _serving(objects):
    return one(objects, "Deployment", FULLNAME)


def test_client_service_points_at_the_sidecar():
    objects = render()
    svc, dep = one(objects, "Service", FULLNAME), _serving(objects)
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert dep["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    sidecar_ports = {p["name"]: p["containerPort"] for p in container(dep, "sidecar")["ports"]}
    assert [p["targetPort"] for p in svc["spec"]["ports"]] == ["http"] and sidecar_ports == {"http": 8080}


def test_sidecar_flags_parse_and_reach_the_engine():
    dep = _serving(render())
    args = _args(container(dep, "sidecar"))
    engine_port = container(dep, "engine")["ports"][0]["containerPort"]
    assert (args.command, args.subcommand) == ("sidecar", "run")
    assert args.upstream == f"http://127.0.0.1:{engine_port}"
    assert (args.host, args.port, args.drain_timeout) == ("0.0.0.0", 8080, 30.0)
    assert str(args.slo_config) == "/etc/goodput/slo.yaml"
    engine = _args(container(dep, "engine"))
    assert (engine.command, engine.subcommand, engine.model, engine.port) == ("engine", "serve", "smollm2", engine_port)
    assert args.http_server == "fast"
    aiohttp = _args(container(_serving(render({"sidecar": {"httpServer": "aiohttp"}})), "sidecar"))
    assert aiohttp.http_server == "aiohttp"


def test_probes_and_drain_timing():
    dep = _serving(render())
    sidecar, engine = container(dep, "sidecar"), container(dep, "engine")
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert sidecar["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # Sidecar: 5 s for endpoint removal, then SIGTERM starts its 30 s drain. The engine must live
    # through both (35 s), and the kubelet must wait longer still: 5 + 30 + 10 = 45 s.
    assert sidecar["lifecycle"]["preStop"]["sleep"]["seconds"] == 5
    assert engine["lifecycle"]["preStop"]["sleep"]["seconds"] == 35
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 45


def test_pods_are_locked_down_and_resources_left_to_the_user():
    for dep in (o for o in render("autoscaling-builtin-values.yaml") if o["kind"] == "Deployment"):
        spec = dep["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert (sc["allowPrivilegeEscalation"], sc["readOnlyRootFilesystem"], sc["capabilities"]) == \
                (False, True, {"drop": ["ALL"]}), c["name"]
            assert c["resources"] == {}, c["name"]


def test_pdb_covers_the_serving_pods():
    objects = render()
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": _serving(objects)["spec"]["selector"]}


def test_forecaster_scrapes_the_serving_service_with_least_privilege():
    objects = render()
    dep = one(objects, "Deployment", FORECASTER)
    args = _args(container(dep, "forecaster"))
    assert (args.kube_service, args.kube_namespace, args.kube_port_name) == (FULLNAME, NAMESPACE, "http")
    assert one(objects, "Service", FULLNAME)["spec"]["ports"][0]["name"] == args.kube_port_name
    assert args.api_port == 0  # no External Metrics API unless autoscaling.mode is builtin
    role = one(objects, "Role")
    assert role["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["apps"], "resources": ["deployments/scale"], "resourceNames": [FULLNAME], "verbs": ["get"]},
    ]
    binding = one(objects, "RoleBinding")
    sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]
    assert one(objects, "ServiceAccount")["metadata"]["name"] == sa


def test_builtin_mode_apiservice_tls_and_hpa():
    objects = render("autoscaling-builtin-values.yaml")
    api = one(objects, "APIService")
    assert api["metadata"]["name"] == "v1beta1.external.metrics.k8s.io"
    assert api["spec"]["service"] == {"name": FORECASTER, "namespace": NAMESPACE, "port": 443}
    svc = one(objects, "Service", FORECASTER)
    https = next(p for p in svc["spec"]["ports"] if p["port"] == 443)
    dep = one(objects, "Deployment", FORECASTER)
    c = container(dep, "forecaster")
    args = _args(c)
    assert {p["name"]: p["containerPort"] for p in c["ports"]}[https["targetPort"]] == args.api_port == 8443
    # The certificate the forecaster serves is signed by the CA the APIService pins, for its DNS name.
    secret = one(objects, "Secret")
    assert secret["type"] == "kubernetes.io/tls"
    assert api["spec"]["caBundle"] == secret["data"]["ca.crt"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert f"{FORECASTER}.{NAMESPACE}.svc" in names
    volume = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert (args.tls_cert_file, args.tls_private_key_file) == ("/etc/goodput/tls/tls.crt", "/etc/goodput/tls/tls.key")
    assert args.tls_client_ca_file is None      # off by default: any client that completes TLS
    # The auth-delegator bindings name the forecaster's service account.
    sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
    delegator = one(objects, "ClusterRoleBinding", f"{FORECASTER}:system:auth-delegator")
    assert delegator["subjects"][0]["name"] == sa and delegator["roleRef"]["name"] == "system:auth-delegator"
    reader = one(objects, "RoleBinding", f"{FORECASTER}-auth-reader")
    assert reader["metadata"]["namespace"] == "kube-system"
    assert reader["roleRef"]["name"] == "extension-apiserver-authentication-reader"
    # HPA: the External metric with AverageValue 1 lands on desired replicas; up fast, down slowly.
    hpa = one(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": FULLNAME}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8) == (args.min_replicas, args.max_replicas)
    assert hpa["spec"]["metrics"] == [{"type": "External", "external": {
        "metric": {"name": "goodput_desired_replicas"}, "target": {"type": "AverageValue", "averageValue": "1"}}}]
    assert hpa["spec"]["behavior"]["scaleUp"]["stabilizationWindowSeconds"] == 0
    # One stabilisation: the forecaster holds scale-downs, the HPA follows it at once.
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 0
    # The HPA owns the replica count: the Deployment must not set one.
    assert "replicas" not in one(objects, "Deployment", FULLNAME)["spec"]


def test_builtin_mode_with_an_existing_secret():
    objects = render("autoscaling-builtin-secret-values.yaml")
    assert [o for o in objects if o["kind"] == "Secret"] == []
    assert one(objects, "APIService")["spec"]["caBundle"].startswith("LS0tLS1CRUdJTi")
    dep = one(objects, "Deployment", FORECASTER)
    volume = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
    assert volume["secret"]["secretName"] == "goodput-forecaster-tls"
    # With a client CA: the forecaster requires client certificates signed by the mounted bundle.
    c = container(dep, "forecaster")
    assert _args(c).tls_client_ca_file == "/etc/goodput/client-ca/client-ca.crt"
    ca = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "client-ca")
    assert ca["configMap"]["name"] == "front-proxy-client-ca"
    assert {"name": "client-ca", "mountPath": "/etc/goodput/client-ca", "readOnly": True} in c["volumeMounts"]


def test_keda_mode_scaled_object():
    objects = render("autoscaling-keda-values.yaml")
    assert [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"] == []  # KEDA makes it
    so = one(objects, "ScaledObject")
    assert so["spec"]["scaleTargetRef"]["name"] == FULLNAME
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (1, 6)
    (trigger,) = so["spec"]["triggers"]
    assert (trigger["type"], trigger["metricType"], trigger["metadata"]["threshold"]) == ("prometheus", "AverageValue", "1")
    assert trigger["metadata"]["query"] == f'max(goodput_desired_replicas{{namespace="{NAMESPACE}", pod=~"{FORECASTER}-.*"}})'
    assert so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 0


def _tls_pair(objects) -> tuple[x509.Certificate, x509.Certificate, dict]:
    secret = one(objects, "Secret")
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    return ca, cert, secret


def _san(cert: x509.Certificate) -> list[str]:
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)


def test_keda_metrics_api_reads_the_forecaster_over_verified_https():
    from urllib.parse import urlsplit

    from forecaster import keda

    objects = render("autoscaling-keda-metrics-api-values.yaml")
    assert [o for o in objects if o["kind"] in ("HorizontalPodAutoscaler", "APIService", "ServiceMonitor")] == []
    (trigger,) = one(objects, "ScaledObject")["spec"]["triggers"]
    assert (trigger["type"], trigger["metricType"]) == ("metrics-api", "AverageValue")
    meta = trigger["metadata"]
    # targetValue 1 with AverageValue: ceil(desiredReplicas / 1) is the decision; the path is the
    # one the forecaster serves it at.
    assert (meta["valueLocation"], meta["targetValue"], meta["format"], meta["authMode"]) == ("desiredReplicas", "1", "json", "tls")
    assert meta["valueLocation"] in keda.VALUE_LOCATIONS
    url = urlsplit(meta["url"])
    assert (url.scheme, url.path) == ("https", keda.PATH)
    # The URL's host is the forecaster Service, on a port that reaches the forecaster's --api-port,
    # and the certificate it serves names that host and is signed by the CA KEDA is given.
    svc = one(objects, "Service", FORECASTER)
    assert url.hostname == f"{FORECASTER}.{NAMESPACE}.svc"
    port = next(p for p in svc["spec"]["ports"] if p["port"] == url.port)
    dep = one(objects, "Deployment", FORECASTER)
    c = container(dep, "forecaster")
    args = _args(c)
    assert {p["name"]: p["containerPort"] for p in c["ports"]}[port["targetPort"]] == args.api_port == 8443
    _, cert, secret = _tls_pair(objects)
    assert url.hostname in _san(cert)
    auth = one(objects, "TriggerAuthentication", trigger["authenticationRef"]["name"])
    refs = {r["parameter"]: (r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]}
    name = secret["metadata"]["name"]
    assert refs == {"ca": (name, "ca.crt"), "cert": (name, "tls.crt"), "key": (name, "tls.key")}
    volume = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
    assert volume["secret"]["secretName"] == name and args.tls_cert_file == "/etc/goodput/tls/tls.crt"
    assert "prometheus" not in str(one(objects, "ScaledObject"))  # no Prometheus in the loop


def test_keda_external_calls_the_forecaster_grpc_scaler_over_tls():
    from forecaster.keda_grpc import METRICS

    objects = render("autoscaling-keda-external-values.yaml")
    (trigger,) = one(objects, "ScaledObject")["spec"]["triggers"]
    assert (trigger["type"], trigger["metricType"]) == ("external", "AverageValue")
    meta = trigger["metadata"]
    assert meta["metric"] in METRICS and meta["targetValue"] == "1"
    host, port = meta["scalerAddress"].rsplit(":", 1)
    assert host == f"{FORECASTER}.{NAMESPACE}.svc"
    svc = one(objects, "Service", FORECASTER)
    svc_port = next(p for p in svc["spec"]["ports"] if p["port"] == int(port))
    c = container(one(objects, "Deployment", FORECASTER), "forecaster")
    args = _args(c)
    assert {p["name"]: p["containerPort"] for p in c["ports"]}[svc_port["targetPort"]] == args.keda_grpc_port == 9443
    # gRPC with TLS (not --keda-grpc-plaintext), no HTTPS API, and a certificate for the scalerAddress host.
    assert args.api_port == 0 and not args.keda_grpc_plaintext and args.tls_cert_file == "/etc/goodput/tls/tls.crt"
    _, cert, secret = _tls_pair(objects)
    assert host in _san(cert)
    auth = one(objects, "TriggerAuthentication", trigger["authenticationRef"]["name"])
    assert auth["spec"]["secretTargetRef"] == [{"parameter": "caCert", "name": secret["metadata"]["name"], "key": "ca.crt"}]


def test_keda_direct_with_an_existing_secret():
    objects = render({"autoscaling": {"mode": "keda", "keda": {"trigger": "external", "existingSecret": "my-tls"}}})
    assert [o for o in objects if o["kind"] == "Secret"] == []
    dep = one(objects, "Deployment", FORECASTER)
    assert next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")["secret"]["secretName"] == "my-tls"
    assert one(objects, "TriggerAuthentication")["spec"]["secretTargetRef"][0]["name"] == "my-tls"


def test_prometheus_adapter_mode():
    objects = render("autoscaling-prometheus-adapter-values.yaml")
    hpa = one(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["metrics"][0]["external"]["metric"]["name"] == "goodput_desired_replicas"
    args = _args(container(one(objects, "Deployment", FORECASTER), "forecaster"))
    assert args.prometheus == "http://prometheus-operated.monitoring.svc:9090" and args.kube_service is None


@pytest.mark.parametrize("values", ["engine-vllm-values.yaml", "engine-sglang-values.yaml"])
def test_other_engines_keep_the_sidecar_in_front(values):
    dep = _serving(render(values))
    engine = container(dep, "engine")
    assert not engine["image"].startswith("ghcr.io/goodput/")
    assert _args(container(dep, "sidecar")).upstream == "http://127.0.0.1:8000"
    assert engine["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    mounts = {m["name"] for m in engine["volumeMounts"]}
    volumes = {v["name"] for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert mounts <= volumes
