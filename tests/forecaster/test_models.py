"""The model zoo: common interface, exact baselines, intervals that cover."""

import numpy as np
import pytest

from forecaster.level import Level
from forecaster.models import MODELS, Naive, SeasonalNaive, make_model


def test_naive_and_seasonal_naive_are_exact():
    y = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    assert Naive().fit(y, 3).forecast(3).mean.tolist() == [8.0, 8.0, 8.0]
    # season 4: the values one season before steps 9, 10, 11 are y[4], y[5], y[6] = 5, 6, 7
    assert SeasonalNaive(season=4).fit(y, 3).forecast(3).mean.tolist() == [5.0, 6.0, 7.0]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_forecasts_with_ordered_bounds(name):
    rng = np.random.default_rng(0)
    y = 10 + rng.normal(0, 1, 200)
    fc = make_model(name, season=24).fit(y, 5).forecast(5)
    assert fc.mean.shape == fc.lower.shape == fc.upper.shape == (5,)
    assert np.all(fc.lower <= fc.mean) and np.all(fc.mean <= fc.upper)
    # a constant level of 10 with unit noise: every model's mean lands near 10
    assert np.all(np.abs(fc.mean - 10) < 2.5), fc.mean


def test_level_interval_covers_about_ninety_percent_of_noise():
    rng = np.random.default_rng(1)
    y = 5 + rng.normal(0, 1, 3000)
    fit = Level().fit(y[:2000], 4)
    fc = fit.forecast(4)
    # Empirical h-step errors of a near-constant level: the 90% band is about ±1.645σ.
    width = fc.upper[-1] - fc.lower[-1]
    assert 2 * 1.4 < width < 2 * 1.9, width


def test_level_uses_the_daily_profile_when_days_repeat():
    m = 24
    t = np.arange(m * 4)
    y = 100 + 50 * np.sin(2 * np.pi * t / m)
    fc = Level(season=m).fit(y, m).forecast(m)
    # Noise-free repeating days: the forecast of the next day follows the shape closely.
    truth = 100 + 50 * np.sin(2 * np.pi * np.arange(len(t), len(t) + m) / m)
    assert np.max(np.abs(fc.mean - truth)) < 10, np.round(fc.mean - truth, 1)


def test_unknown_model_name_says_what_to_choose():
    with pytest.raises(ValueError, match="choose one of"):
        make_model("prophet")


def test_holt_filter_matches_the_recursion():
    from forecaster.level import _holt

    rng = np.random.default_rng(2)
    d = 5 + np.cumsum(rng.normal(0, 1, 50))
    alpha, beta = 0.3, 0.2
    level, trend = _holt(d, alpha, beta)
    l, b = d[0], 0.0  # the steady state the filter starts in
    for t in range(1, len(d)):
        l_prev = l
        l = alpha * d[t] + (1 - alpha) * (l + b)
        b = beta * (l - l_prev) + (1 - beta) * b
    assert level[-1] == pytest.approx(l) and trend[-1] == pytest.approx(b)


def test_level_follows_a_ramp_with_its_trend_members():
    y = np.arange(200, dtype=float) * 0.5 + np.tile([0.3, -0.3], 100)
    fc = Level().fit(y, 12).forecast(12)
    # A ramp of 0.5 a step: 12 steps after y[199] ≈ 99.5 − 0.3 the truth is ≈ 105.5;
    # a level alone would say ≈ 99.5.
    assert abs(fc.mean[-1] - 105.5) < 1.5, fc.mean[-1]
