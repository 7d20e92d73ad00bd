"""dashboards/contract.py agrees with what the real sidecar exposes on /metrics.

Labelled metrics appear in the exposition's `# TYPE` lines before their first sample, so no
request is needed; the goodput_engine_* gauges appear once the sidecar has scraped its engine, so
the real bundled engine (tiny model) runs behind it.
"""

from __future__ import annotations

import re
import time
import urllib.request

from dashboards import contract
from tests.support import free_port, goodput_command


def _types(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (goodput_\w+) (\w+)$", text, flags=re.M))


def test_sidecar_exposes_every_contract_metric_with_its_type(start_server, port):
    engine_port = free_port()
    start_server(goodput_command("engine", "serve", "--model", "tiny", "--port", str(engine_port)),
                 f"http://127.0.0.1:{engine_port}/health", timeout=120, name="engine")
    start_server(goodput_command("sidecar", "run", "--upstream", f"http://127.0.0.1:{engine_port}", "--port", str(port),
                                 "--engine-metrics-interval", "0.5"),
                 f"http://127.0.0.1:{port}/healthz", timeout=60, name="sidecar")
    expected = {m.name: m.type for m in contract.by_source("sidecar")}
    deadline = time.monotonic() + 20
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            exposed = _types(resp.read().decode())
        if set(expected) <= set(exposed) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert {name: exposed.get(name) for name in expected} == expected
    # Nothing goodput_* beyond the contract either: a new metric must be added there first.
    assert set(exposed) == set(expected)


def test_contract_lists_every_design_metric_once():
    # DESIGN.md's tables (19 sidecar, 6 forecaster), plus the slo-capacity issue's (arrived, tokens per request,
    # engine generation and steps; 13 forecaster: latency forecasts, the service model, cold start, live scores), the
    # ttft-advice issue's 12 sidecar metrics (5 engine series, 7 goodput_prompt_*), the reliability
    # issue's goodput_malformed_requests_total and goodput_forecaster_source_errors_total, and the
    # admission guard's goodput_admission_predicted_ttft_seconds and goodput_admission_ttft_error_seconds,
    # and its TPOT term's goodput_admission_predicted_tpot_seconds, goodput_admission_tpot_error_seconds
    # and goodput_admission_shed_total{reason}; the service model's batched-line base,
    # goodput_replica_decode_step_base_seconds, once the one-sequence step was learned apart, and
    # its concave part, goodput_replica_decode_step_log_seconds; and the guard's
    # goodput_admission_held_seconds (requests held for a decode slot); and how clumped arrivals
    # come, the sidecar's goodput_requests_arrived_squared_total{window_seconds} and the service
    # model's goodput_replica_arrival_dispersion; and its goodput_replica_wait_scale{state} (a
    # load-aware router's pooling); and the decode batch each TPOT was measured at,
    # goodput_decode_batch_total and goodput_decode_batch_requests_total.
    assert len(contract.by_source("sidecar")) == 46
    assert len(contract.by_source("forecaster")) == 25
    assert len(contract.METRICS) == 71


def test_contract_outcomes_are_the_sidecars():
    # The rules and panels match outcome label values by name: a new sidecar outcome (shed, from
    # the admission guard) must be in the contract, or the SLO error ratio would not count it.
    from sidecar.slo import OUTCOMES

    assert contract.OUTCOMES == OUTCOMES
    from sidecar.admission import SHED_REASONS
    assert contract.SHED_REASONS == SHED_REASONS
    assert set(contract.BAD_OUTCOMES.split("|")) == set(OUTCOMES) - {"good", "cancelled"}
