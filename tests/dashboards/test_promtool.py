"""The generated rules pass `promtool check rules` in both formats and their promtool unit tests.

The unit tests (tests/dashboards/promtool/*_test.yaml) load the committed rules file, so they test
exactly what `goodput rules generate` writes and the Helm chart ships.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dashboards import generate, rules
from tests.support import REPO_ROOT

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed: apt-get install prometheus (Debian), as .ci/run does")
CASES = Path(__file__).parent / "promtool"
RULES_DIR = generate.GENERATED / "rules"


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


@needs_promtool
def test_check_rules_prometheus_format():
    proc = promtool("check", "rules", str(RULES_DIR / generate.RULES_FILES["prometheus"]))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # 35 = 1 budget + 7 windows x (error, attainment, burn) + 1 queue sum + 12 alerts.
    assert "SUCCESS: 35 rules found" in proc.stdout


@needs_promtool
def test_check_rules_prometheus_operator_format(tmp_path):
    obj = yaml.safe_load((RULES_DIR / generate.RULES_FILES["prometheus-operator"]).read_text())
    assert obj["apiVersion"] == "monitoring.coreos.com/v1" and obj["kind"] == "PrometheusRule"
    extracted = tmp_path / "spec.yaml"
    extracted.write_text(yaml.safe_dump({"groups": obj["spec"]["groups"]}))
    proc = promtool("check", "rules", str(extracted))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 35 rules found" in proc.stdout


def test_both_formats_carry_the_same_groups():
    plain = yaml.safe_load((RULES_DIR / generate.RULES_FILES["prometheus"]).read_text())
    operator = yaml.safe_load((RULES_DIR / generate.RULES_FILES["prometheus-operator"]).read_text())
    assert plain["groups"] == operator["spec"]["groups"]


@needs_promtool
@pytest.mark.parametrize("case", sorted(p.name for p in CASES.glob("*_test.yaml")))
def test_promtool_unit_tests(case):
    proc = subprocess.run([PROMTOOL, "test", "rules", case], capture_output=True, text=True, cwd=CASES, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def _alert_cases() -> dict[str, dict[str, int]]:
    """alertname -> number of promtool cases expecting it to fire / to stay silent."""
    seen: dict[str, dict[str, int]] = {}
    for path in CASES.glob("*_test.yaml"):
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                counts = seen.setdefault(case["alertname"], {"firing": 0, "silent": 0})
                counts["firing" if case["exp_alerts"] else "silent"] += 1
    return seen


def test_every_alert_has_firing_and_silent_unit_tests():
    cases = _alert_cases()
    for alert in rules.alert_names(rules.build_groups()):
        assert cases.get(alert, {}).get("firing", 0) >= 1, f"{alert}: no promtool case where it fires"
        assert cases.get(alert, {}).get("silent", 0) >= 1, f"{alert}: no promtool case where it stays silent"


def test_burn_rate_tiers_each_have_a_case_of_their_own():
    # Each tier must be proven alone: the test names say which tier fires; the burn-rate values
    # used (20x for one hour after six clean ones, 8x, 4x, 2x) each meet exactly one tier.
    text = (CASES / "slo_burn_rate_test.yaml").read_text()
    for marker in ("pages through the first tier alone", "second page tier fires", "above 3 over 2h and 1d", "second ticket tier fires",
                   "does not page", "fires nothing"):
        assert marker in text


def test_every_alert_has_summary_description_runbook_and_readme_entry():
    readme = (REPO_ROOT / "README.md").read_text()
    headings = set(re.findall(r"^### Runbook: (\w+)$", readme, flags=re.M))
    for group in rules.build_groups():
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            ann = rule["annotations"]
            assert ann["summary"] and ann["description"]
            assert ann["runbook_url"] == f"README.md#runbook-{rule['alert'].lower()}"
            assert rule["alert"] in headings, f"README.md has no '### Runbook: {rule['alert']}' section"


@needs_promtool
def test_every_dashboard_query_is_valid_promql(tmp_path):
    # Without a live Prometheus: each panel query (variables expanded as Grafana's "All" does)
    # becomes a recording rule, which promtool parses. The live test runs them for real.
    import json

    from dashboards.preview import panel_queries

    records = [{"record": f"dashboard:query_{i}:check", "expr": q.expr}
               for i, q in enumerate(q for uid in generate.DASHBOARDS
                                     for q in panel_queries(json.loads((generate.GENERATED / f"{uid}.json").read_text())))]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": records}]}))
    proc = promtool("check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # 57 queries, plus 13 in the engine dashboard's "Where TTFT goes" row (ttft-advice issue), 21 in the
    # autoscaling dashboard's latency-forecast and service-model rows (23 with the batched curve's fixed
    # and concave parts), 14 for admission (shed by reason; predicted TTFT and TPOT, 4 each; their errors, 2 each),
    # 4 for the token mix, 4 for requests held for a decode slot (their rate; the time held p50/p90/p99),
    # 3 for arrival clumping (the dispersion planned on; the 0.1- and 1-s windows' from the sidecars' counters),
    # 2 for the router's pooling (the wait scale learned and planned on), 1 for the decode batch per request.
    assert f"SUCCESS: {len(records)} rules found" in proc.stdout and len(records) == 122
