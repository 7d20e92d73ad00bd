"""Online scoring, the switching rule and split-conformal calibration on the pool's backcast.

Everything here reads a `Backcast` (forecaster/pool.py): every member's forecast at every past
origin, made from the points before it. Scores and calibration errors are therefore genuine
held-out errors of the recent past, recomputed from the history at every call (no state to
drift, the same answer whether the caller came every step or every hour).

The pool's forecast (`combination_weights`), stated once. At every step, each member gets a score
at the decision horizon: its mean absolute error over the last `window` origins. While a ramp or
a level shift is under way, it gets the larger of that and the last two horizons' mean instead
(`pool_scores`). "Under way" is Trigg's tracking signal: the smoothed level's last
TRACKING_POINTS one-step errors have kept one sign.
- A member counts only while its score is below naive's.
- A trend counts only while its score is also `margin` under the smoothed level's
  (`pool.REFERENCE`).
- The forecast is the two best such members averaged, or naive among them, with equal weights.
- While under way, the single best member is used, as an average with a lagging level would
  halve a ramp's lead.

The average needs no guard of its own against naive. Absolute error is convex, so the average
of two members scored at most the mean of their scores, and both scored under naive.
Selecting one member on a noisy score pays for the luck that made it win, and averaging two
halves that luck. Measured on every trace: docs/forecast/tried-combination.md.

The switching rule (`choose`), stated once. It is used between the fitted candidates and the
pool's average (selection.py, with the pool as its `naive`), and between pool members for
`forecast_window`. Each model's score is its mean absolute error on the same origins.
1. Guards: a model that loses to `naive` is replaced by naive. A trend model (or a fitted
   one) that loses to the smoothed level (`pool.REFERENCE`) is replaced by that level.
2. Then the window's best replaces what is kept only when it is `margin` better.
So naive is the home state, and leaving it (or any choice) takes a clear win.

Intervals: split-conformal on a rolling window. For each step h, the h-step errors of what was
forecast (the average in force at each origin, or the chosen member) at the last `window` origins
whose targets are known; the bounds are their finite-sample
conformal quantiles (the ceil((n+1)(1-tail))-th order statistic), so a 90 % interval covers
90 % of what the recent past would have been, at that horizon, for that model. The tail each
bound is drawn at is the one thing with state: `step_bounds` takes it per step and side from
forecaster/coverage.py, which moves it by what the bounds already served missed.
"""

from __future__ import annotations

import math

import numpy as np

from forecaster.pool import Backcast

MIN_ORIGINS = 8   # fewer scored origins than this: no switch, no calibration (too noisy)
TRACKING_POINTS = 16   # Trigg's tracking signal as the level model's (forecaster/level.py)
TRACKING_LIMIT = 0.9


def conformal_quantile(residuals: np.ndarray, q: float) -> float:
    """The finite-sample split-conformal q-quantile: the ceil((n+1)q)-th smallest residual
    (capped at the largest: with n < 1/(1-q) - 1 points the exact bound would be infinite; a
    q <= 0 is the smallest)."""
    r = np.sort(residuals[np.isfinite(residuals)])
    n = len(r)
    if n == 0:
        return float("nan")
    k = min(n, max(1, math.ceil((n + 1) * min(q, 1.0))))
    return float(r[k - 1])


def pinball_loss(residuals: np.ndarray, q: float) -> np.ndarray:
    """Pinball loss of residuals (actual − predicted quantile): q·r above, (q − 1)·r below."""
    return np.where(residuals >= 0, q * residuals, (q - 1.0) * residuals)


def choose(current: str, scores: dict[str, float], margin: float, complex_names: set[str],
           naive: str = "naive", reference: str | None = None) -> str:
    """The switching rule (module docstring). `scores`: mean absolute error on the same origins."""
    if not scores:
        return current
    keep = current if current in scores else naive if naive in scores else min(scores, key=scores.get)
    # Guards: the baseline a model loses to takes its place (the simpler choice is the default).
    if naive in scores and scores[keep] > scores[naive]:
        keep = naive
    elif keep in complex_names and reference in scores and scores[keep] > scores[reference]:
        keep = reference
    best = min(scores, key=scores.get)
    return best if scores[best] < (1.0 - margin) * scores[keep] else keep


def origins_for(n: int, lead: int, window: int, warm: int) -> np.ndarray:
    """The last `window` origins t whose target t + lead is inside the history (t >= warm)."""
    last = n - 1 - lead
    return np.arange(max(warm, last - window + 1), last + 1)


def pool_scores(bc: Backcast, h: int, window: int, warm: int) -> np.ndarray | None:
    """Every member's score at horizon h: the larger of its mean absolute h-step error over the
    last `window` origins and over the last `recent_window(h)` (None: too few origins).

    The long window keeps a lucky burst from deciding; the short one means a model that has
    started to miss (a level lagging a ramp that began minutes ago) cannot hide behind an hour
    of good errors before it."""
    t = origins_for(bc.n, h, window, warm)
    if len(t) < MIN_ORIGINS:
        return None
    errs = np.abs(bc.y[t + h][None, :] - bc.predict(h)[:, t])
    short = min(len(t), recent_window(h))
    return np.maximum(errs.mean(axis=1), errs[:, -short:].mean(axis=1))


def rolling_scores(errors: np.ndarray, h: int, window: int, warm: int) -> tuple[np.ndarray, np.ndarray]:
    """`pool_scores` at every point at once: errors (m, n-h) are the h-step absolute errors of
    origins 0..n-h-1; returns (m, n) scores as known at each t (origins up to t-h) and (n,) a mask
    of the points with at least MIN_ORIGINS scored origins; also the long window's mean alone
    (m, n), the steadier ranking."""
    m, k = errors.shape
    n = k + h
    csum = np.concatenate([np.zeros((m, 1)), np.cumsum(errors, axis=1)], axis=1)
    end = np.clip(np.arange(n) - h + 1, 0, k)                   # exclusive: origins < end are known
    start = np.minimum(np.maximum(warm, end - window), end)
    short = np.minimum(np.maximum(start, end - recent_window(h)), end)
    count = end - start
    with np.errstate(invalid="ignore", divide="ignore"):
        long_mean = (csum[:, end] - csum[:, start]) / count
        short_mean = (csum[:, end] - csum[:, short]) / (end - short)
    return np.maximum(long_mean, short_mean), long_mean, count >= MIN_ORIGINS


def combination_weights(bc: Backcast, h: int, window: int, warm: int, is_trend: np.ndarray,
                        reference: int, margin: float) -> np.ndarray:
    """(members, n): the pool's forecast at each t as weights on its members (module docstring),
    from the scores at horizon h known at t. All weight is on naive (member 0) before
    MIN_ORIGINS origins are scored."""
    n = bc.n
    m = bc.levels.shape[0]
    weights = np.zeros((m, n))
    weights[0] = 1.0
    if n <= h + warm:
        return weights
    pred = bc.predict(h)
    scores, steady, valid = rolling_scores(np.abs(bc.y[None, h:] - pred[:, :n - h]), h, window, warm)
    # Ranked on the window's mean (steadier), or on the larger of it and the last two horizons'
    # while the smoothed level's one-step errors have kept one sign (Trigg's tracking signal over
    # TRACKING_POINTS steps above TRACKING_LIMIT: a ramp or a level shift under way).
    one = np.zeros(n)
    one[1:] = bc.y[1:] - bc.predict(1)[reference, :-1]
    c_signed = np.concatenate([[0.0], np.cumsum(one)])
    c_abs = np.concatenate([[0.0], np.cumsum(np.abs(one))])
    end = np.arange(1, n + 1)
    start = np.maximum(1, end - TRACKING_POINTS)
    total = c_abs[end] - c_abs[start]
    biased = (end - start >= TRACKING_POINTS) & \
        (np.abs(c_signed[end] - c_signed[start]) > TRACKING_LIMIT * np.maximum(total, 1e-12))
    rank_by = np.where(biased[None, :], scores, steady)
    # Better than naive beyond rounding (a constant series ties every level with naive).
    ranked = np.where(rank_by < (1.0 - 1e-9) * rank_by[0][None, :], rank_by, np.inf)
    ranked[0] = rank_by[0]
    ranked[is_trend] = np.where(rank_by[is_trend] <= (1.0 - margin) * rank_by[reference][None, :],
                                ranked[is_trend], np.inf)
    ranked = np.where(np.isfinite(ranked), ranked, np.inf)   # nan (unscored) ranks last
    top = np.argsort(ranked, axis=0, kind="stable")[:2]
    # While biased, the single best: an average with a lagging level would halve a ramp's lead.
    second_ok = np.isfinite(np.take_along_axis(ranked, top[1:2], axis=0))[0] & ~biased
    combined = np.zeros((m, n))
    np.put_along_axis(combined, top[:1], np.where(second_ok, 0.5, 1.0)[None, :], axis=0)
    np.put_along_axis(combined, top[1:2], np.where(second_ok, 0.5, 0.0)[None, :], axis=0)
    # No guard on the average is needed: each member scored under naive on these windows, and an
    # average's absolute errors are at most the mean of its members' (convexity), so it did too.
    weights[:, valid] = combined[:, valid]
    return weights


def recent_window(h: int) -> int:
    """Origins in the short window: two horizons, MIN_ORIGINS at least."""
    return max(MIN_ORIGINS, 2 * h)


def step_bounds(bc: Backcast, member, steps: int, window: int, warm: int, interval: float,
                mean: np.ndarray, tails: tuple[np.ndarray, np.ndarray] | None = None
                ) -> tuple[np.ndarray, np.ndarray, int]:
    """Conformal lower/upper per step 1..steps around `mean`, and the fewest errors used.
    `member`: one member's index, or a (members, n) weight matrix (`combination_weights`).

    Where a step has too few known targets (a short history), the widest bounds of the shorter
    steps are used, widened by sqrt(h / h_known) as a random walk would (only while warming up).
    """
    tail = (1.0 - interval) / 2.0
    lo, hi = np.full(steps, np.nan), np.full(steps, np.nan)
    used = window
    for h in range(1, steps + 1):
        t = origins_for(bc.n, h, window, warm)
        if len(t) < MIN_ORIGINS:
            break
        pred = bc.predict(h, member) if np.ndim(member) == 0 else (member * bc.predict(h)).sum(axis=0)
        e = bc.y[t + h] - pred[t]
        # Lower tail: the (1-tail)-quantile of the negated errors (the same finite-sample rule).
        t_lo, t_hi = (tail, tail) if tails is None else (tails[0][h - 1], tails[1][h - 1])
        lo[h - 1], hi[h - 1] = -conformal_quantile(-e, 1.0 - t_lo), conformal_quantile(e, 1.0 - t_hi)
        used = min(used, len(t))
    known = int(np.sum(np.isfinite(hi)))
    if known < steps:
        if known == 0:
            sd = float(np.std(np.diff(bc.y))) if bc.n > 2 else 0.0
            base_lo, base_hi, known, used = -1.645 * sd, 1.645 * sd, 1, 0
        else:
            base_lo, base_hi = float(np.min(lo[:known])), float(np.max(hi[:known]))
        grow = np.sqrt(np.arange(known + 1, steps + 1) / known)
        lo[known:], hi[known:] = base_lo * grow, base_hi * grow
    return mean + np.minimum(lo, 0.0), mean + np.maximum(hi, 0.0), used


def window_coefficients(start: int, end: int) -> tuple[float, float, float]:
    """Damped-trend multipliers for a window of steps start..end: (mean, at start, at end)."""
    from forecaster.pool import DAMPING
    damp = np.cumsum(DAMPING ** np.arange(1, end + 1))[start - 1:end]
    return float(damp.mean()), float(damp[0]), float(damp[-1])


def window_predictions(bc: Backcast, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """(members, n) each: the forecast mean over steps start..end, and of its peak, made at each t."""
    c_mean, c_start, c_end = window_coefficients(start, end)
    mean = np.maximum(bc.levels + c_mean * bc.trends, 0.0)
    # The peak of a straight damped path is at one end: the far one for a rising trend.
    peak = np.maximum(bc.levels + np.where(bc.trends > 0, c_end, c_start) * bc.trends, 0.0)
    return mean, peak


def window_actuals(y: np.ndarray, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """For origins t = 0..n-1-end: the actual mean and max of y[t+start..t+end]."""
    import pandas as pd
    width = end - start + 1
    s = pd.Series(y)
    mean = s.rolling(width).mean().to_numpy()[end:]     # row j: window ending at index j + end
    peak = s.rolling(width).max().to_numpy()[end:]
    return mean, peak
