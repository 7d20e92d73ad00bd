"""The chart's example Alertmanager route, checked by amtool and run for real: Debian's
`prometheus` evaluates the generated rules against a sidecar stand-in and sends its alerts to
Debian's `prometheus-alertmanager`, configured with exactly the example's route and inhibit rules,
which notifies an in-test webhook receiver.

The stand-in's counters grow at exact rates, so every class's burn rate is known:
- "strict" and "realtime": every request violates its objective (burn 100x): page and ticket fire
  in Prometheus; the pages reach the pager, one notification per class; the tickets are inhibited.
- "batch": 4 % violate (burn 4x): above the ticket's 3x, under the page's 6x and 14.4x; its
  ticket reaches the ticket receiver.
- "interactive": nothing violates; nothing fires.
"""

from __future__ import annotations

import shutil
import subprocess
import time

import httpx
import pytest
import yaml

from dashboards import generate, rules
from dashboards.preview import Prometheus
from tests.dashboards import alert_stack, live_stack
from tests.support import free_port

PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
AMTOOL = shutil.which("amtool")
needs_amtool = pytest.mark.skipif(AMTOOL is None, reason="amtool not installed: apt-get install prometheus-alertmanager (Debian)")
PAGE, TICKET = "GoodputErrorBudgetBurnPage", "GoodputErrorBudgetBurnTicket"
RUNBOOK = {a: f"README.md#runbook-{a.lower()}" for a in (PAGE, TICKET)}


def amtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([AMTOOL, *args], capture_output=True, text=True, timeout=60)


@needs_amtool
def test_example_passes_amtool_and_routes_by_severity(tmp_path):
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(alert_stack.example_config()))
    proc = amtool("check-config", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout and "1 inhibit rules" in proc.stdout and "2 receivers" in proc.stdout
    # Every severity the generated alerts carry routes somewhere deliberate.
    severities = {r["labels"]["severity"] for g in rules.build_groups() for r in g["rules"] if "alert" in r}
    assert severities == {"page", "ticket", "warning"}
    expected = {"page": "goodput-page", "ticket": "goodput-ticket", "warning": "goodput-ticket"}
    for severity, receiver in expected.items():
        proc = amtool("config", "routes", "test", f"--config.file={path}", f"severity={severity}", "slo_class=interactive")
        assert proc.returncode == 0 and proc.stdout.strip() == receiver, (severity, proc.stdout, proc.stderr)


def test_example_inhibits_the_generated_ticket_with_the_generated_page():
    config = alert_stack.example_config()
    alerts = {r["alert"]: r for g in rules.build_groups() for r in g["rules"] if "alert" in r}
    (rule,) = config["inhibit_rules"]
    # The names in the example are the generated alerts' names, and both carry the label it matches on.
    assert rule["source_matchers"] == [f'alertname="{PAGE}"'] and rule["target_matchers"] == [f'alertname="{TICKET}"']
    assert rule["equal"] == ["slo_class"] and config["route"]["group_by"] == ["alertname", "slo_class"]
    assert (alerts[PAGE]["labels"]["severity"], alerts[TICKET]["labels"]["severity"]) == ("page", "ticket")


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.mark.prometheus
@pytest.mark.skipif(PROMETHEUS is None or ALERTMANAGER is None or AMTOOL is None,
                    reason="needs Debian's prometheus and prometheus-alertmanager (apt-get install prometheus prometheus-alertmanager)")
def test_pages_and_tickets_reach_their_receivers_grouped_by_class_with_the_ticket_inhibited(start_server, tmp_path):
    rates = {("strict", "slo_violated"): 10.0, ("realtime", "slo_violated"): 5.0,
             ("batch", "ok"): 9.6, ("batch", "slo_violated"): 0.4, ("interactive", "ok"): 5.0}
    sidecar, receiver = alert_stack.GrowingCounters(rates), alert_stack.WebhookReceiver()
    am_port, prom_port = free_port(), free_port()
    am_config = tmp_path / "alertmanager.yml"
    am_config.write_text(yaml.safe_dump(alert_stack.fast_config(receiver.url)))
    check = amtool("check-config", str(am_config))
    assert check.returncode == 0, check.stdout + check.stderr
    am_url = f"http://127.0.0.1:{am_port}"
    # --cluster.listen-address= turns gossip off: one Alertmanager, no port 9094 on the host.
    start_server([ALERTMANAGER, f"--config.file={am_config}", f"--storage.path={tmp_path / 'am'}",
                  f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
                 f"{am_url}/-/ready", timeout=60, name="alertmanager")
    prom_config = tmp_path / "prometheus.yml"
    prom_config.write_text(live_stack.prometheus_config({"goodput": sidecar.address},
                                                        str(generate.GENERATED / "rules" / generate.RULES_FILES["prometheus"]),
                                                        f"127.0.0.1:{am_port}"))
    start_server([PROMETHEUS, f"--config.file={prom_config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                  f"--web.listen-address=127.0.0.1:{prom_port}"],
                 f"http://127.0.0.1:{prom_port}/-/ready", timeout=60, name="prometheus")
    prom = Prometheus(f"http://127.0.0.1:{prom_port}")
    try:
        pages = _wait_for(lambda: len(receiver.notifications("goodput-page")) >= 2 and receiver.notifications("goodput-page"),
                          45, "a page notification for each of strict and realtime")
        tickets = _wait_for(lambda: receiver.notifications("goodput-ticket"), 15, "the batch ticket")
        # Prometheus fires both alerts for the 100x classes: the missing ticket is Alertmanager's doing.
        firing = {(s["metric"]["alertname"], s["metric"]["slo_class"])
                  for s in prom.query('ALERTS{alertstate="firing", alertname=~"GoodputErrorBudgetBurn.*"}')}
        assert firing == {(PAGE, "strict"), (PAGE, "realtime"), (TICKET, "strict"), (TICKET, "realtime"), (TICKET, "batch")}
        time.sleep(3)  # three more group intervals: an uninhibited ticket would have gone out by now
        pages, tickets = receiver.notifications("goodput-page"), receiver.notifications("goodput-ticket")

        # One notification per class (grouped by alertname and slo_class), each with the alert's
        # labels and its runbook.
        assert sorted(n["groupLabels"]["slo_class"] for n in pages) == ["realtime", "strict"]
        for n in pages + tickets:
            (alert,) = n["alerts"]
            assert n["status"] == "firing" and n["groupLabels"] == {"alertname": alert["labels"]["alertname"],
                                                                    "slo_class": alert["labels"]["slo_class"]}
            assert alert["annotations"]["runbook_url"] == RUNBOOK[alert["labels"]["alertname"]]
        assert {(a["labels"]["alertname"], a["labels"]["severity"]) for n in pages for a in n["alerts"]} == {(PAGE, "page")}
        assert [(a["labels"]["alertname"], a["labels"]["severity"], a["labels"]["slo_class"])
                for n in tickets for a in n["alerts"]] == [(TICKET, "ticket", "batch")]

        # Alertmanager holds the 100x classes' tickets as suppressed, inhibited by their own class's page.
        held = httpx.get(f"{am_url}/api/v2/alerts", timeout=10).json()
        by_key = {(a["labels"]["alertname"], a["labels"]["slo_class"]): a for a in held}
        for cls in ("strict", "realtime"):
            ticket = by_key[(TICKET, cls)]
            assert ticket["status"]["state"] == "suppressed"
            assert ticket["status"]["inhibitedBy"] == [by_key[(PAGE, cls)]["fingerprint"]]
        assert by_key[(TICKET, "batch")]["status"]["state"] == "active"
    finally:
        prom.close()
        sidecar.close()
        receiver.close()
