"""The selector's pool: the switching rule's exact states, trend or no trend on synthetic traffic,
conformal coverage, and forecast_window's semantics."""

import numpy as np
import pytest

from forecaster.models import Fitted, Model
from forecaster.online import choose, conformal_quantile
from forecaster.pool import IS_TREND, NAMES, REFERENCE, backcast
from forecaster.selection import POOL, ModelSelector

TRENDS = {n for n, t in zip(NAMES, IS_TREND) if t}
STEP = 15.0


def poisson_rates(rate: np.ndarray, seed: int) -> np.ndarray:
    """Requests per second in 15-s steps, Poisson counts around `rate` (what a counter shows)."""
    return np.random.default_rng(seed).poisson(rate * STEP) / STEP


# -- the rule, state by state ------------------------------------------------------------------

def test_rule_keeps_the_current_model_without_a_clear_win():
    # ewma0.07 is 5 % better than the current ewma0.15: under the 10 % margin, no switch.
    scores = {"naive": 2.0, "ewma0.15": 1.0, "ewma0.07": 0.95}
    assert choose("ewma0.15", scores, 0.1, TRENDS, reference=REFERENCE) == "ewma0.15"
    # 15 % better: a clear win.
    scores["ewma0.07"] = 0.85
    assert choose("ewma0.15", scores, 0.1, TRENDS, reference=REFERENCE) == "ewma0.07"


def test_rule_drops_a_model_that_loses_to_naive_for_naive():
    # The current one is worse than naive; the best (ewma0.3) is only 5 % better than naive, so
    # naive (the guard it lost to) is kept, not the best.
    scores = {"naive": 1.0, "ewma0.15": 1.2, "ewma0.3": 0.95}
    assert choose("ewma0.15", scores, 0.1, TRENDS, reference=REFERENCE) == "naive"
    # With a best 20 % under naive, that best.
    scores["ewma0.3"] = 0.8
    assert choose("ewma0.15", scores, 0.1, TRENDS, reference=REFERENCE) == "ewma0.3"


def test_rule_drops_a_trend_that_loses_to_the_smoothed_level():
    trend = "trend0.4-0.1"
    scores = {"naive": 2.0, REFERENCE: 1.0, trend: 1.02}
    # A trendless model 2 % behind the reference would stay; a trend does not.
    assert choose(trend, scores, 0.1, TRENDS, reference=REFERENCE) == REFERENCE
    assert choose("ewma0.3", {**scores, "ewma0.3": 1.02}, 0.1, TRENDS, reference=REFERENCE) == "ewma0.3"


def test_rule_leaves_naive_only_for_a_margin():
    scores = {"naive": 1.0, REFERENCE: 0.93}
    assert choose("naive", scores, 0.1, TRENDS, reference=REFERENCE) == "naive"
    assert choose("naive", {**scores, REFERENCE: 0.89}, 0.1, TRENDS, reference=REFERENCE) == REFERENCE
    # No scores (history too short): nothing changes.
    assert choose("naive", {}, 0.1, TRENDS, reference=REFERENCE) == "naive"


def test_conformal_quantile_is_the_finite_sample_order_statistic():
    r = np.arange(1.0, 20.0)  # 19 residuals 1..19
    # ceil((19 + 1) * 0.9) = 18: the 18th smallest.
    assert conformal_quantile(r, 0.9) == 18.0
    # ceil(20 * 0.95) = 19: the largest; with fewer points the bound is capped at the largest.
    assert conformal_quantile(r, 0.95) == 19.0 and conformal_quantile(r[:5], 0.95) == 5.0


def test_backcast_members_use_only_the_past():
    y = np.random.default_rng(0).normal(10, 1, 300)
    full, prefix = backcast(y), backcast(y[:200])
    # What a member forecast at t = 199 does not change when later points arrive.
    assert np.allclose(full.predict(5)[:, 199], prefix.predict(5)[:, 199])


# -- the selector on synthetic traffic ------------------------------------------------------------

def test_slow_drift_with_noise_never_picks_a_trend():
    # The held-out conversation trace's shape: ~5.6 req/s drifting slowly (a 30 % rise and back
    # over hours), 15-s Poisson noise. A trend fitted to that noise over-extrapolates; the
    # selector must stay on levels at every step.
    n = 1200
    t = np.arange(n)
    y = poisson_rates(5.6 + 0.8 * np.sin(2 * np.pi * t / 1440) + 0.3 * np.sin(2 * np.pi * t / 333), seed=3)
    sel = ModelSelector([], steps=20)
    chosen = set()
    for end in range(300, n, 3):
        sel.forecast(y[:end], end)
        chosen |= set(sel.members)
    assert not chosen & TRENDS, sorted(chosen)
    assert chosen - {"naive"}, "the noise is worth smoothing: some level should win over naive"


def test_a_ramp_picks_a_trend():
    # 4 → 20 req/s over an hour (240 steps), then the ramp keeps going: a level lags it by
    # slope × lag, a damped trend follows it.
    t = np.arange(480)
    rate = 4.0 + 16.0 * t / 240.0
    y = poisson_rates(rate, seed=4)
    sel = ModelSelector([], steps=20)
    leads, errors, level_errors = [], [], []
    for end in range(260, 461, 5):
        fc = sel.forecast(y[:end], end)
        # A trend is in every forecast: each level lags the ramp more than either trend.
        assert set(sel.members) & TRENDS, (end, sel.members)
        level = backcast(y[:end]).levels[NAMES.index(REFERENCE), -1]
        leads.append(fc.mean[-1] - level)
        errors.append(abs(fc.mean[-1] - rate[end + 19]))
        level_errors.append(abs(level - rate[end + 19]))
    # 20 steps on, the forecast is above the smoothed level (the ramp goes on), and nearer the
    # rate there than the level is (one origin's noise can go either way; the run cannot).
    assert np.mean(leads) > 0.5 and np.mean(errors) < 0.6 * np.mean(level_errors), \
        (np.mean(leads), np.mean(errors), np.mean(level_errors))


@pytest.mark.parametrize("steps", [1, 5])
def test_conformal_intervals_cover_ninety_percent(steps):
    # Level shifts (a random walk, slowly) under Poisson noise: every horizon's 90 % interval
    # must hold 85–95 % of the actual values.
    rng = np.random.default_rng(5)
    n = 3000
    rate = np.maximum(1.0, 8.0 + np.cumsum(rng.normal(0, 0.03, n)))
    y = poisson_rates(rate, seed=6)
    sel = ModelSelector([], steps=steps)
    hits = np.zeros(steps)
    origins = range(800, n - steps, 4)
    for end in origins:
        fc = sel.forecast(y[:end], end)
        actual = y[end:end + steps]
        hits += (fc.lower <= actual) & (actual <= fc.upper)
    coverage = hits / len(origins)
    assert np.all((coverage >= 0.85) & (coverage <= 0.95)), coverage


def test_forecast_window_peak_quantile_holds_on_stationary_noise():
    y = poisson_rates(np.full(3000, 6.0), seed=7)
    sel = ModelSelector([], steps=12)
    under, means = 0, []
    origins = range(800, 3000 - 16, 8)
    for end in origins:
        w = sel.forecast_window(y[:end], end, start_step=5, end_step=16, quantile=0.9)
        assert w.start_step == 5 and w.end_step == 16 and w.num_calibration > 0
        under += float(np.max(y[end + 4:end + 16])) <= w.peak_upper
        means.append(w.mean)
        assert w.mean <= w.mean_upper <= w.peak_upper
    assert 0.85 <= under / len(origins) <= 0.95
    assert abs(np.mean(means) - 6.0) < 0.1


def test_forecast_window_on_a_constant_series_is_exact():
    sel = ModelSelector([], steps=4)
    w = sel.forecast_window(np.full(400, 3.0), 400, 1, 10)
    # Every member forecasts 3 and every residual is 0: mean, peak and their quantiles are 3.
    assert (w.mean, w.mean_upper, w.peak, w.peak_upper) == (3.0, 3.0, 3.0, 3.0)


def test_forecast_window_rejects_bad_arguments():
    sel = ModelSelector([], steps=4)
    with pytest.raises(ValueError, match="start_step"):
        sel.forecast_window(np.ones(50), 50, 3, 2)
    with pytest.raises(ValueError, match="quantile"):
        sel.forecast_window(np.ones(50), 50, 1, 2, quantile=1.5)
    with pytest.raises(ValueError, match="no history"):
        sel.forecast_window(np.array([]), 0, 1, 2)


class Sine(Model):
    """Knows the series (a sine of period 20): exact at every horizon, a fitted model that wins."""
    name = "sine"

    def fit(self, y, steps):
        t = len(y) + np.arange(steps)
        mean = 10 + 5 * np.sin(2 * np.pi * t / 20)
        return Fitted(self.name, mean, mean - 0.1, mean + 0.1)


class Seven(Model):
    name = "seven"

    def fit(self, y, steps):
        mean = np.full(steps, 7.0)
        return Fitted(self.name, mean, mean - 1, mean + 1)


def test_fitted_candidates_compete_with_the_pool_on_the_same_origins():
    y = 10 + 5 * np.sin(2 * np.pi * np.arange(400) / 20)
    sel = ModelSelector([Seven(), Sine()], steps=5, reselect_every=1)
    fc = sel.forecast(y, len(y))
    # The sine model is exact (score 0), so it beats the pool, scored on the same origins, by
    # any margin; the constant 7 is far off.
    assert sel.chosen == "sine" and sel.status.source == "fit"
    assert np.allclose(fc.mean, 10 + 5 * np.sin(2 * np.pi * np.arange(400, 405) / 20))
    scores = sel.fitted_scores(y)
    assert scores["sine"] == 0.0 and scores["seven"] > 0.5 and scores[POOL] > 0.0
    sel.close()


def test_the_average_holds_only_members_that_beat_naive():
    from forecaster.online import combination_weights, rolling_scores
    from forecaster.selection import WARM
    h, window = 4, 240
    ref = NAMES.index(REFERENCE)
    is_trend = np.array([n in TRENDS for n in NAMES])
    # Stationary noise: smoothing wins; every member given weight scored under naive, the
    # weights are halves (or one whole) and sum to 1 at every point.
    bc = backcast(poisson_rates(np.full(900, 6.0), seed=8))
    w = combination_weights(bc, h, window, WARM, is_trend, ref, 0.1)
    assert np.allclose(w.sum(axis=0), 1.0) and set(np.unique(w)) <= {0.0, 0.5, 1.0}
    pred = bc.predict(h)
    _, steady, valid = rolling_scores(np.abs(bc.y[None, h:] - pred[:, :bc.n - h]), h, window, WARM)
    for t in range(300, 900, 50):
        used = np.flatnonzero(w[:, t])
        assert len(used) == 2 and not is_trend[used].any(), (t, [NAMES[i] for i in used])
        assert all(i == 0 or steady[i, t] < steady[0, t] for i in used)
    # A constant series: every level ties naive, and naive alone forecasts (a tie is no win).
    flat = combination_weights(backcast(np.full(400, 5.0)), h, window, WARM, is_trend, ref, 0.1)
    assert np.all(flat[0] == 1.0) and np.all(flat[1:] == 0.0)
