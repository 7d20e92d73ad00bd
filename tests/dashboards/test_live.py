"""Live: Debian's Prometheus scrapes a sidecar in front of the bundled engine under load and loads
the generated rules; every dashboard query and every rule expression evaluates and returns data.

How "returns data" is judged, and why:
- Dashboard queries run as range queries over the load window, with Grafana's variables expanded
  the way "All" does (dashboards/preview.py); each must return at least one series.
- Recording rules: the recorded series must exist (Prometheus evaluated the rule every second).
- Alerts: an alert that should stay silent returns nothing by design, so "returns data" is checked
  on its data part (thresholds taken out, live_stack.data_part): that proves every metric, label
  and recording rule it needs is there. The full alert expression must still evaluate without
  error. One alert must really fire: the "strict" class (1 ms TTFT objective, never met) burns its
  budget at 100x, so GoodputErrorBudgetBurnPage fires for it and not for "interactive".
- Where Debian's `prometheus-alertmanager` is installed, Prometheus sends its alerts to it, set up
  with the chart's example route (helm/goodput/docs/alertmanager.md, 1-s waits): the strict page
  reaches the in-test webhook receiver and the strict ticket (also firing) is inhibited by it.
  tests/dashboards/test_alertmanager.py tests the route in detail without the engine.
- kube-state-metrics cannot run without a Kubernetes API server; a static exposition of the two
  HPA series stands in for it (live_stack.KSM_TEXT). Forecaster queries are required only when
  `goodput forecaster run` is built.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from dashboards import contract, generate, rules
from dashboards.preview import Prometheus, panel_queries
from goodput_cli.main import build_parser
from tests.dashboards import alert_stack, live_stack
from tests.support import REPO_ROOT, free_port, goodput_command

PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
# Longer runs (for the README pictures) with GOODPUT_LIVE_LOAD_SECONDS=90.
LOAD_SECONDS = float(os.environ.get("GOODPUT_LIVE_LOAD_SECONDS", "20"))
RATE_INTERVAL = "10s"  # Grafana's $__rate_interval is ~4 scrape intervals; here the scrape is 1 s


def _forecaster_built() -> bool:
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    group = next(a for a in sub.choices["forecaster"]._actions if a.__class__.__name__ == "_SubParsersAction")
    return "[not built yet]" not in (group.choices["run"].description or "")


def _forecaster_command(sidecar: str, port: int) -> list[str]:
    # Scrapes the sidecar directly each second; no External Metrics API (that needs TLS and is
    # tested with the forecaster); a 10 s horizon so forecasts exist within the test.
    return goodput_command("forecaster", "run", "--targets", sidecar, "--host", "127.0.0.1", "--metrics-port", str(port),
                           "--api-port", "0", "--step", "1", "--horizon", "10", "--capacity", "5",
                           "--max-replicas", "4", "--scale-down-window", "10")


@pytest.mark.slow
@pytest.mark.prometheus
@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed: apt-get install prometheus (Debian), as .ci/run does")
def test_live_prometheus_evaluates_every_query_and_rule(start_server, tmp_path):
    engine_port, sidecar_port, prom_port = free_port(), free_port(), free_port()
    start_server(goodput_command("engine", "serve", "--model", "tiny", "--port", str(engine_port)),
                 f"http://127.0.0.1:{engine_port}/health", timeout=120, name="engine")
    slo_file = tmp_path / "slo.yaml"
    slo_file.write_text(yaml.safe_dump(live_stack.SLO_CONFIG))
    sidecar = f"127.0.0.1:{sidecar_port}"
    start_server(goodput_command("sidecar", "run", "--upstream", f"http://127.0.0.1:{engine_port}", "--port", str(sidecar_port),
                                 "--slo-config", str(slo_file), "--engine-metrics-interval", "1"),
                 f"http://{sidecar}/healthz", timeout=60, name="sidecar")
    targets = {"goodput": sidecar}
    with_forecaster = _forecaster_built()
    if with_forecaster:
        forecaster_port = free_port()
        start_server(_forecaster_command(sidecar, forecaster_port),
                     f"http://127.0.0.1:{forecaster_port}/metrics", timeout=60, name="forecaster")
        targets["forecaster"] = f"127.0.0.1:{forecaster_port}"
    ksm = live_stack.static_metrics(live_stack.KSM_TEXT)
    targets["kube-state-metrics"] = ksm.address
    receiver, alertmanager = alert_stack.WebhookReceiver(), None
    if ALERTMANAGER:
        am_port = free_port()
        am_config = tmp_path / "alertmanager.yml"
        am_config.write_text(yaml.safe_dump(alert_stack.fast_config(receiver.url)))
        start_server([ALERTMANAGER, f"--config.file={am_config}", f"--storage.path={tmp_path / 'am'}",
                      f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
                     f"http://127.0.0.1:{am_port}/-/ready", timeout=60, name="alertmanager")
        alertmanager = f"127.0.0.1:{am_port}"
    config = tmp_path / "prometheus.yml"
    config.write_text(live_stack.prometheus_config(targets, str(generate.GENERATED / "rules" / generate.RULES_FILES["prometheus"]),
                                                   alertmanager))
    start_server([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                  f"--web.listen-address=127.0.0.1:{prom_port}"],
                 f"http://127.0.0.1:{prom_port}/-/ready", timeout=60, name="prometheus")
    prom = Prometheus(f"http://127.0.0.1:{prom_port}")
    try:
        start = time.time()
        served = asyncio.run(live_stack.drive_load(f"http://{sidecar}", LOAD_SECONDS))
        assert served["interactive"] > 0 and served["strict"] > 0, served
        time.sleep(4)  # a few more scrapes and rule evaluations after the last request
        end = time.time()
        window = int(end - start) + 1

        if with_forecaster:
            # The forecaster's exposition matches the contract's forecaster metrics and types.
            with urllib.request.urlopen(f"http://{targets['forecaster']}/metrics", timeout=10) as resp:
                exposed = dict(re.findall(r"^# TYPE (goodput_\w+) (\w+)$", resp.read().decode(), flags=re.M))
            assert exposed == {m.name: m.type for m in contract.by_source("forecaster")}

        # Every dashboard panel query returns data over the load window.
        missing = []
        for uid in generate.DASHBOARDS:
            board = json.loads((generate.GENERATED / f"{uid}.json").read_text())
            for q in panel_queries(board, RATE_INTERVAL, window):
                if live_stack.uses_forecaster(q.expr) and not with_forecaster:
                    continue
                if not prom.query_range(q.expr, start, end, 1):
                    missing.append(f"{uid} / {q.panel}: {q.expr}")
        assert not missing, "dashboard queries without data:\n" + "\n".join(missing)

        # "Where TTFT goes" shows all three parts with real values: queue, prefill of the uncached
        # tokens, and the prefill the cached tokens skipped (the load repeats one prompt, so its
        # first 16-token blocks hit the bundled engine's prefix cache).
        engine_board = json.loads((generate.GENERATED / "goodput-engine.json").read_text())
        split = [q for q in panel_queries(engine_board, RATE_INTERVAL, window) if q.panel == "Where TTFT goes"]
        assert [q.legend.split("}} ")[1] for q in split] == ["queue", "prefill of uncached tokens",
                                                              "cached tokens skipped (est.)"]
        for q in split:
            values = [float(v) for s in prom.query_range(q.expr, start, end, 1) for _, v in s["values"]]
            assert any(v > 0 for v in values if v == v), f"{q.legend}: no positive value in {q.expr}"

        # Every rule: recordings exist; alert expressions evaluate; their data parts return data.
        for group in rules.build_groups():
            for rule in group["rules"]:
                if "record" in rule:
                    assert prom.query(rule["record"]), f"recording rule {rule['record']} has no series"
                    continue
                prom.query(rule["expr"])  # raises on a PromQL error
                if live_stack.uses_forecaster(rule["expr"]) and not with_forecaster:
                    continue
                assert prom.query(live_stack.data_part(rule["expr"])), f"{rule['alert']}: no data in {live_stack.data_part(rule['expr'])}"

        # The strict class burns 100x its budget: Prometheus itself fires the page for it alone.
        firing = prom.query('ALERTS{alertname="GoodputErrorBudgetBurnPage", alertstate="firing"}')
        assert [s["metric"]["slo_class"] for s in firing] == ["strict"]
        quiet = prom.query('ALERTS{alertname=~"GoodputEngineScrapeDown|GoodputDrainTooLong|GoodputNoTraffic"}')
        assert quiet == []

        if alertmanager:
            # The page went through Alertmanager to the pager receiver, for strict alone, with its
            # runbook; strict's ticket fires too (100x is above 3x) but is held back by the page.
            deadline = time.monotonic() + 20
            while not receiver.notifications("goodput-page") and time.monotonic() < deadline:
                time.sleep(0.25)
            (page,) = receiver.notifications("goodput-page")
            assert page["groupLabels"] == {"alertname": "GoodputErrorBudgetBurnPage", "slo_class": "strict"}
            assert page["alerts"][0]["annotations"]["runbook_url"] == "README.md#runbook-goodputerrorbudgetburnpage"
            held = {(a["labels"]["alertname"], a["labels"].get("slo_class")): a["status"]
                    for a in json.loads(urllib.request.urlopen(f"http://{alertmanager}/api/v2/alerts", timeout=10).read())}
            assert held[("GoodputErrorBudgetBurnTicket", "strict")]["state"] == "suppressed"
            assert not any(a["labels"].get("slo_class") == "strict" for n in receiver.notifications("goodput-ticket")
                           for a in n["alerts"])

        # The preview renders from the same Prometheus; GOODPUT_PREVIEW_OUT=docs/dashboards refreshes
        # the README's pictures.
        out = REPO_ROOT / os.environ["GOODPUT_PREVIEW_OUT"] if os.environ.get("GOODPUT_PREVIEW_OUT") else tmp_path / "png"
        proc = subprocess.run(goodput_command("dashboards", "preview", "--prometheus", prom.url, "--out", str(out),
                                              "--range", str(max(60, window)), "--rate-interval", RATE_INTERVAL),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        paths = [Path(line) for line in proc.stdout.split()]
        assert sorted(p.name for p in paths) == sorted(f"{uid}.png" for uid in generate.DASHBOARDS)
        assert all(p.stat().st_size > 20_000 for p in paths)  # a grid of drawn panels, not an empty figure
    finally:
        prom.close()
        ksm.close()
        receiver.close()
