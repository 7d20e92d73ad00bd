"""Choosing a model per series, refitting on a schedule, and never waiting on a fit for long.

- `BoundedFitter` runs a fit in one worker thread and waits at most `timeout` seconds. A Python
  thread cannot be stopped, so a fit that overran keeps the worker; until it ends, new fits are
  refused at once (FitBusy) instead of piling up behind it.
- `ModelSelector` forecasts one series. At EVERY call it scores its built-in pool (naive,
  smoothed levels, rolling medians, damped trends: forecaster/pool.py) on the last `window`
  origins at the decision horizon, and forecasts with the average of the two best members
  that score under naive (the single best while a ramp is under way):
  `online.combination_weights`. Fitted candidates passed in (`level`, `holt_winters`,
  `arima`, ...) are scored every `reselect_every` calls by refitting at `num_origins` recent
  origins, against the pool's forecast on the same origins, by the switching rule of
  forecaster/online.py (a fitted model replaces the pool only for a `margin` better score, and
  is dropped for it once it scores worse). The pool's intervals are split-conformal on its own
  recent errors per step, each drawn at the tail level adaptive conformal inference has moved it
  to by what the bounds served missed (forecaster/coverage.py); `forecast_window` gives the
  mean rate over a window of steps and calibrated quantiles of it and of its peak, likewise. A fitted model that raises, overruns or
  returns NaN falls back to the last good fit (shifted by the steps since), then to naive.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

import numpy as np

from forecaster.coverage import GAMMA, AdaptiveTails
from forecaster.models import Fitted, Forecast, HistoryMean, Model, Naive
from forecaster.online import (MIN_ORIGINS, choose, combination_weights, conformal_quantile, origins_for,
                               pinball_loss, step_bounds, window_actuals, window_predictions)
from forecaster.pool import IS_TREND, NAMES, REFERENCE, Backcast, backcast, index_of

WARM = 3  # the pool's filters start on the first point; their first forecasts are not scored
MAX_WINDOWS = 32  # forecast windows whose adaptive levels are kept (least recently asked for goes)
POOL = "pool"  # the selector's state while the pool's average forecasts (not a fitted candidate)


class FitTimeout(Exception):
    pass


class FitBusy(Exception):
    pass


class BoundedFitter:
    def __init__(self, timeout: float):
        if timeout <= 0:
            raise ValueError(f"fit timeout must be > 0 seconds, got {timeout}")
        self.timeout = timeout
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forecast-fit")
        self._running = None
        self._lock = threading.Lock()

    def fit(self, model: Model, y: np.ndarray, steps: int, timeout: float | None = None) -> Fitted:
        with self._lock:
            if self._running is not None and not self._running.done():
                raise FitBusy(f"an earlier fit is still running past its deadline; skipped {model.name}")
            future = self._executor.submit(model.fit, y, steps)
            self._running = future
        try:
            return future.result(timeout=self.timeout if timeout is None else timeout)
        except FutureTimeout:
            raise FitTimeout(f"{model.name} fit took longer than {self.timeout:.2f}s") from None

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


@dataclass
class SelectorStatus:
    chosen: str                  # the candidate the last selection picked
    source: str                  # "pool" | "fit" | "last_good" | "naive"
    last_error: str | None = None
    num_fallbacks: int = 0
    last_fit_seconds: float = 0.0
    num_switches: int = 0


@dataclass
class WindowForecast:
    """Demand over steps start_step..end_step after the last point (1 = the next step)."""
    start_step: int
    end_step: int
    quantile: float
    mean: float          # forecast of the mean rate over the window
    mean_upper: float    # calibrated `quantile` of that mean rate
    peak: float          # point forecast of the window's maximum (one step's rate)
    peak_upper: float    # calibrated `quantile` of the window's maximum
    model_name: str      # the pool members chosen for this window's mean and peak, "mean/peak"
    num_calibration: int  # held-out origins the quantiles come from (0: warming up, conservative)


class ModelSelector:
    """Forecasts one series; owns the choice of model, the last good fit and the fallbacks.

    One selector per series: its choices (per decision horizon and per window) are its state.
    """

    def __init__(self, candidates: list[Model], steps: int, fit_timeout: float = 2.0,
                 reselect_every: int = 20, num_origins: int = 12, min_points: int = 20,
                 stale_steps: int | None = None, margin: float = 0.1, background: bool = False,
                 pool: bool = True, window: int | None = None, interval: float = 0.9,
                 max_points: int = 5760, gamma: float = GAMMA):
        if steps < 1:
            raise ValueError(f"forecast steps must be >= 1, got {steps}")
        if not candidates and not pool:
            raise ValueError("at least one candidate model is needed (or the built-in pool)")
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"margin must be in [0, 1), got {margin}")
        if not 0.0 < interval < 1.0:
            raise ValueError(f"interval must be in (0, 1), got {interval}")
        self.pool = pool
        # A candidate named like a pool member (naive) is the pool's: one naive, not two.
        self.candidates = {m.name: m for m in candidates if not (pool and m.name in NAMES)}
        self.steps = steps
        self.fitter = BoundedFitter(fit_timeout)
        self.reselect_every = reselect_every
        self.num_origins = num_origins
        self.min_points = min_points
        self.margin = margin
        self.interval = interval
        self.max_points = max_points
        # Scored origins: enough horizon-long stretches that a few bursts do not decide (h-step
        # errors of neighbouring origins share h-1 targets): an hour at 15 s, 8 horizons at least.
        self.window = window if window is not None else max(240, 8 * steps)
        # Calibration looks twice as far back: a quantile needs more points than a mean, and the
        # errors of the member just chosen (for being lucky lately) would narrow the interval.
        self.calibration_window = 2 * self.window
        # The pool's tail levels, steps 1..steps lower then upper, moved by what the bounds it
        # served missed (forecaster/coverage.py); and one pair (mean, peak) per forecast window.
        self.gamma = gamma
        self.tails = AdaptiveTails(2 * steps, (1.0 - interval) / 2.0, gamma)
        self._window_tails: dict[tuple[int, int, float], AdaptiveTails] = {}
        # A last good fit is usable while it has forecasts left for the whole horizon.
        self.stale_steps = stale_steps if stale_steps is not None else 2 * steps
        # The pool forecasts unless a fitted candidate has won; until MIN_ORIGINS origins can be
        # scored the pool's average is naive, the reactive signal (nothing known yet says a
        # smoothed level or a trend would do better on this series).
        self.chosen = POOL if pool else candidates[0].name
        self.members: tuple[str, ...] = ("naive",)   # the pool members averaged at the last call
        self._window_chosen: dict[tuple[int, int], tuple[str, str]] = {}  # (start, end) -> (mean, peak)
        self._calls = 0
        self._last_good: tuple[Fitted, int] | None = None  # fitted, end index when fitted
        self.status = SelectorStatus(self.chosen, "naive")
        # background=True: scoring the fitted candidates (many fits) runs in its own thread, so a
        # forecast never waits for it; the choice changes when it finishes. False: reproducible.
        self.background = background
        self._select_pool = ThreadPoolExecutor(1, thread_name_prefix="forecast-select") if background else None
        self._selecting = None

    # -- choosing ----------------------------------------------------------------------------
    def _switch(self, new: str) -> None:
        if new != self.chosen:
            self.status.num_switches += 1
        self.chosen = new  # one str assignment: atomic for readers in other threads

    def fitted_scores(self, y: np.ndarray) -> dict[str, float]:
        """Rolling-origin refits of the fitted candidates at the last `num_origins` origins, and
        the pool on the same origins (so the scores compare like with like)."""
        n, h = len(y), self.steps
        origins = [n - h - k * max(1, h // 4) for k in range(self.num_origins)]
        origins = [o for o in origins if o >= self.min_points]
        if not origins or not self.candidates:
            return {}
        scores = {}
        for name, model in self.candidates.items():
            errs = []
            try:
                for o in origins:
                    # In the background thread a fit may take its time; in line it is bounded.
                    fitted = model.fit(y[:o], h) if self.background else self.fitter.fit(model, y[:o], h)
                    errs.append(abs(fitted.forecast(h).mean[-1] - y[o + h - 1]))
            except Exception as exc:  # noqa: BLE001 - a candidate that cannot fit is not chosen
                self.status.last_error = f"selection: {name}: {exc}"
                continue
            scores[name] = float(np.mean(errs))
        if self.pool:
            bc = backcast(y[-self.max_points:])
            t = np.asarray(origins) - 1 - (n - bc.n)  # the last point each refit saw, in bc's index
            t = t[t >= 0]
            if len(t):
                pred = (self._weights(bc) * bc.predict(h)).sum(axis=0)
                scores[POOL] = float(np.abs(bc.y[t + h] - pred[t]).mean())
        return scores

    def select(self, y: np.ndarray) -> str:
        """Scores the fitted candidates (and the pool on their origins) and applies the rule: the
        pool is the home state (the `naive` of `choose`), a fitted model must beat it by `margin`."""
        y = np.asarray(y, dtype=float)
        scores = self.fitted_scores(y)
        home = POOL if self.pool else "naive"
        self._switch(choose(self.chosen, scores, self.margin, set(self.candidates), naive=home))
        return self.chosen

    def _weights(self, bc: Backcast) -> np.ndarray:
        return combination_weights(bc, self.steps, self.window, WARM, IS_TREND, index_of(REFERENCE), self.margin)

    # -- forecasting ---------------------------------------------------------------------------
    def forecast(self, y: np.ndarray, end_index: int | None = None) -> Forecast:
        """Forecast steps 1..steps after the last point; `end_index` numbers that point on an
        absolute step clock (the history may be a ring buffer), default len(y)."""
        y = np.asarray(y, dtype=float)
        end = len(y) if end_index is None else end_index
        if len(y) == 0:
            raise ValueError("no history to forecast from")
        if len(y) < self.min_points:
            # Warming up: too short a history to score a model on.
            self.status.source = "warm-up"
            return HistoryMean().fit(y, self.steps).forecast(self.steps)
        started = time.perf_counter()
        bc = backcast(y[-self.max_points:]) if self.pool else None
        if self.candidates and self._calls % self.reselect_every == 0:
            if not self.background:
                self.select(y)
            elif self._selecting is None or self._selecting.done():
                self._selecting = self._select_pool.submit(self.select, y.copy())
        self._calls += 1
        weights = None
        if bc is not None:
            weights = self._weights(bc)
        self.status.chosen = self.chosen
        if self.chosen == POOL and bc is not None:
            fc = self._pool_forecast(bc, weights, end)
            self.status.chosen = fc.model_name
            self.status.source = "pool"
            self.status.last_fit_seconds = time.perf_counter() - started
            return fc
        model = self.candidates[self.chosen]
        try:
            fitted = self.fitter.fit(model, y, self.steps + self.stale_steps)
            fc = fitted.forecast(self.steps)
            if not (np.all(np.isfinite(fc.mean)) and np.all(np.isfinite(fc.upper))):
                raise ValueError(f"{model.name} forecast is not finite")
        except Exception as exc:  # noqa: BLE001 - any failure falls back, and is reported
            self.status.last_error = f"{model.name}: {type(exc).__name__}: {exc}"
            self.status.num_fallbacks += 1
            return self._fallback(y, end)
        finally:
            self.status.last_fit_seconds = time.perf_counter() - started
        self._last_good = (fitted, end)
        self.status.source = "fit"
        return fc

    def _pool_forecast(self, bc: Backcast, weights: np.ndarray, end: int) -> Forecast:
        now = weights[:, -1]
        used = np.flatnonzero(now)
        members = tuple(NAMES[i] for i in used)
        if members != self.members:
            self.status.num_switches += 1
            self.members = members
        mean = np.sum([now[i] * bc.path(i, self.steps) for i in used], axis=0)
        # Calibrated on what these members, averaged so, would have erred at every recent origin
        # (as a single member is calibrated on its own errors), not only where they were chosen:
        # at a few arrivals a step, the errors of the few origins since they were would put the
        # bound at the largest of a handful.
        fixed = np.repeat(now[:, None], bc.n, axis=1)
        k = self.steps
        self.tails.observe(end, bc.y)
        lower, upper, _ = step_bounds(bc, fixed, k, self.calibration_window, WARM, self.interval, mean,
                                      (self.tails.tails[:k], self.tails.tails[k:]))
        lower = np.maximum(lower, 0.0)
        self.tails.record(end, [(end + h, end + h, h - 1, float(lower[h - 1]), -1, "value") for h in range(1, k + 1)]
                          + [(end + h, end + h, k + h - 1, float(upper[h - 1]), +1, "value") for h in range(1, k + 1)])
        return Forecast(mean, lower, upper, "+".join(members))

    def forecast_window(self, y: np.ndarray, end_index: int | None = None, start_step: int = 1,
                        end_step: int | None = None, quantile: float = 0.9) -> WindowForecast:
        """The mean rate over steps start_step..end_step (inclusive; 1 = the step after the last
        point) and calibrated `quantile`s of that mean and of the window's peak (max over its
        steps of the per-step rate). The pool member is chosen for this window by the same rule
        (scored on the window mean's absolute error); the quantiles are split-conformal on its
        residuals (actual minus forecast) at the last `window` origins whose windows have ended,
        each at the level its own misses have moved it to (forecaster/coverage.py); `end_index`
        numbers the last point as in `forecast`."""
        y = np.asarray(y, dtype=float)
        end_step = self.steps if end_step is None else end_step
        if len(y) == 0:
            raise ValueError("no history to forecast from")
        if not 1 <= start_step <= end_step:
            raise ValueError(f"need 1 <= start_step <= end_step, got {start_step}..{end_step}")
        if not 0.0 < quantile < 1.0:
            raise ValueError(f"quantile must be in (0, 1), got {quantile}")
        bc = backcast(y[-self.max_points:])
        end = len(y) if end_index is None else end_index
        key = (start_step, end_step)
        tails = self._window_tails.pop((start_step, end_step, quantile), None) or \
            AdaptiveTails(2, 1.0 - quantile, self.gamma)
        self._window_tails[(start_step, end_step, quantile)] = tails   # most recent last
        while len(self._window_tails) > MAX_WINDOWS:   # a caller whose windows keep changing
            self._window_tails.pop(next(iter(self._window_tails)))
        tails.observe(end, bc.y)
        q_mean, q_peak = 1.0 - tails.tails
        mean_pred, peak_pred = window_predictions(bc, start_step, end_step)
        mean_act, peak_act = window_actuals(bc.y, start_step, end_step)
        t = origins_for(bc.n, end_step, self.window, WARM)
        t_cal = origins_for(bc.n, end_step, self.calibration_window, WARM)
        trends = {n for n, tr in zip(NAMES, IS_TREND) if tr}
        mean_name, peak_name = self._window_chosen.get(key, ("naive", "naive"))
        if len(t) >= MIN_ORIGINS:
            # The mean's member by the window mean's absolute error; the peak's by the pinball
            # loss its calibrated quantile would have had (the loss the peak is judged by).
            scores = np.abs(mean_act[t][None, :] - mean_pred[:, t]).mean(axis=1)
            mean_name = choose(mean_name, dict(zip(NAMES, map(float, scores))), self.margin, trends,
                               reference=REFERENCE)
            resid = peak_act[t_cal][None, :] - peak_pred[:, t_cal]
            offsets = np.array([conformal_quantile(r, quantile) for r in resid])
            losses = pinball_loss(resid - offsets[:, None], quantile).mean(axis=1)
            peak_name = choose(peak_name, dict(zip(NAMES, map(float, losses))), self.margin, trends,
                               reference=REFERENCE)
        self._window_chosen[key] = (mean_name, peak_name)
        i, j = index_of(mean_name), index_of(peak_name)
        mean, peak = float(mean_pred[i, -1]), float(peak_pred[j, -1])
        if len(t) >= MIN_ORIGINS:
            mean_up = mean + max(0.0, conformal_quantile(mean_act[t_cal] - mean_pred[i, t_cal], q_mean))
            peak_up = peak + max(0.0, conformal_quantile(peak_act[t_cal] - peak_pred[j, t_cal], q_peak))
            tails.record(end, [(end + start_step, end + end_step, 0, mean_up, +1, "mean"),
                               (end + start_step, end + end_step, 1, peak_up, +1, "max")])
            return WindowForecast(start_step, end_step, quantile, mean, mean_up, peak, peak_up,
                                  f"{mean_name}/{peak_name}", len(t_cal))
        # Warming up (no window has ended often enough to calibrate on): the highest recent
        # value, which a steady series' peak rarely passes.
        top = float(np.quantile(bc.y[-max(2 * end_step, MIN_ORIGINS):], 1.0))
        return WindowForecast(start_step, end_step, quantile, mean, max(mean, top), peak, max(peak, top),
                              f"{mean_name}/{peak_name}", 0)

    def _fallback(self, y: np.ndarray, end: int) -> Forecast:
        if self._last_good is not None:
            fitted, fitted_end = self._last_good
            elapsed = end - fitted_end
            if 0 <= elapsed <= self.stale_steps:
                fc = fitted.forecast(self.steps + self.stale_steps)
                sl = slice(elapsed, elapsed + self.steps)
                self.status.source = "last_good"
                return Forecast(fc.mean[sl], fc.lower[sl], fc.upper[sl], f"{fitted.name}(last_good)")
        self.status.source = "naive"
        fc = Naive().fit(y, self.steps).forecast(self.steps)
        return Forecast(fc.mean, fc.lower, fc.upper, "naive(fallback)")

    def close(self) -> None:
        self.fitter.close()
        if self._select_pool is not None:
            self._select_pool.shutdown(wait=False, cancel_futures=True)
