"""The chart renders for its defaults and every ci/ values file, lints clean, and every manifest is
valid: built-in kinds against the Kubernetes schemas, CRD objects by their documented structure."""

from __future__ import annotations

import shutil
import subprocess

import helm_python
import kubernetes_validate
import pytest
import yaml

from dashboards import generate
from tests.helm.chart import CHART, CI_VALUES, kinds, render, render_raw, values_of

# 1.30 is the chart's kubeVersion floor (preStop sleep actions); 1.35 a current release.
KUBE_VERSIONS = ["1.30.0", "1.35.0"]
CRDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): ["selector", "endpoints"],
    ("monitoring.coreos.com/v1", "PodMonitor"): ["selector", "podMetricsEndpoints"],
    ("monitoring.coreos.com/v1", "PrometheusRule"): ["groups"],
    ("keda.sh/v1alpha1", "ScaledObject"): ["scaleTargetRef", "triggers"],
    ("keda.sh/v1alpha1", "TriggerAuthentication"): ["secretTargetRef"],
}
VALUES = [None, *CI_VALUES]


@pytest.mark.parametrize("values", VALUES)
def test_every_manifest_is_valid(values):
    objects = render(values)
    assert objects
    for obj in objects:
        key = (obj["apiVersion"], obj["kind"])
        if key in CRDS:
            # Not in kubernetes-validate's schemas: check the fields the operators require.
            assert set(CRDS[key]) <= set(obj["spec"]), f"{obj['kind']} lacks {CRDS[key]}"
            if key[0] == "keda.sh/v1alpha1":
                _validate_keda(obj)
            continue
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


def _validate_keda(obj: dict) -> None:
    """Against KEDA's published CRD schemas, as the PyPI package cloudcoil-models-keda models them
    (pydantic, generated from KEDA's CRDs): types and required fields are checked, and a field the
    CRD does not define is dropped by the model, so a round trip that loses anything fails here."""
    from cloudcoil.models.keda import v1alpha1

    model = getattr(v1alpha1, obj["kind"]).model_validate(obj)
    assert model.model_dump(by_alias=True, exclude_none=True, mode="json") == obj, f"{obj['kind']}: fields KEDA's CRD lacks"


def test_keda_validation_catches_unknown_fields_and_bad_types():
    (so,) = [o for o in render("autoscaling-keda-metrics-api-values.yaml") if o["kind"] == "ScaledObject"]
    _validate_keda(so)
    typo = {**so, "spec": {**so["spec"], "pollingIntervall": 15}}
    with pytest.raises(AssertionError, match="fields KEDA's CRD lacks"):
        _validate_keda(typo)
    with pytest.raises(ValueError, match="pollingInterval"):
        _validate_keda({**so, "spec": {**so["spec"], "pollingInterval": "often"}})


@pytest.mark.parametrize("values", VALUES)
def test_lint_is_clean(values):
    # strict: warnings count as errors; info messages too would show up in `messages`.
    report = helm_python.lint(CHART, values_of(values), strict=True, kube_version="v1.30.0")
    assert report["errors"] == [] and report["messages"] == [], report


def test_default_render_has_serving_and_forecaster_only():
    # Optional features are off by default: no HPA, APIService, monitors, rules or dashboards.
    assert kinds(render()) == ["ConfigMap", "Deployment", "Deployment", "PodDisruptionBudget", "Role",
                               "RoleBinding", "Service", "Service", "ServiceAccount"]


@pytest.mark.parametrize("values, expected", [
    ("autoscaling-builtin-values.yaml", {"APIService", "HorizontalPodAutoscaler", "Secret", "ClusterRole", "ClusterRoleBinding"}),
    ("autoscaling-keda-values.yaml", {"ScaledObject", "ServiceMonitor"}),
    ("autoscaling-keda-metrics-api-values.yaml", {"ScaledObject", "TriggerAuthentication", "Secret"}),
    ("autoscaling-keda-external-values.yaml", {"ScaledObject", "TriggerAuthentication", "Secret"}),
    ("autoscaling-prometheus-adapter-values.yaml", {"HorizontalPodAutoscaler", "ServiceMonitor"}),
    ("monitoring-values.yaml", {"ServiceMonitor", "PrometheusRule"}),
    ("podmonitor-values.yaml", {"PodMonitor"}),
])
def test_each_feature_file_adds_its_objects(values, expected):
    added = set(kinds(render(values))) - set(kinds(render()))
    assert expected <= added, added


def test_schema_rejects_bad_values():
    chart = helm_python.Chart.load(CHART)
    with pytest.raises(helm_python.HelmValuesError, match="mode"):
        chart.validate_schema({"autoscaling": {"mode": "hpa"}})
    with pytest.raises(helm_python.HelmValuesError, match="objective"):
        chart.validate_schema({"slo": {"classes": [{"name": "x", "ttft": 1, "tpot": 0.1, "objective": 1.5}]}})
    with pytest.raises(helm_python.HelmValuesError, match="unknown|additional"):
        chart.validate_schema({"servng": {}})
    for bad in ({"admission": "on"}, {"priority": 0.5}, {"admission_margin": 1}, {"admission_hold": "no"}):
        with pytest.raises(helm_python.HelmValuesError, match=next(iter(bad))):
            chart.validate_schema({"slo": {"classes": [{"name": "x", "ttft": 1, "tpot": 0.1, **bad}]}})
    chart.validate_schema(values_of("slo-classes-values.yaml"))


def test_prometheus_source_without_url_fails_with_what_to_set():
    with pytest.raises(helm_python.HelmError, match="forecaster.prometheusUrl is required"):
        render_raw({"forecaster": {"source": "prometheus"}})


def test_chart_reads_the_generated_files_not_a_copy():
    # files/ is a link to dashboards/generated, so the chart always ships what the generators wrote.
    assert (CHART / "files").is_symlink()
    assert (CHART / "files").resolve() == generate.GENERATED


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed: apt-get install prometheus")
def test_rendered_prometheus_rule_passes_promtool(tmp_path):
    rule = next(o for o in render("monitoring-values.yaml") if o["kind"] == "PrometheusRule")
    path = tmp_path / "groups.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    proc = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 35 rules found" in proc.stdout


@pytest.mark.parametrize("values, next_step", [
    (None, "Turn on autoscaling.mode=builtin, keda or prometheus-adapter."),
    ("autoscaling-builtin-values.yaml", "kubectl get --raw /apis/external.metrics.k8s.io/v1beta1/namespaces/serving/goodput_desired_replicas"),
    ("autoscaling-keda-values.yaml", "kubectl -n serving get scaledobject demo-goodput"),
    ("autoscaling-keda-metrics-api-values.yaml", "KEDA reads the forecaster directly (metrics-api trigger over TLS"),
    ("autoscaling-prometheus-adapter-values.yaml", "Add the external rule from values.yaml (autoscaling.prometheusAdapter)"),
    ("monitoring-values.yaml", "ConfigMaps labelled grafana_dashboard=1"),
])
def test_notes_say_what_to_do_next(values, next_step):
    notes = render_raw(values_of(values))["goodput/templates/NOTES.txt"]
    assert "kubectl -n serving port-forward svc/demo-goodput 8080:80" in notes
    assert next_step in notes
