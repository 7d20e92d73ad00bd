"""The decode step against the batch each TPOT was measured at.

A replica's TPOT is its decode step at the batch the request decoded beside. The engines' running
gauge, read at a forecast step's two ends, is an instant's count: against the batch a step's
requests lived through it is noisy, and noise in x flattens a fitted slope (regression dilution).
The sidecars measure each request's mean batch (goodput_decode_batch_total); these tests hold the
learner to it."""

from __future__ import annotations

import numpy as np
import pytest

from forecaster.fleet_sample import StepObservation
from forecaster.service_learn import OnlineServiceModel
from forecaster.service_model import ServiceModel, Slo, TokenMix

BASE, PER_SEQ, OUTPUT = 0.04, 0.005, 32
SLO = Slo(ttft_s=3.0, tpot_s=0.1)
TRUTH = ServiceModel(prefill_tokens_per_s=20_000.0, decode_base_s=BASE, decode_per_seq_s=PER_SEQ,
                     kv_capacity_tokens=1e9, max_batch=256, step_token_budget=2048)


def _steps(seed: int, measured: bool, steps: int = 60):
    """2-s steps of a replica at light load: the requests ending in each decoded beside a mean
    batch x (1.2-3.2, themselves included) at TPOT = BASE + PER_SEQ·x (1 % noise); the running gauge
    at the step's ends is that batch less the request itself, give or take a Poisson count's swing."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        n = int(rng.integers(1, 5))
        x = float(rng.uniform(1.2, 3.2))
        tpot = (BASE + PER_SEQ * x) * (1.0 + 0.01 * rng.standard_normal())
        gauge = [float(rng.poisson(x - 1.0 + 0.5)) for _ in range(2)]
        yield StepObservation(
            dt=2.0, replicas=1, arrival_rps=n / 2.0, ended=float(n), input_tokens=2.0 * n,
            output_tokens=float(OUTPUT * n), ttft_sum=n * 1.5 * tpot, ttft_count=float(n),
            tpot_sum=n * tpot, tpot_count=float(n), running=sum(gauge) / 2.0, running_start=gauge[0],
            decode_batch_sum=n * x if measured else None, decode_batch_count=float(n) if measured else None)


def _learned(seed: int, measured: bool) -> OnlineServiceModel:
    learner = OnlineServiceModel()
    for o in _steps(seed, measured):
        learner.observe(o)
    return learner


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_step_is_fitted_against_the_batch_each_tpot_was_measured_at(seed):
    learner = _learned(seed, measured=True)
    fit = learner._decode_line().fit(learner.num_steps, floor_a=1e-4)
    # The step at the batches seen, and its slope, as the replica's (measured when written: 4.7-5.4 ms).
    for x in (1.5, 3.0):
        assert fit.a + fit.c * x + fit.d * np.log(x) == pytest.approx(BASE + PER_SEQ * x, rel=0.05)
    assert fit.c == pytest.approx(PER_SEQ, rel=0.15) and fit.d < 0.5e-3
    mix = TokenMix.from_means(2.0, float(OUTPUT))
    truth = TRUTH.slo_capacity_rps(mix, [SLO])
    assert learner.model().slo_capacity_rps(mix, [SLO]) == pytest.approx(truth, rel=0.15)
    # Against the gauges alone the same requests read a slope far flatter than the replica's
    # (0.8-1.9 ms), and capacity 2-3 times the replica's.
    gauge = _learned(seed, measured=False)
    flat = gauge._decode_line().fit(gauge.num_steps, floor_a=1e-4)
    assert flat.c < 0.5 * PER_SEQ, flat
    assert gauge.model().slo_capacity_rps(mix, [SLO]) > 1.5 * truth


def test_the_tpot_line_learns_on_a_first_step_read_from_iterations_too():
    # The live step test's first step: the engine's iterations were usable (the batch never
    # emptied), so only their line learned from it, and the TPOT line, which stands in until the
    # iterations have five points, stayed empty: the step was then unknown, the step's whole TTFT
    # (80 ms for 2 prompt tokens) read as prefill (25 tok/s against the engine's 20,000), and its
    # share taken from the next step's TPOT put that step 8 ms under the engine's at the highest
    # batch yet seen: a point that bent the fitted step concave for the rest of the run (capacity
    # 2.2-2.9 req/s against 1.875, in two runs of three).
    learner = OnlineServiceModel()

    def step(x: float, n: int, **engine) -> StepObservation:
        tpot = BASE + PER_SEQ * x
        return StepObservation(dt=2.0, replicas=1, arrival_rps=n / 2.0, ended=float(n), input_tokens=2.0 * n,
                               output_tokens=float(OUTPUT * n), ttft_sum=n * 1.6 * tpot, ttft_count=float(n),
                               tpot_sum=n * tpot, tpot_count=float(n), decode_batch_sum=n * x,
                               decode_batch_count=float(n), **engine)

    first_step = BASE + PER_SEQ * 2.5
    learner.observe(step(2.1, 2, running=3.0, running_start=3.0, engine_steps=2.0 / first_step,
                         generated_tokens=2.5 * 2.0 / first_step))
    assert learner.prefill_rate() > 150.0          # net of a known step (not the whole TTFT: 25)
    learner.observe(step(3.0, 4))
    x, y = learner._decode_tpot.points[-1][:2]
    assert (x, y) == pytest.approx((3.0, BASE + PER_SEQ * 3.0), rel=0.02)
