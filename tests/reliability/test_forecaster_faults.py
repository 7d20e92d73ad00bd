"""The forecaster when its sources fail: unreachable, slow, garbage, NaN, counter resets.

Through every fault it keeps serving a finite desired replica count no lower than the last one it
published from good data (never 0 or NaN), says why in its log and in
goodput_forecaster_source_errors_total{reason}, and picks up again when the data comes back.
"""

from __future__ import annotations

import json
import logging
import math
import time

from prometheus_client import CollectorRegistry

from forecaster.policy import ForecastPolicy, PolicyConfig
from forecaster.runner import Runner
from forecaster.server import ForecastCollector, ForecastState
from forecaster.sources.prometheus import PrometheusSource
from forecaster.sources.scrape import ScrapeSource, static_targets
from tests.support import GetServer


class TextServer:
    """Answers every GET with `body` after `delay` seconds; tests change both as they go."""

    def __init__(self):
        self.body, self.status, self.delay = b"", 200, 0.0

        def answer(path: str) -> tuple[int, bytes]:
            time.sleep(self.delay)
            return self.status, self.respond(path)

        self._server = GetServer(answer)
        self.url = self._server.address

    def sidecar(self, arrived: float, in_flight: float = 2, waiting: float = 1, extra: str = "") -> None:
        self.body = (f'goodput_requests_arrived_total{{model="m",slo_class="d"}} {arrived}\n'
                     f'goodput_requests_total{{model="m",slo_class="d",outcome="good"}} {arrived}\n'
                     f'goodput_requests_in_flight{{model="m"}} {in_flight}\n'
                     f'goodput_engine_requests_waiting{{model="m"}} {waiting}\n'
                     f'goodput_engine_up 1\n{extra}').encode()

    def respond(self, path: str) -> bytes:
        return self.body

    def stop(self):
        self._server.close()


def errors(registry) -> dict[str, float]:
    return {s.labels["reason"]: s.value for f in registry.collect() for s in f.samples
            if s.name == "goodput_forecaster_source_errors_total"}


def make_runner(source, clock):
    policy = ForecastPolicy(PolicyConfig(capacity_rps=1.0, models=("naive",), min_replicas=1))
    state = ForecastState(180.0)
    registry = CollectorRegistry()
    registry.register(ForecastCollector(state))
    return Runner(source, policy, state, 15.0, clock=clock), state, registry, policy


def test_scrape_source_faults_hold_the_last_safe_decision(caplog):
    side = TextServer()
    t = iter(float(x) for x in range(0, 100_000, 15))
    source = ScrapeSource(static_targets([side.url]), timeout=0.5)
    runner, state, registry, policy = make_runner(source, lambda: next(t))
    arrived = 0
    for _ in range(6):                       # 4 req/s for six steps: 4 replicas at 1 req/s each
        arrived += 60
        side.sidecar(arrived)
        assert runner.step() is not None
    safe = state.get().decision.desired_replicas
    assert safe >= 4

    def held(reason: str) -> None:
        nonlocal arrived
        arrived += 60
        if b"Bad Gateway" not in side.body:
            side.sidecar(arrived, waiting=-7 if reason == "negative" else 1)
        safe = state.get().decision.desired_replicas
        before = errors(registry).get(reason, 0)
        with caplog.at_level(logging.WARNING, logger="goodput.forecaster"):
            assert runner.step() is None
        p = state.get()
        assert math.isfinite(p.decision.desired_replicas) and p.decision.desired_replicas == safe
        assert errors(registry)[reason] == before + 1, errors(registry)
        assert reason in caplog.text and f"keeping desired={safe}" in caplog.text
        caplog.clear()

    # Demand goes on at 4 req/s in every faulty answer, so a decision made from it would be right.
    side.body = b"<html>502 Bad Gateway</html>{{{"         # garbage
    held("no_sample")
    side.sidecar(arrived)
    held("negative")                                       # a negative gauge
    side.delay = 1.0                                       # slower than the 0.5 s scrape timeout
    held("no_sample")
    side.delay = 0.0
    arrived += 60
    side.sidecar(arrived, extra='goodput_requests_in_flight{model="x"} NaN\n')   # NaN is dropped at parsing
    assert runner.step() is not None and state.get().decision.desired_replicas >= 1
    side.stop()                                            # unreachable
    held("no_sample")

    side2 = TextServer()                                   # the sidecar restarts: counters from 0
    source2 = ScrapeSource(static_targets([side2.url]), timeout=0.5)
    runner.source = source2
    for arrived in (30, 90, 150, 210):
        side2.sidecar(arrived)
        decision = runner.step()
        assert decision is None or (math.isfinite(decision.desired_replicas) and decision.desired_replicas >= 1)
    assert state.get().decision.arrival_rate_mean > 0
    side2.stop()
    source.close()
    source2.close()
    policy.close()


class FakePrometheus(TextServer):
    """Answers every instant query with `value`, or `special[name]` for queries containing name."""

    value: str | None = "3"
    special: dict[str, str] = {}

    def answer(self, value: str | None, **special: str) -> None:
        self.body, self.value, self.special = None, value, special

    def respond(self, path: str) -> bytes:
        if self.body is not None:
            return self.body
        value = next((v for k, v in self.special.items() if k in path), self.value)
        return json.dumps({"status": "success", "data": {"resultType": "vector",
                                                         "result": [{"metric": {}, "value": [0, value]}]}}).encode()


def test_prometheus_source_faults_hold_the_last_safe_decision(caplog):
    prom = FakePrometheus()
    now = [1_000.0]

    def clock():
        now[0] += 15
        return now[0]

    source = PrometheusSource("http://" + prom.url, step_seconds=15.0)
    runner, state, registry, policy = make_runner(source, clock)
    prom.answer("3")                                   # every query answers 3: 3 req/s
    for _ in range(5):
        assert runner.step() is not None
    safe = state.get().decision.desired_replicas
    assert safe >= 3
    for body, reason in ((b"not json", "unreachable"),
                         (json.dumps({"status": "error", "errorType": "bad_data", "error": "x"}).encode(), "unreachable")):
        prom.body = body
        before = errors(registry).get(reason, 0)
        with caplog.at_level(logging.WARNING, logger="goodput.forecaster"):
            assert runner.step() is None
        assert errors(registry)[reason] == before + 1
        assert state.get().decision.desired_replicas == safe
        assert f"keeping desired={safe}" in caplog.text
    prom.answer("NaN")                                 # no data at all: nothing to forecast from
    assert runner.step() is None and errors(registry)["no_sample"] >= 1
    prom.answer("3", goodput_requests_in_flight="+Inf")
    assert runner.step() is None and errors(registry)["non_finite"] == 1
    prom.answer("3", goodput_engine_requests_waiting="-4")
    assert runner.step() is None and errors(registry)["negative"] == 1
    assert state.get().decision.desired_replicas == safe
    prom.stop()                                        # unreachable
    before = errors(registry)["unreachable"]
    assert runner.step() is None and errors(registry)["unreachable"] == before + 1
    assert state.get().decision.desired_replicas == safe
    source.close()
    policy.close()
