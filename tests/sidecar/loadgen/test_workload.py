"""Arrival processes: right rate and burstiness, checked statistically with fixed seeds."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from sidecar.loadgen.workload import gamma_arrivals, poisson_arrivals

N = 20_000


def test_poisson_rate_and_exponential_gaps():
    times = poisson_arrivals(rate=5.0, count=N, seed=1)
    gaps = np.diff(np.concatenate([[0.0], times]))
    # The mean of N exponential gaps has standard error (1/rate)/sqrt(N) = 0.2/141 = 0.0014 s;
    # four standard errors is a bound a correct generator fails about once in 16,000 seeds.
    assert abs(gaps.mean() - 0.2) < 4 * 0.2 / np.sqrt(N)
    # The gaps are exponential: a KS test against Exp(scale=0.2) must not reject at 1 %.
    assert stats.kstest(gaps, "expon", args=(0, 0.2)).pvalue > 0.01
    # CV of an exponential is exactly 1.
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.03


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_rate_and_cv(cv):
    times = gamma_arrivals(rate=10.0, cv=cv, count=N, seed=2)
    gaps = np.diff(np.concatenate([[0.0], times]))
    # Standard error of the mean gap is cv·(1/rate)/sqrt(N); allow four of them.
    assert abs(gaps.mean() - 0.1) < 4 * cv * 0.1 / np.sqrt(N)
    # The sample CV of N Gamma draws concentrates on the true CV; with N = 20,000 its spread is a
    # few per cent even for cv = 4 (heavy right tail), so 10 % relative error is a real check.
    assert abs(gaps.std() / gaps.mean() - cv) / cv < 0.10
    # And the shape is Gamma(k = 1/cv²): KS against the exact distribution. Not for cv = 4:
    # k = 1/16 puts ~16 % of gaps below 1e-12 s, under float64 resolution of arrival *times* near
    # 2,000 s, so differencing the times cannot recover them (the mean and CV above still hold).
    if cv > 2:
        return
    k = 1 / cv**2
    assert stats.kstest(gaps, "gamma", args=(k, 0, 1 / (10.0 * k))).pvalue > 0.01


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="rate"):
        poisson_arrivals(0, 10)
    with pytest.raises(ValueError, match="cv"):
        gamma_arrivals(1.0, 0.0, 10)


def test_class_mix_is_seeded_and_follows_the_weights():
    from sidecar.loadgen.workload import assign_classes, synthetic_workload

    reqs = synthetic_workload(poisson_arrivals(10, 4000, 0), 16, 4)
    mixed = assign_classes(reqs, {"high": 1, "low": 3}, seed=5)
    assert mixed == assign_classes(reqs, {"high": 1, "low": 3}, seed=5)     # the same for every endpoint
    assert [r.arrival for r in mixed] == [r.arrival for r in reqs]
    share = sum(r.slo_class == "high" for r in mixed) / len(mixed)
    assert abs(share - 0.25) < 0.03          # binomial sd at n=4000 is 0.007
    assert assign_classes(reqs, {}, seed=5) is reqs


def test_a_schedule_offers_exactly_the_rate_asked():
    from sidecar.loadgen.workload import at_exact_rate

    # Drawn as they come, 240 arrivals at 4 req/s from these seeds realise 3.51-4.64 req/s; rescaled,
    # each offers 4 (its requests over its last arrival, as the run's summary reports it).
    drawn = [240 / poisson_arrivals(4.0, 240, seed)[-1] for seed in range(40)]
    assert max(abs(r - 4.0) for r in drawn) > 0.3
    for seed in range(40):
        times = at_exact_rate(poisson_arrivals(4.0, 240, seed), 4.0)
        assert 240 / times[-1] == pytest.approx(4.0)
        assert np.all(np.diff(times) >= 0)
    # Still Poisson given the count: the arrivals before the last are uniform on the span.
    times = at_exact_rate(poisson_arrivals(5.0, N, seed=3), 5.0)
    assert stats.kstest(times[:-1] / times[-1], "uniform").pvalue > 0.01
    gaps = np.diff(np.concatenate([[0.0], times]))
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.03
    # Gamma gaps keep their burstiness.
    times = at_exact_rate(gamma_arrivals(10.0, 2.0, N, seed=2), 10.0)
    gaps = np.diff(np.concatenate([[0.0], times]))
    assert abs(gaps.std() / gaps.mean() - 2.0) / 2.0 < 0.10
    with pytest.raises(ValueError, match="rate"):
        at_exact_rate(times, 0.0)


def test_the_load_generator_offers_the_rate_asked():
    import argparse

    from sidecar.loadgen.cli import _common, build_workload

    p = argparse.ArgumentParser()
    _common(p)
    reqs, _, _ = build_workload(p.parse_args(["--seed", "4"]), rate=7.0, duration=60.0)
    assert len(reqs) == 420 and reqs[-1].arrival == pytest.approx(60.0)
