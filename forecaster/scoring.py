"""Live scoring of published forecasts: each one against what was observed one horizon later.

Every step the runner records what it published (per quantity: the mean and the upper bound at
the horizon) and what it observes now. A forecast made at t for t + h is scored at the first
observation at or after t + h: its absolute error and whether the actual stayed under the upper
bound. Scores are exponentially weighted over the last `memory` scored forecasts, so the exported
figures say how far to trust the forecaster on the traffic it serves now, not on average since
start.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

QUANTITIES = ("queue_depth", "arrival_rate", "ttft", "tpot")


@dataclass
class Score:
    """Exponentially weighted error of one quantity's forecasts."""

    weight: float = 0.0
    abs_error: float = 0.0
    actual: float = 0.0
    covered: float = 0.0
    num_scored: int = 0

    @property
    def mean_absolute_error(self) -> float:
        return self.abs_error / self.weight if self.weight else math.nan

    @property
    def relative_error(self) -> float:
        """Mean absolute error over the mean actual (NaN while the actual is 0)."""
        return self.abs_error / self.actual if self.actual > 0 else math.nan

    @property
    def upper_coverage(self) -> float:
        return self.covered / self.weight if self.weight else math.nan


class ForecastScorer:
    def __init__(self, memory: int = 40):
        self.keep = 1.0 - 1.0 / max(1, memory)
        self.pending: deque = deque()   # (due time, quantity, mean, upper); one horizon, so in due order
        self.scores = {q: Score() for q in QUANTITIES}

    def record(self, t: float, horizon_s: float, forecasts: dict[str, tuple[float, float]]) -> None:
        for quantity, (mean, upper) in forecasts.items():
            if quantity in self.scores and math.isfinite(mean):
                self.pending.append((t + horizon_s, quantity, float(mean), float(upper)))

    def observe(self, t: float, actuals: dict[str, float]) -> None:
        """Scores every pending forecast now due against this observation (when it has one)."""
        while self.pending and self.pending[0][0] <= t + 1e-9:
            due, quantity, mean, upper = self.pending.popleft()
            actual = actuals.get(quantity)
            if actual is None or not math.isfinite(actual):
                continue  # nothing observed for it at its time: drop, never score against a guess
            s = self.scores[quantity]
            k = self.keep
            s.weight = s.weight * k + 1.0
            s.abs_error = s.abs_error * k + abs(mean - actual)
            s.actual = s.actual * k + abs(actual)
            s.covered = s.covered * k + (1.0 if actual <= upper + 1e-12 else 0.0)
            s.num_scored += 1


__all__ = ["QUANTITIES", "Score", "ForecastScorer"]
