"""Choosing a model per series, refitting on a schedule, and never waiting on a fit for long.

- `BoundedFitter` runs a fit in one worker thread and waits at most `timeout` seconds. A Python
  thread cannot be stopped, so a fit that overran keeps the worker; until it ends, new fits are
  refused at once (FitBusy) instead of piling up behind it.
- `ModelSelector` picks, every `reselect_every` calls, the candidate with the lowest mean absolute
  error at the decision horizon over the last few origins of the history (a rolling-origin
  backtest; the first candidate is kept unless another is `margin` better), fits the chosen
  model on every call, and on failure falls back to the last good fit
  (its forecast shifted by the steps since), then to the naive forecast (the reactive signal).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

import numpy as np

from forecaster.models import Fitted, Forecast, Model, Naive


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
    source: str                  # "fit" | "last_good" | "naive"
    last_error: str | None = None
    num_fallbacks: int = 0
    last_fit_seconds: float = 0.0


class ModelSelector:
    """Forecasts one series; owns the choice of model, the last good fit and the fallbacks."""

    def __init__(self, candidates: list[Model], steps: int, fit_timeout: float = 2.0,
                 reselect_every: int = 20, num_origins: int = 12, min_points: int = 20,
                 stale_steps: int | None = None, margin: float = 0.2, background: bool = False):
        if not candidates:
            raise ValueError("at least one candidate model is needed")
        if steps < 1:
            raise ValueError(f"forecast steps must be >= 1, got {steps}")
        self.candidates = {m.name: m for m in candidates}
        self.steps = steps
        self.fitter = BoundedFitter(fit_timeout)
        self.reselect_every = reselect_every
        self.num_origins = num_origins
        self.min_points = min_points
        self.margin = margin
        # A last good fit is usable while it has forecasts left for the whole horizon.
        self.stale_steps = stale_steps if stale_steps is not None else 2 * steps
        self.chosen = candidates[0].name
        self._calls = 0
        self._last_good: tuple[Fitted, int] | None = None  # fitted, end index when fitted
        self.status = SelectorStatus(self.chosen, "naive")
        # background=True: re-selection (many fits) runs in its own thread, so a forecast never
        # waits for it; the choice changes when it finishes. False keeps runs reproducible.
        self.background = background
        self._select_pool = ThreadPoolExecutor(1, thread_name_prefix="forecast-select") if background else None
        self._selecting = None

    def select(self, y: np.ndarray) -> str:
        """Rolling-origin backtest of every candidate at the horizon on the recent history."""
        n = len(y)
        h = self.steps
        origins = [n - h - k * max(1, h // 4) for k in range(self.num_origins)]
        origins = [o for o in origins if o >= self.min_points]
        if len(self.candidates) == 1 or not origins:
            return self.chosen
        scores = {}
        for name, model in self.candidates.items():
            errs = []
            try:
                for o in origins:
                    # In the background thread a fit may take its time; in line it is bounded.
                    fitted = model.fit(y[:o], h) if self.background else self.fitter.fit(model, y[:o], h)
                    fc = fitted.forecast(h)
                    errs.append(abs(fc.mean[-1] - y[o + h - 1]))
            except Exception as exc:  # noqa: BLE001 - a candidate that cannot fit is not chosen
                self.status.last_error = f"selection: {name}: {exc}"
                continue
            scores[name] = float(np.mean(errs))
        if scores:
            best = min(scores, key=scores.get)
            default = next(iter(self.candidates))
            # A few origins make a noisy score: leave the default (first) candidate only for a
            # clear win, so selection does not chase noise.
            if default in scores and scores[best] > (1.0 - self.margin) * scores[default]:
                best = default
            self.chosen = best  # one str assignment: atomic for readers in other threads
        return self.chosen

    def forecast(self, y: np.ndarray, end_index: int | None = None) -> Forecast:
        """Forecast steps 1..steps after the last point; `end_index` numbers that point on an
        absolute step clock (the history may be a ring buffer), default len(y)."""
        y = np.asarray(y, dtype=float)
        end = len(y) if end_index is None else end_index
        if len(y) == 0:
            raise ValueError("no history to forecast from")
        if len(y) < self.min_points:
            self.status.source = "naive"
            return Naive().fit(y, self.steps).forecast(self.steps)
        if self._calls % self.reselect_every == 0:
            if not self.background:
                self.select(y)
            elif self._selecting is None or self._selecting.done():
                self._selecting = self._select_pool.submit(self.select, y.copy())
        self._calls += 1
        self.status.chosen = self.chosen
        model = self.candidates[self.chosen]
        started = time.perf_counter()
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
