"""The model zoo: one interface, `Model.fit(y, horizon) -> Fitted`, `Fitted.forecast(steps) -> Forecast`.

Every model forecasts steps 1..`steps` ahead with a central prediction interval (default 90 %).
Where a model has no interval of its own, the interval comes from its own h-step errors on the
history (empirical quantiles: they need no distributional assumption and are cheap).

- `naive`: the last value (the reactive signal, and the fallback of last resort);
- `seasonal_naive`: the value one season ago;
- `level`: ours (forecaster/level.py) — exponentially weighted levels, rolling medians and
  Holt trends, the one with the lowest h-step error on the history picked per horizon, times a
  daily profile when two seasons of history exist. numpy/scipy only, milliseconds on a day at 15 s;
- `holt_winters`: statsmodels ExponentialSmoothing, additive trend, additive season when two
  seasons of history exist (as the predictive-horizontal-pod-autoscaler's Holt-Winters);
- `arima`: statsmodels ARIMA, the order picked by AIC among a few (as NVIDIA Dynamo's planner
  does with auto_arima);
- `linear`: a least-squares line over the last points (the predictive-horizontal-pod-autoscaler's
  linear regression).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import math

import numpy as np


@dataclass
class Forecast:
    mean: np.ndarray   # steps 1..h ahead
    lower: np.ndarray
    upper: np.ndarray
    model_name: str


def _quantiles(errors: np.ndarray, interval: float) -> tuple[float, float]:
    errors = errors[np.isfinite(errors)]
    if len(errors) < 5:
        return float("nan"), float("nan")
    tail = (1.0 - interval) / 2.0
    return float(np.quantile(errors, tail)), float(np.quantile(errors, 1.0 - tail))


def _empirical_bounds(y: np.ndarray, predict_at, steps: int, interval: float, max_points: int = 2000):
    """Lower/upper offsets per horizon from the h-step errors of `predict_at(t, h)` on the history.

    Falls back to the spread of the h-step changes scaled from the one-step ones when the history
    is too short to have errors at horizon h.
    """
    lo, hi = np.zeros(steps), np.zeros(steps)
    n = len(y)
    start = max(0, n - max_points)
    diffs = np.diff(y)
    sd1 = float(np.std(diffs)) if len(diffs) > 1 else 0.0
    for h in range(1, steps + 1):
        t = np.arange(start, n - h)
        errs = y[t + h] - predict_at(t, h) if len(t) else np.array([])
        q_lo, q_hi = _quantiles(errs, interval)
        if not np.isfinite(q_lo):
            q_lo, q_hi = -1.645 * sd1 * np.sqrt(h), 1.645 * sd1 * np.sqrt(h)
        lo[h - 1], hi[h - 1] = q_lo, q_hi
    return lo, hi


class Fitted:
    def __init__(self, name: str, mean: np.ndarray, lower: np.ndarray, upper: np.ndarray):
        self.name, self._mean, self._lower, self._upper = name, mean, lower, upper

    def forecast(self, steps: int) -> Forecast:
        if steps > len(self._mean):
            raise ValueError(f"model {self.name} was fitted for {len(self._mean)} steps, asked for {steps}")
        mean = np.maximum(self._mean[:steps], 0.0)  # demand is never negative
        lower = np.clip(self._lower[:steps], 0.0, mean)
        upper = np.maximum(self._upper[:steps], mean)
        return Forecast(mean, lower, upper, self.name)


class Model:
    """Base: `fit(y, steps)` returns a Fitted holding forecasts for 1..steps."""

    name = "model"

    def __init__(self, interval: float = 0.9, season: int | None = None):
        if not 0.0 < interval < 1.0:
            raise ValueError(f"interval must be in (0, 1), got {interval}")
        self.interval = interval
        self.season = season

    def has_season(self, y: np.ndarray) -> bool:
        return self.season is not None and self.season > 1 and len(y) >= 2 * self.season

    def fit(self, y: np.ndarray, steps: int) -> Fitted:
        raise NotImplementedError


class Naive(Model):
    name = "naive"

    def fit(self, y, steps):
        y = np.asarray(y, dtype=float)
        mean = np.full(steps, y[-1])
        lo, hi = _empirical_bounds(y, lambda t, h: y[t], steps, self.interval)
        return Fitted(self.name, mean, mean + lo, mean + hi)


class HistoryMean(Model):
    """The mean of the history, for the first steps before any model can be selected.

    A count series at a short step is mostly Poisson noise and the trace's clumps: carrying the
    last step forward (naive) would plan on whichever step a clump landed in, and its error
    spread is that of two noisy steps. The running mean is the best estimate of a level that has
    not had time to move, and its bounds come from how far later steps fell from it.
    """

    name = "history_mean"

    def fit(self, y, steps):
        y = np.asarray(y, dtype=float)
        mean = np.full(steps, float(np.mean(y)))
        # A level that does not move has the same error at every horizon: how far each step fell
        # from the mean of the steps before it (not the random walk's sqrt(h) growth).
        running = np.cumsum(y) / np.arange(1, len(y) + 1)
        errs = y[1:] - running[:-1]
        q_lo, q_hi = _quantiles(errs, self.interval) if len(errs) >= 3 else (math.nan, math.nan)
        if not np.isfinite(q_lo):
            sd = float(np.std(y)) if len(y) > 1 else 0.0
            q_lo, q_hi = -1.645 * sd, 1.645 * sd
        return Fitted(self.name, mean, mean + q_lo, mean + q_hi)


class SeasonalNaive(Model):
    name = "seasonal_naive"

    def fit(self, y, steps):
        y = np.asarray(y, dtype=float)
        m = self.season if self.season and len(y) >= self.season else None
        if m is None:
            return Naive(self.interval).fit(y, steps)  # no season in the history yet
        n = len(y)
        # The value one season before the target, walking back whole seasons when h > m.
        mean = np.array([y[n - m + ((h - 1) % m)] for h in range(1, steps + 1)])
        lo, hi = _empirical_bounds(y, lambda t, h: np.where(t + h - m >= 0, y[np.maximum(t + h - m, 0)], y[t]),
                                   steps, self.interval)
        return Fitted(self.name, mean, mean + lo, mean + hi)


class Linear(Model):
    """Least-squares line over the last `window` points, extrapolated (PHPA's linear regression)."""

    name = "linear"

    def __init__(self, interval: float = 0.9, season: int | None = None, window: int = 10):
        super().__init__(interval, season)
        self.window = window

    def fit(self, y, steps):
        y = np.asarray(y, dtype=float)
        w = y[-self.window:]
        x = np.arange(len(w), dtype=float)
        if len(w) >= 2:
            slope, intercept = np.polyfit(x, w, 1)
            resid = w - (slope * x + intercept)
            sd = float(np.sqrt(np.sum(resid ** 2) / max(len(w) - 2, 1)))
        else:
            slope, intercept, sd = 0.0, float(w[-1]), 0.0
        hs = np.arange(1, steps + 1)
        mean = intercept + slope * (len(w) - 1 + hs)
        z = 1.645 if abs(self.interval - 0.9) < 1e-9 else float(np.sqrt(2) * _erfinv(self.interval))
        return Fitted(self.name, mean, mean - z * sd, mean + z * sd)


def _erfinv(p: float) -> float:
    from scipy.special import erfinv
    return float(erfinv(p))


class HoltWinters(Model):
    name = "holt_winters"

    def __init__(self, interval: float = 0.9, season: int | None = None, max_points: int = 2000):
        super().__init__(interval, season)
        self.max_points = max_points

    def fit(self, y, steps):
        from statsmodels.tsa.holtwinters import ExponentialSmoothing
        y = np.asarray(y, dtype=float)[-self.max_points:]
        seasonal = self.has_season(y)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = ExponentialSmoothing(y, trend="add", damped_trend=True,
                                         seasonal="add" if seasonal else None,
                                         seasonal_periods=self.season if seasonal else None,
                                         initialization_method="estimated")
            res = model.fit()
        mean = np.asarray(res.forecast(steps), dtype=float)
        fitted = np.asarray(res.fittedvalues, dtype=float)
        sd = float(np.std(y - fitted))
        z = float(np.sqrt(2) * _erfinv(self.interval))
        # ETS(A,N,N) h-step variance σ²(1 + (h−1)α²): noise does not accumulate, level errors do.
        alpha = float(res.params.get("smoothing_level", 1.0))
        hs = np.sqrt(1.0 + (np.arange(1, steps + 1) - 1) * alpha ** 2)
        return Fitted(self.name, mean, mean - z * sd * hs, mean + z * sd * hs)


class Arima(Model):
    name = "arima"
    ORDERS = [(1, 1, 1), (0, 1, 1), (2, 1, 0)]

    def __init__(self, interval: float = 0.9, season: int | None = None, max_points: int = 500):
        super().__init__(interval, season)
        self.max_points = max_points

    def fit(self, y, steps):
        from statsmodels.tsa.arima.model import ARIMA
        y = np.asarray(y, dtype=float)[-self.max_points:]
        best = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for order in self.ORDERS:
                try:
                    res = ARIMA(y, order=order).fit()
                except (ValueError, np.linalg.LinAlgError):
                    continue
                if best is None or res.aic < best.aic:
                    best = res
        if best is None:
            raise RuntimeError("no ARIMA order could be fitted")
        fc = best.get_forecast(steps)
        conf = np.asarray(fc.conf_int(alpha=1.0 - self.interval), dtype=float)
        return Fitted(self.name, np.asarray(fc.predicted_mean, dtype=float), conf[:, 0], conf[:, 1])


MODELS = ("level", "naive", "seasonal_naive", "holt_winters", "arima", "linear")


def make_model(name: str, interval: float = 0.9, season: int | None = None) -> Model:
    from forecaster.level import Level  # its own module, built on the classes above

    classes = {cls.name: cls for cls in (Naive, SeasonalNaive, Level, Linear, HoltWinters, Arima)}
    if name not in classes:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(classes)}")
    return classes[name](interval=interval, season=season)
