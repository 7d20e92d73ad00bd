"""The sidecar as users run it: `goodput sidecar run` in its own process.

Drain on SIGTERM, refusal of a bad config, spans over OTLP/HTTP to an in-test receiver, and a
real Prometheus server scraping it.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import threading
import time
import urllib.parse

import httpx
import pytest

from sidecar.bench.otlp_sink import make_server
from tests.support import free_port, goodput_command

CHAT = "/v1/chat/completions"


def sidecar_cmd(upstream: str, port: int, *extra: str) -> list[str]:
    return goodput_command("sidecar", "run", "--upstream", upstream, "--port", str(port), "--models", "scripted",
                           *extra)


def test_invalid_config_refuses_to_start_naming_the_problem(tmp_path, upstream, port):
    bad = tmp_path / "slo.yaml"
    bad.write_text("classes:\n  - {name: interactive, ttft: -1, tpot: 0.05}\n")
    r = subprocess.run(sidecar_cmd(upstream, port, "--slo-config", str(bad)), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"goodput: error: invalid --slo-config: {bad}: classes[0]: SLO class 'interactive': "
        f"ttft must be a number of seconds > 0, got -1"]


@pytest.mark.parametrize("http_server", ["fast", "aiohttp"])
def test_drain_finishes_in_flight_streams_refuses_new_ones_and_exits_0(start_server, upstream, port, http_server):
    side = start_server(sidecar_cmd(upstream, port, "--drain-timeout", "10", "--http-server", http_server),
                        f"http://127.0.0.1:{port}/healthz", name="sidecar")
    url = f"http://127.0.0.1:{port}"
    body = {"model": "scripted", "messages": [{"role": "user", "content": "x"}], "max_tokens": 30, "stream": True,
            "script": {"ttft": 0, "itl": 0.05}}      # 30 tokens 50 ms apart: ~1.5 s in flight
    result: dict = {}
    first_token = threading.Event()

    def stream():
        with httpx.stream("POST", url + CHAT, json=body, timeout=30) as r:
            text = ""
            for chunk in r.iter_text():
                text += chunk
                if '"t0 "' in text:
                    first_token.set()
            result["text"] = text

    worker = threading.Thread(target=stream)
    worker.start()
    assert first_token.wait(10)
    side.signal(signal.SIGTERM)
    time.sleep(0.2)
    # Readiness fails at once; new requests are turned away with Retry-After; the gauge says so.
    assert httpx.get(url + "/readyz", timeout=5).status_code == 503
    refused = httpx.post(url + CHAT, json=body, timeout=5)
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
    assert refused.headers["Connection"] == "close"     # a keep-alive client goes to another replica
    assert refused.json()["error"]["type"] == "draining"
    assert "goodput_draining 1.0" in httpx.get(url + "/metrics", timeout=5).text
    worker.join(15)
    # The in-flight stream was served to the end...
    assert result["text"].count('"content":"t') == 30 and result["text"].endswith("data: [DONE]\n\n")
    # ...and then the process left on its own, with status 0.
    assert side.wait(15) == 0


def test_spans_reach_an_otlp_http_receiver_without_secrets(start_server, upstream, port):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    otlp_port = free_port()
    receiver, received = make_server(otlp_port, keep=True)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        side = start_server(sidecar_cmd(upstream, port, "--log-level", "debug"), f"http://127.0.0.1:{port}/healthz",
                            name="sidecar", env={"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{otlp_port}",
                                                 "OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_METRIC_EXPORT_INTERVAL": "100"})
        httpx.post(f"http://127.0.0.1:{port}{CHAT}", timeout=10, headers={"Authorization": "Bearer sk-otlp-secret"},
                   json={"model": "scripted", "messages": [{"role": "user", "content": "SECRET-PROMPT"}],
                         "max_tokens": 3, "stream": True, "script": {"ttft": 0.02, "itl": 0.01}})
        deadline = time.monotonic() + 10
        while not received.traces and time.monotonic() < deadline:
            time.sleep(0.05)
        assert received.traces, "no OTLP export arrived"
        req = ExportTraceServiceRequest()
        req.ParseFromString(received.traces[0])
        spans = [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
        assert [s.name for s in spans] == ["chat scripted"]
        attrs = {a.key: a.value for a in spans[0].attributes}
        assert attrs["goodput.outcome"].string_value == "good"
        assert attrs["gen_ai.usage.output_tokens"].int_value == 3
        assert 0.02 <= attrs["goodput.ttft_seconds"].double_value < 0.1
        assert spans[0].kind == 2    # SPAN_KIND_SERVER
        # The same endpoint gets the GenAI metrics too (sidecar/otel_metrics.py; values: test_otel_metrics).
        while not any(b"gen_ai.server.request.duration" in m for m in received.metrics) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(b"gen_ai.server.time_to_first_token" in m for m in received.metrics)
        raw = b"".join(received.traces + received.metrics)
        side.stop()
        for secret in (b"SECRET-PROMPT", b"sk-otlp-secret"):
            assert secret not in raw
            assert secret.decode() not in side.log()
    finally:
        receiver.shutdown()


@pytest.mark.prometheus
def test_prometheus_scrapes_the_goodput_the_test_produced(start_server, upstream, port, tmp_path):
    if shutil.which("prometheus") is None:
        pytest.skip("Debian's prometheus binary is not installed (apt-get install prometheus)")
    start_server(sidecar_cmd(upstream, port), f"http://127.0.0.1:{port}/healthz", name="sidecar")
    prom_port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: sidecar\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n")
    start_server(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
                  f"--web.listen-address=127.0.0.1:{prom_port}"], f"http://127.0.0.1:{prom_port}/-/ready",
                 name="prometheus", timeout=60)
    api = f"http://127.0.0.1:{prom_port}/api/v1/query"

    def query(expr: str, at: float | None = None) -> list:
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        return httpx.get(api + "?" + urllib.parse.urlencode(params), timeout=10).json()["data"]["result"]

    good = 'goodput_requests_total{outcome="good"}'
    # The zeroed series (--models scripted) is scraped before any request: the counter starts at 0.
    deadline = time.monotonic() + 30
    while not query(good) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert float(query(good)[0]["value"][1]) == 0.0
    n_good, n_error = 12, 3
    for i in range(n_good + n_error):
        script = {"ttft": 0, "itl": 0} if i < n_good else {"status": 500}
        httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=10,
                   json={"model": "scripted", "prompt": "x", "max_tokens": 2, "script": script})
    def total(expr: str) -> float:
        result = query(f"sum({expr})")
        return float(result[0]["value"][1]) if result else 0.0

    bad = 'goodput_requests_total{outcome="error"}'
    while (total(good) < n_good or total(bad) < n_error) and time.monotonic() < deadline + 10:
        time.sleep(0.3)
    last_sample = float(query(f"max(timestamp({good}))")[0]["value"][1])
    rate = float(query(f"sum(rate({good}[1m]))", at=last_sample)[0]["value"][1])
    # Evaluated at the last scrape, every sample of the series lies inside the minute: rate()
    # takes the increase from the first sample (0) to the last (n_good), does not extrapolate
    # towards the start (a counter that starts at 0 cannot have been lower), nor towards the end
    # (the window ends on the last sample), and divides by the 60 s window. So it must be
    # n_good / 60 up to float rounding; the 3 errors must not count.
    assert rate == pytest.approx(n_good / 60, rel=1e-9)
    assert total(bad) == n_error
