"""The selector's built-in candidates: cheap causal predictors with their whole past at once.

Each member is a linear filter or a rolling median run over the history in one pass, so the
forecast it WOULD have made at every past origin t (from y[:t+1] only; its parameters are fixed,
nothing is fitted) costs one array: `Backcast.predict(h)[t]` is member i's h-step forecast made
at t. That is what lets the selector score every candidate on the most recent held-out points
at every step, and calibrate intervals from genuine out-of-sample errors, in milliseconds.

Members (few on purpose: every extra member is one more way to win a noisy score by luck):
- `naive` (the last value);
- `ewma<a>`: exponentially weighted levels, a in EWMA_ALPHAS; `ewma0.15` is the reference
  smoothed level every trend must beat;
- `median<w>`: rolling medians (bursty arrivals are skewed; the median minimises absolute error);
- `trend<a>-<b>`: Holt's linear trend, damped by DAMPING per step (a ramp: a level lags it by
  slope × lag).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.signal import lfilter

from forecaster.level import _holt  # the same Holt filters as the level model

EWMA_ALPHAS = (0.03, 0.07, 0.15, 0.3, 0.6)
MEDIAN_WINDOWS = (10, 40)
TRENDS = ((0.15, 0.05), (0.4, 0.1))
DAMPING = 0.98
REFERENCE = "ewma0.15"   # "the smoothed level": a trend that cannot beat it is not kept

NAMES = (("naive",) + tuple(f"ewma{a:g}" for a in EWMA_ALPHAS) + tuple(f"median{w}" for w in MEDIAN_WINDOWS)
         + tuple(f"trend{a:g}-{b:g}" for a, b in TRENDS))
IS_TREND = np.array([n.startswith("trend") for n in NAMES])


@dataclass
class Backcast:
    """Level and trend of every member at every point of `y` (rows = NAMES)."""
    y: np.ndarray
    levels: np.ndarray   # (members, n)
    trends: np.ndarray   # (members, n), 0 for the trendless

    @property
    def n(self) -> int:
        return len(self.y)

    def predict(self, h: int, members=slice(None)) -> np.ndarray:
        """(members, n): the h-step forecast each member made at each t."""
        damp = float(np.sum(DAMPING ** np.arange(1, h + 1)))
        return np.maximum(self.levels[members] + damp * self.trends[members], 0.0)

    def path(self, member: int, steps: int, t: int | None = None) -> np.ndarray:
        """Member's forecasts of steps 1..steps made at t (default: the last point)."""
        t = self.n - 1 if t is None else t
        damp = np.cumsum(DAMPING ** np.arange(1, steps + 1))
        return np.maximum(self.levels[member, t] + damp * self.trends[member, t], 0.0)


def backcast(y: np.ndarray) -> Backcast:
    y = np.asarray(y, dtype=float)
    n = len(y)
    levels, trends = np.empty((len(NAMES), n)), np.zeros((len(NAMES), n))
    levels[0] = y
    i = 1
    # Bias-corrected (started from zero, divided by the weight so far): the running mean until
    # about 1/a points exist, then the EWMA. Started on y[0] instead, a slow level carries the
    # first point's noise for 1/a steps, and on an hour of history those errors would widen
    # the calibrated intervals of the whole trace.
    weight = 1.0 - (1.0 - np.asarray(EWMA_ALPHAS))[:, None] ** np.arange(1, n + 1)[None, :]
    for k, a in enumerate(EWMA_ALPHAS):
        levels[i] = lfilter([a], [1, -(1 - a)], y) / weight[k]
        i += 1
    for w in MEDIAN_WINDOWS:
        levels[i] = pd.Series(y).rolling(w, min_periods=1).median().to_numpy()
        i += 1
    for a, b in TRENDS:
        levels[i], trends[i] = _holt(y, a, b)
        i += 1
    return Backcast(y, levels, trends)


def index_of(name: str) -> int:
    return NAMES.index(name)
