"""Irregular observations → regular series: counters become rates, gauges are held.

Samples arrive roughly every `step` seconds but not exactly: scrapes are late, some are missed,
a sidecar restarts and its counters start again from zero, a value may be NaN. This module
owns the turning of that into a fixed-step history the models can read:

- a counter becomes a rate per step: increase / elapsed time. A drop in value is a reset; the
  increase across it is the new value (what Prometheus' `rate()` assumes).
- a gap of several steps spreads the increase evenly over the missing steps (the only thing
  the counter tells us); a gauge is held at its last value across the gap.
- a sample whose time is not after the last one is late and dropped (its information is older
  than what the series already holds); NaN and infinite values are skipped.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np


class CounterRate:
    """Turns one cumulative counter into increases between accepted samples."""

    def __init__(self) -> None:
        self.last_t: float | None = None
        self.last_value: float | None = None
        self.num_resets = 0

    def update(self, t: float, value: float) -> tuple[float, float] | None:
        """Returns (increase, elapsed seconds) since the previous sample, or None (first/late/NaN)."""
        if value is None or not math.isfinite(value):
            return None
        if self.last_t is not None and t <= self.last_t:
            return None
        if self.last_t is None:
            self.last_t, self.last_value = t, value
            return None
        if value < self.last_value:
            # Counter reset (process restart): it counted `value` since it restarted.
            self.num_resets += 1
            increase = value
        else:
            increase = value - self.last_value
        elapsed = t - self.last_t
        self.last_t, self.last_value = t, value
        return increase, elapsed


class StepSeries:
    """A fixed-step series of at most `capacity` points, in a ring buffer.

    Step k covers times [origin + k*step, origin + (k+1)*step). Values are per-step means.
    """

    def __init__(self, step: float, capacity: int):
        if step <= 0:
            raise ValueError(f"step must be > 0 seconds, got {step}")
        if capacity < 2:
            raise ValueError(f"capacity must be >= 2 points, got {capacity}")
        self.step = step
        self.capacity = capacity
        self._values: deque[float] = deque(maxlen=capacity)
        self.last_index: int | None = None

    def index_of(self, t: float) -> int:
        return int(math.floor(t / self.step))

    def put(self, index: int, value: float, fill: str = "hold") -> None:
        """Sets the value of step `index`; steps skipped since the last are filled.

        fill="hold" repeats the last value (gauges); fill="same" writes `value` into the
        skipped steps too (a rate averaged over a gap).
        """
        if not math.isfinite(value):
            return
        if self.last_index is None:
            self._values.append(value)
            self.last_index = index
            return
        if index < self.last_index:
            return  # late: older than what we already hold
        if index == self.last_index:
            # Two samples in one step: the newest wins (gauges) — rates are combined by the caller.
            self._values[-1] = value
            return
        gap = index - self.last_index - 1
        filler = self._values[-1] if fill == "hold" else value
        for _ in range(min(gap, self.capacity)):
            self._values.append(filler)
        self._values.append(value)
        self.last_index = index

    def values(self) -> np.ndarray:
        return np.asarray(self._values, dtype=float)

    def __len__(self) -> int:
        return len(self._values)

    @property
    def last(self) -> float | None:
        return self._values[-1] if self._values else None


class RateSeries:
    """A counter observed irregularly, kept as a fixed-step rate series (units per second)."""

    def __init__(self, step: float, capacity: int):
        self.counter = CounterRate()
        self.series = StepSeries(step, capacity)
        self._pending_index: int | None = None
        self._pending_increase = 0.0
        self._pending_elapsed = 0.0

    def update(self, t: float, value: float) -> None:
        got = self.counter.update(t, value)
        if got is None:
            return
        increase, elapsed = got
        index = self.series.index_of(t)
        if self._pending_index is not None and index == self._pending_index:
            # Several samples inside one step: the step's rate uses all of them.
            self._pending_increase += increase
            self._pending_elapsed += elapsed
        else:
            self._pending_index = index
            self._pending_increase = increase
            self._pending_elapsed = elapsed
        rate = self._pending_increase / self._pending_elapsed if self._pending_elapsed > 0 else 0.0
        # The increase since the previous accepted sample is spread evenly over the skipped steps.
        self.series.put(index, rate, fill="same")

    def values(self) -> np.ndarray:
        return self.series.values()

    @property
    def last(self) -> float | None:
        return self.series.last


class GaugeSeries:
    """A gauge observed irregularly, kept as a fixed-step series (held across gaps)."""

    def __init__(self, step: float, capacity: int):
        self.series = StepSeries(step, capacity)

    def update(self, t: float, value: float | None) -> None:
        if value is None or not math.isfinite(value):
            return
        self.series.put(self.series.index_of(t), float(value), fill="hold")

    def values(self) -> np.ndarray:
        return self.series.values()

    @property
    def last(self) -> float | None:
        return self.series.last


def aggregate(values: np.ndarray, factor: int) -> np.ndarray:
    """Means over consecutive blocks of `factor` points, aligned to the END (the newest block is full)."""
    if factor <= 1:
        return np.asarray(values, dtype=float)
    n = (len(values) // factor) * factor
    if n == 0:
        return np.asarray(values[-1:], dtype=float)
    tail = np.asarray(values[len(values) - n:], dtype=float)
    return tail.reshape(-1, factor).mean(axis=1)
