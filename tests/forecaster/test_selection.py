"""Bounded fits and every fallback path, run for real."""

import time

import numpy as np
import pytest

from forecaster.models import Fitted, Model, Naive
from forecaster.selection import BoundedFitter, FitTimeout, ModelSelector


class Raises(Model):
    name = "raises"

    def fit(self, y, steps):
        raise RuntimeError("broken model")


class Slow(Model):
    name = "slow"

    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def fit(self, y, steps):
        time.sleep(self.seconds)
        return Naive().fit(y, steps)


class Flaky(Model):
    """Fits (as a constant 7) until told to fail."""
    name = "flaky"

    def __init__(self):
        super().__init__()
        self.fail = False

    def fit(self, y, steps):
        if self.fail:
            raise RuntimeError("diverged")
        mean = np.full(steps, 7.0)
        return Fitted(self.name, mean, mean - 1, mean + 1)


Y = np.arange(1.0, 41.0)  # 40 points, last value 40


def test_bounded_fitter_times_out_and_refuses_while_busy():
    fitter = BoundedFitter(timeout=0.1)
    started = time.perf_counter()
    with pytest.raises(FitTimeout):
        fitter.fit(Slow(0.6), Y, 3)
    assert time.perf_counter() - started < 0.4  # we waited the deadline, not the fit
    with pytest.raises(Exception, match="still running"):
        fitter.fit(Naive(), Y, 3)
    time.sleep(0.7)  # the overrunning fit ends; the worker is free again
    assert fitter.fit(Naive(), Y, 3).forecast(3).mean.tolist() == [40.0] * 3
    fitter.close()


def test_no_last_good_fit_falls_back_to_naive():
    sel = ModelSelector([Raises()], steps=3, fit_timeout=1.0, min_points=5, pool=False)
    fc = sel.forecast(Y)
    assert fc.model_name == "naive(fallback)" and fc.mean.tolist() == [40.0] * 3
    assert sel.status.source == "naive" and "broken model" in sel.status.last_error


def test_failure_after_a_good_fit_uses_the_last_good_fit_shifted():
    flaky = Flaky()
    sel = ModelSelector([flaky], steps=3, fit_timeout=1.0, min_points=5, pool=False)
    assert sel.forecast(Y, end_index=100).mean.tolist() == [7.0] * 3
    flaky.fail = True
    fc = sel.forecast(Y, end_index=102)
    assert fc.model_name == "flaky(last_good)" and sel.status.source == "last_good"
    assert fc.mean.tolist() == [7.0] * 3
    # Past its stale limit (2 × horizon = 6 steps) the last good fit is too old: naive.
    fc = sel.forecast(Y, end_index=107)
    assert fc.model_name == "naive(fallback)"


def test_slow_fit_falls_back_within_the_deadline():
    flaky = Flaky()
    sel = ModelSelector([flaky], steps=3, fit_timeout=0.2, min_points=5, pool=False)
    sel.forecast(Y, end_index=50)
    sel.candidates = {"slow": Slow(0.8)}
    sel.chosen = "slow"
    started = time.perf_counter()
    fc = sel.forecast(Y, end_index=51)
    assert time.perf_counter() - started < 0.6
    assert fc.model_name == "flaky(last_good)" and "longer than" in sel.status.last_error
    time.sleep(0.8)
    sel.close()


def test_non_finite_forecast_counts_as_a_failure():
    class NaNModel(Model):
        name = "nan"

        def fit(self, y, steps):
            m = np.full(steps, np.nan)
            return Fitted(self.name, m, m, m)

    sel = ModelSelector([NaNModel()], steps=2, fit_timeout=1.0, min_points=5, pool=False)
    assert sel.forecast(Y).model_name == "naive(fallback)"


def test_selection_picks_the_candidate_with_lower_backtest_error():
    # A straight ramp: a constant forecaster lags it, naive is off by the slope per step only.
    class Constant(Flaky):
        name = "constant"

    sel = ModelSelector([Constant(), Naive()], steps=2, fit_timeout=1.0, min_points=5, pool=False)
    assert sel.select(Y) == "naive"


def test_background_selection_never_delays_a_forecast():
    class SlowToScore(Flaky):
        """Fits fast on the whole history, slowly on the selection's shorter histories."""
        name = "slow_to_score"

        def fit(self, y, steps):
            if len(y) < len(Y):
                time.sleep(0.3)
            return super().fit(y, steps)

    sel = ModelSelector([Naive(), SlowToScore()], steps=2, fit_timeout=1.0, min_points=5, num_origins=4,
                        background=True, pool=False)
    started = time.perf_counter()
    fc = sel.forecast(Y)
    # The selection (4 origins × 0.3 s for one candidate) runs in its thread; the forecast uses
    # the current choice (naive) at once.
    assert time.perf_counter() - started < 0.25
    assert fc.mean.tolist() == [40.0, 40.0]
    sel._selecting.result(timeout=5)
    assert sel.chosen == "naive"  # naive is exact-ish on a ramp; the constant 7 is far off
    sel.close()


def test_warming_up_plans_on_the_histories_mean_not_its_last_clump():
    """Fewer points than a model needs: the mean of the history, so a clump that landed in the
    last step does not become the forecast for the whole horizon."""
    y = np.array([1.0, 0.0, 0.5, 1.0, 0.0, 0.5, 1.0, 0.0, 6.5])        # a clump in the last step
    sel = ModelSelector([Naive()], steps=5, fit_timeout=1.0, min_points=20, pool=False)
    fc = sel.forecast(y)
    assert sel.status.source == "warm-up" and fc.model_name == "history_mean"
    assert fc.mean == pytest.approx(np.full(5, y.mean()))
    assert np.all(fc.upper >= fc.mean) and fc.upper[0] < Naive().fit(y, 5).forecast(5).mean[0]
