"""The model zoo: common interface, exact baselines, intervals that cover."""

import numpy as np
import pytest

from forecaster.models import MODELS, Level, Naive, SeasonalNaive, make_model


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


def test_level_uses_the_daily_profile_when_two_seasons_exist():
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
