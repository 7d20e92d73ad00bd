"""Bounds of demand for the planner (forecaster/policy.py): the arrivals over the steps ahead,
the mean rate over the window a decision covers, and today's rate from its last few steps.

Arrival counts of independent users are at least as variable as a Poisson count's, and at a
few requests a step the Poisson shape matters (skewed, discrete): the bounds here hold there
as at many requests.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
from scipy.special import gammaincinv, ndtri


def cumulative_upper(mean: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """Per-step rates whose running sum is the upper bound of the ARRIVALS over 1..k steps.

    Summing every step's upper bound would assume each step is at its 95th percentile at once;
    per-step errors at 15 s are mostly independent noise, so the bound of the sum grows with the
    root of the summed squares: A_up(k) = Σ mean + sqrt(Σ (upper − mean)²).
    NOTE: this under-covers a level shift, which the next refit (one step later) picks up.
    """
    cum = np.cumsum(mean) + np.sqrt(np.cumsum((np.asarray(upper) - np.asarray(mean)) ** 2))
    return np.diff(np.concatenate([[0.0], cum]))


class DemandWindow:
    """The demand over the window a decision covers: which estimate of its mean rate to trust,
    chosen by how far each one's own forecasts of that mean missed.

    The planner bounds the mean arrival rate over a window ahead (the demand term's window). Two
    estimates of that mean are kept side by side: the forecast's mean over the window
    (`forecast`), and the mean of the last window observed (`recent`: naive at the window's
    scale). The forecast's model is chosen by its per-step absolute errors, and at a few requests
    a step a rolling median wins there, whose mean is one of a few values (at 1.4 arrivals a 5-s
    step, 0, 0.2 or 0.4 req/s where the rate is 0.29); the planner needs the window's mean.
    Every estimate is kept until its window has been observed, and scored by its absolute
    error; the estimate with the lower mean error over the last `keep` windows is used (the
    forecast until `min_scores` windows are in). Forecasts made from fewer points than the
    window holds are not scored: they say how a cold start forecasts, not how this one does.

    `poisson_spread` is how far a Poisson count's mean over a window strays from its rate at
    the bound's level: arrivals of independent users vary at least as much (`demand_spread`).
    """

    NAMES = ("forecast", "recent")

    def __init__(self, level: float, keep: int = 120, min_scores: int = 20):
        if not 0.5 <= level < 1:
            raise ValueError(f"level must be in [0.5, 1), got {level}")
        self.min_scores = max(1, min_scores)
        keep = max(self.min_scores, keep)
        self._pending: deque[tuple[int, int, dict]] = deque()   # (first, last index, {name: mean})
        self._errors = {name: deque(maxlen=keep) for name in self.NAMES}
        self._made_at: int | None = None
        self._z = float(ndtri(level))

    def poisson_spread(self, mean_rate, seconds: float):
        """The `level` quantile's distance from the mean of a Poisson rate's mean over `seconds`
        (a rate, or an array of them)."""
        return self._z * np.sqrt(np.maximum(0.0, mean_rate) / seconds) if seconds > 0 else 0.0 * mean_rate

    def record(self, made_at: int, first: int, last: int, estimates: dict) -> None:
        """Estimates {name: mean}, made at step `made_at`, of the mean rate over steps first..last."""
        if self._made_at is not None and made_at <= self._made_at:
            return   # decided twice in one step: the first forecast stands
        self._made_at = made_at
        if all(math.isfinite(m) for m in estimates.values()):
            self._pending.append((first, last, dict(estimates)))

    def observe(self, last_index: int, values: np.ndarray) -> None:
        """Scores every recorded window that `values` (ending at step `last_index`) now covers."""
        offset = last_index - (len(values) - 1)
        while self._pending and self._pending[0][1] <= last_index:
            first, last, estimates = self._pending.popleft()
            if first - offset < 0:
                continue   # older than the history kept
            observed = float(np.mean(values[first - offset:last - offset + 1]))
            for name, mean in estimates.items():
                self._errors[name].append(abs(observed - mean))

    @property
    def scores(self) -> int:
        return len(self._errors["forecast"])

    def mean_error(self, name: str) -> float:
        errors = self._errors[name]
        return float(np.mean(errors)) if errors else math.nan

    @property
    def chosen(self) -> str:
        if self.scores < self.min_scores:
            return "forecast"
        return min(self.NAMES, key=self.mean_error)


def demand_spread(half_widths: np.ndarray, poisson: float, priced: bool) -> float:
    """How far above the demand's mean over a window its upper bound lies.

    From the per-step bounds' half-widths over the window (`upper - mean`, independent: summed in
    quadrature). Those bounds are calibrated on the arrivals counted per step, so they hold two
    things: how far the rate itself may lie from the forecast, and the Poisson noise of a count
    about its rate, whose share of the window's spread is `poisson`
    (`DemandWindow.poisson_spread` at the window's rate).
    - `priced` (the capacity is the service model's): the model's TTFT and TPOT quantiles are
      those of Poisson arrivals at the rate (of clumps, where the sidecars measure them), so the
      count's noise is paid for there, and a bound that adds it again plans for it twice. The
      spread is the rate's alone: the Poisson part taken out in quadrature.
    - Otherwise (a throughput capacity prices no queueing) it bounds the window's arrivals, and is
      never under a Poisson count's spread, `poisson`.
    """
    widths = np.asarray(half_widths, dtype=float)
    quad = float(np.sqrt(np.sum(widths * widths))) / max(1, len(widths))
    if priced:
        return float(without_poisson(quad, poisson))
    return max(quad, poisson)


def without_poisson(half_width, poisson):
    """A bound's half-width less, in quadrature, the Poisson noise of a count about its rate
    (scalars or arrays): the rate's own uncertainty, where the service model prices the noise."""
    return np.sqrt(np.maximum(0.0, np.square(half_width) - np.square(poisson)))


def rate_lower_bound(rates: np.ndarray, step_s: float, confidence: float) -> float:
    """A Poisson rate from its last few per-step rates: the exact one-sided lower confidence
    bound of the mean of a Poisson count n (Garwood: the (1 − confidence) quantile of Gamma(n)),
    so it holds at a few requests as at many."""
    if len(rates) == 0:
        return 0.0
    span = len(rates) * step_s
    n = max(0.0, float(np.sum(rates)) * step_s)
    if n <= 0:
        return 0.0
    return float(gammaincinv(n, 1.0 - confidence)) / span


__all__ = ["DemandWindow", "cumulative_upper", "demand_spread", "rate_lower_bound", "without_poisson"]
