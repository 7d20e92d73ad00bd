"""The loop: a sidecar going away keeps the last published decision."""

from forecaster.policy import ForecastPolicy, PolicyConfig
from forecaster.runner import Runner
from forecaster.server import ForecastState
from forecaster.sources.scrape import ScrapeSource, static_targets
from tests.forecaster.sidecar_metrics import FakeSidecarMetrics
from tests.support import free_port


def test_runner_publishes_and_keeps_the_last_decision_when_the_fleet_is_unreadable():
    side = FakeSidecarMetrics(free_port())
    clock = iter(float(t) for t in range(0, 1000, 15))
    source = ScrapeSource(static_targets([side.url]), timeout=2.0)
    policy = ForecastPolicy(PolicyConfig(capacity_rps=1.0, models=("naive",)))
    state = ForecastState(180.0)
    runner = Runner(source, policy, state, 15.0, clock=lambda: next(clock))
    for _ in range(5):
        side.serve(good=30)  # 30 requests per 15-s step = 2 req/s
        assert runner.step() is not None
    published = state.get()
    assert published.decision.arrival_rate_mean == 2.0 and published.observed_replicas == 1
    side.stop()
    assert runner.step() is None  # nothing answered: no sample, no new decision
    assert state.get() is published
    source.close()
    policy.close()
