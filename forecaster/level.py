"""`level`: the forecaster's own model, cheap enough to refit every step on a day at 15 s.

A family of simple predictors is run over the whole history in one pass each (linear filters,
rolling medians), and for every horizon h the member with the lowest mean absolute h-step error
on the history is used:

- exponentially weighted levels (12 smoothing constants, 1.0 = the last value);
- rolling medians (bursty arrivals are skewed; the median minimises absolute error);
- Holt's linear trend, damped (ramps: a level alone lags a ramp by slope × horizon).

Recent errors weigh more (half-life `halflife` points), and when the chosen member has missed on
the same side for the last 16 steps (Trigg's tracking signal), the choice is made on the last
few points only, so a ramp that starts after a flat day is followed within minutes.

Each member at time t uses only points up to t, so its errors on the history are genuine
out-of-sample h-step errors, and their quantiles are the prediction interval (no distributional
assumption). With three days of history a multiplicative daily profile is tried too (the series
divided by it, the forecast multiplied back), and kept only if it wins on a day it was not built from.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.signal import lfilter, lfilter_zi

from forecaster.models import Fitted, Model, _quantiles

ALPHAS = (0.02, 0.04, 0.07, 0.1, 0.15, 0.2, 0.3, 0.4, 0.55, 0.7, 0.85, 1.0)
MEDIAN_WINDOWS = (5, 10, 20, 40)
HOLT = tuple((a, b) for a in (0.1, 0.3, 0.6) for b in (0.05, 0.2))
DAMPING = 0.98
SEASON_MARGIN = 0.1   # the daily profile must beat no profile by this much on the held-out day
TRACKING_POINTS = 16   # one-step errors in the tracking signal (4 min at 15 s)
TRACKING_LIMIT = 0.9   # |Σe|/Σ|e| above this: biased (independent errors give ~1/√16 = 0.25)


def _profile(y: np.ndarray, m: int, max_cycles: int = 7) -> np.ndarray:
    """Multiplicative profile per phase (mean 1) from the last whole cycles; index j belongs to
    point n-k+j (k = points in the cycles used)."""
    n = len(y)
    k = min(n // m, max_cycles) * m
    shape = y[n - k:].reshape(-1, m).mean(axis=0)
    if m >= 24:
        # Smooth long profiles a little (circular 3-point mean): phases are noisy at fine resolution.
        shape = (np.roll(shape, 1) + shape + np.roll(shape, -1)) / 3.0
    total = shape.mean()
    if total <= 0:
        return np.ones(m)
    shape = np.maximum(shape / total, 0.05)
    return shape / shape.mean()


def _holt(d: np.ndarray, alpha: float, beta: float) -> tuple[np.ndarray, np.ndarray]:
    """Holt's level and trend as linear filters of d (an LTI system, so lfilter runs it in C).

    l_t = αd_t + (1−α)(l_{t−1} + b_{t−1}),  b_t = β(l_t − l_{t−1}) + (1−β)b_{t−1}
    ⇒ L = α(1 − (1−β)z⁻¹)/P · D,  B = αβ(1 − z⁻¹)/P · D,  P = 1 − (2 − α − αβ)z⁻¹ + (1−α)z⁻².
    Started in steady state on d_0 (level d_0, trend 0).
    """
    a = [1.0, -(2.0 - alpha - alpha * beta), 1.0 - alpha]
    bl = [alpha, -alpha * (1.0 - beta)]
    bb = [alpha * beta, -alpha * beta]
    level = lfilter(bl, a, d, zi=lfilter_zi(bl, a) * d[0])[0]
    trend = lfilter(bb, a, d, zi=lfilter_zi(bb, a) * d[0])[0]
    return level, trend


class Level(Model):
    name = "level"

    def __init__(self, interval: float = 0.9, season: int | None = None, max_points: int = 5760,
                 halflife: float | None = 60.0):
        super().__init__(interval, season)
        self.max_points = max_points  # a day at 15 s
        # Recent errors count more when picking the member (half weight `halflife` points back),
        # so a change of regime (a ramp starting) switches members within minutes.
        self.halflife = halflife

    def fit(self, y, steps):
        y = np.asarray(y, dtype=float)[-self.max_points:]
        plain_score, plain = self._fit_one(y, steps, None)
        m = self.season
        if m and m > 1 and len(y) >= 3 * m:
            # Score the daily profile out of sample: built without the last day, which the
            # recency-weighted errors mostly look at. Built from all of it, it would fit the
            # days it is scored on and win whether or not the days repeat.
            held_out_score, _ = self._fit_one(y, steps, m, profile_end=len(y) - m)
            if held_out_score < (1.0 - SEASON_MARGIN) * plain_score:
                return self._fit_one(y, steps, m)[1]
        return plain

    @staticmethod
    def _biased(d: np.ndarray, level: np.ndarray, trend: np.ndarray) -> bool:
        """Trigg's tracking signal on the last one-step errors: |Σe| / Σ|e| near 1 means bias."""
        k = TRACKING_POINTS
        if len(d) < k + 2:
            return False
        e = d[-k:] - (level[-k - 1:-1] + trend[-k - 1:-1])
        total = np.sum(np.abs(e))
        return total > 0 and abs(np.sum(e)) / total > TRACKING_LIMIT

    def _members(self, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Level and trend of every member at every t (trend 0 for the trendless ones)."""
        n = len(d)
        rows = len(ALPHAS) + len(MEDIAN_WINDOWS) + len(HOLT)
        levels, trends = np.empty((rows, n)), np.zeros((rows, n))
        for i, a in enumerate(ALPHAS):
            levels[i] = lfilter([a], [1, -(1 - a)], d, zi=np.array([(1 - a) * d[0]]))[0]
        i = len(ALPHAS)
        for w in MEDIAN_WINDOWS:
            levels[i] = pd.Series(d).rolling(w, min_periods=1).median().to_numpy()
            i += 1
        for a, b in HOLT:
            levels[i], trends[i] = _holt(d, a, b)
            i += 1
        return levels, trends

    def _fit_one(self, y, steps, m, profile_end: int | None = None):
        """(in-sample MAE averaged over horizons, Fitted) for season m (None = none), the
        profile built from y[:profile_end]."""
        n = len(y)
        if m is not None:
            end = n if profile_end is None else profile_end
            k = min(end // m, 7) * m
            shape = _profile(y[:end], m)
            season_of = lambda t: shape[(np.asarray(t) - (end - k)) % m]  # noqa: E731
        else:
            season_of = lambda t: np.ones(np.shape(t))  # noqa: E731
        d = y / season_of(np.arange(n))
        levels, trends = self._members(d)
        # Damped trend: the h-step trend multiplier is φ + φ² + … + φ^h.
        damp = np.cumsum(DAMPING ** np.arange(1, steps + 1))
        mean, lower, upper = np.zeros(steps), np.zeros(steps), np.zeros(steps)
        warm = min(n // 4, 50)
        score = 0.0
        for h in range(1, steps + 1):
            t = np.arange(warm, n - h)
            if len(t) >= 5:
                preds = (levels[:, t] + damp[h - 1] * trends[:, t]) * season_of(t + h)
                errs = y[t + h][None, :] - preds
                w = 0.5 ** ((n - h - t) / self.halflife) if self.halflife else np.ones(len(t))
                maes = np.abs(errs) @ (w / w.sum())
                best = int(np.argmin(maes))
                if self._biased(d, levels[best], trends[best]):
                    # The chosen member has missed on the same side for a while (a regime change,
                    # a ramp starting): choose on the last few points only.
                    w = 0.5 ** ((n - h - t) / TRACKING_POINTS)
                    best = int(np.argmin(np.abs(errs) @ (w / w.sum())))
                score += float(maes[best]) / steps
                q_lo, q_hi = _quantiles(errs[best], self.interval)
            else:
                best = len(ALPHAS) - 1  # alpha 1: the last value
                sd1 = float(np.std(np.diff(y))) if n > 2 else 0.0
                q_lo, q_hi = -1.645 * sd1 * np.sqrt(h), 1.645 * sd1 * np.sqrt(h)
                score = float("inf")
            if h > 1:
                # Uncertainty does not shrink with the horizon; a thin tail of h-step errors
                # (few long-horizon errors in a short history) must not narrow the interval.
                q_lo, q_hi = min(q_lo, lo_prev), max(q_hi, hi_prev)
            lo_prev, hi_prev = q_lo, q_hi
            mean[h - 1] = (levels[best, -1] + damp[h - 1] * trends[best, -1]) * season_of(n - 1 + h)
            lower[h - 1], upper[h - 1] = mean[h - 1] + q_lo, mean[h - 1] + q_hi
        name = self.name if m is None else f"{self.name}[daily]"
        return score, Fitted(name, mean, lower, upper)
