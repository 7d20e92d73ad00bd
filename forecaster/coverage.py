"""Adaptive conformal inference: the tail level of each published bound, moved by what was missed.

Split-conformal bounds (forecaster/online.py) cover 90 % of what the recent window would have
been. On a trace whose errors drift or cluster (bursts), or where the calibration errors are in
part in-sample (the pool's average is chosen on the window it is calibrated on), that is not 90 %
of what comes next. Adaptive conformal inference (Gibbs & Candès, NeurIPS 2021) closes the loop:
every bound served is checked once its target has been observed, and the tail level the next
bound of its kind is drawn at moves by `gamma` against the miss:

    tail ← tail + gamma · (target − missed)

A miss widens the next bound; a run of hits narrows it slowly (by gamma·target each). Over any N
checked bounds the share missed is within (1 + gamma) / (gamma · N) of the target whatever the
series does (the paper's Proposition 4.1), so the long-run coverage is the one claimed on any
trace. One knob, `gamma`: how fast the level follows. At GAMMA (0.02) one miss takes a 5 % tail
to 3.1 % (a wider bound) and each hit gives back 0.1 point; 0.05 was measured beside it on every
bundled trace and 0.01 on the hour-long ones: coverage within 0.02 of it (docs/forecast/backtests.md).

State is the pending bounds and one level per kind of bound; a caller that forecasts every step
checks every bound, one that comes every hour checks the bounds it made.
"""

from __future__ import annotations

from collections import deque

import numpy as np

GAMMA = 0.02


class AdaptiveTails:
    """`size` kinds of one-sided bound (for example the lower and upper bound at each step ahead),
    each with its own tail level, all aiming at `target` (the share each may miss)."""

    def __init__(self, size: int, target: float, gamma: float = GAMMA):
        if not 0.0 < target < 1.0:
            raise ValueError(f"target must be in (0, 1), got {target}")
        if gamma < 0:
            raise ValueError(f"gamma must be >= 0 (0: the level stays put), got {gamma}")
        self.target = target
        self.gamma = gamma
        self.tails = np.full(size, target)
        self.checked = 0   # bounds checked so far
        self.missed = 0
        # (first, last step the target spans, kind, bound, +1 upper / -1 lower, "value"|"mean"|"max")
        self._pending: deque[tuple[int, int, int, float, int, str]] = deque()
        self._made_at: int | None = None

    def record(self, made_at: int, bounds: list[tuple[int, int, int, float, int, str]]) -> None:
        """Bounds made from the history ending at step `made_at`: (first, last, kind, bound, side,
        reduce), each a bound on reduce(values[first..last]) (side +1: at most; -1: at least)."""
        if self._made_at is not None and made_at < self._made_at:
            self._pending.clear()   # the step clock went back (a new series): nothing to check
        if self._made_at is not None and made_at == self._made_at:
            return   # made twice from one history: the first stands
        self._made_at = made_at
        self._pending.extend(b for b in bounds if np.isfinite(b[3]))

    def observe(self, last_index: int, values: np.ndarray) -> None:
        """Checks every pending bound that `values` (ending at step `last_index`) now covers and
        moves its kind's tail level."""
        offset = last_index - (len(values) - 1)
        still = deque()
        while self._pending:
            first, last, kind, bound, side, reduce = item = self._pending.popleft()
            if last > last_index:
                still.append(item)
                continue
            if first - offset < 0:
                continue   # older than the history kept
            span = values[first - offset:last - offset + 1]
            actual = float(span[0] if reduce == "value" else np.mean(span) if reduce == "mean" else np.max(span))
            if not np.isfinite(actual):
                continue   # nothing observed to check it against
            missed = actual > bound if side > 0 else actual < bound
            self.tails[kind] += self.gamma * (self.target - float(missed))
            self.checked += 1
            self.missed += int(missed)
        self._pending = still
