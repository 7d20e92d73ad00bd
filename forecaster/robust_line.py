"""A step curve y = a + c·x + d·z fitted robustly to points that age: the service-model learner's
decode step against the batch (forecaster/service_learn.py), z the step's concave part at that
point (ln of the batch; for a Poisson batch, the mean of its log). Without z values (all 0) it is
the straight line y = a + c·x. And the weighted median of aging points, the learner's estimate
where queueing only ever adds to a point (prefill, the step of one sequence alone)."""

from __future__ import annotations

import math
from collections import deque
from typing import NamedTuple

import numpy as np


class Fit(NamedTuple):
    a: float
    c: float
    se_a: float
    se_c: float
    d: float = 0.0
    se_d: float = 0.0
    x_mean: float = 1.0   # the weighted mean batch of the points (and the prior's): where a and c are least correlated


class RobustLine:
    """y = a + c·x + d·z fitted by weighted least squares with Huber weights (a step whose batch
    emptied for a while, or a burst's transient, does not drag the curve), over recent points whose
    weights decay by age; c, d >= 0 (a step does not shrink as the batch grows). The prior's
    pseudo-points do not decay: a slope the data never tested stays at the prior instead of
    drifting on noise, and any spread in the data outweighs them. The concave part is held to the
    prior's (0 unless given) by a ridge of the prior's weight: it moves only as far as points that
    the line cannot fit pull it."""

    def __init__(self, forget: float, max_points: int = 720):
        self.forget = forget
        self.points: deque = deque(maxlen=max_points)
        self._prior_xtx = np.zeros((3, 3))
        self._prior_xty = np.zeros(3)
        self._prior_w = 0.0
        self._cache = None

    def set_prior(self, xs, a: float, c: float, weight: float, d: float = 0.0) -> None:
        """Pseudo-points on the prior's curve at batches `xs` (z = ln x), and a ridge of `weight`
        holding the concave part at `d`."""
        self._prior_xtx = np.zeros((3, 3))
        self._prior_xty = np.zeros(3)
        for x in xs:
            row = np.array([1.0, x, math.log(max(x, 1.0))])
            y = a + c * x + d * row[2]
            self._prior_xtx += (weight / len(xs)) * np.outer(row, row)
            self._prior_xty += (weight / len(xs)) * row * y
        self._prior_xtx[2, 2] += weight
        self._prior_xty[2] += weight * d
        self._prior_w = float(weight)
        self._cache = None

    @property
    def has_prior(self) -> bool:
        return bool(self._prior_w)

    def add(self, x: float, y: float, w: float, step: int, z: float = 0.0) -> None:
        self.points.append((float(x), float(y), float(w), step, float(z)))
        self._cache = None

    def fit(self, now_step: int, floor_a: float = 0.0) -> Fit | None:
        """The fitted curve with standard errors, or None with neither data nor prior."""
        if self._cache is not None and self._cache[0] == now_step:
            return self._cache[1]
        if not self.points and not self.has_prior:
            return None
        if self.points:
            pts = np.array(self.points)
            design = np.column_stack([np.ones(len(pts)), pts[:, 0], pts[:, 4]])
            y = pts[:, 1]
            w = pts[:, 2] * self.forget ** (now_step - pts[:, 3])
        else:
            design, y, w = np.zeros((0, 3)), np.zeros(0), np.zeros(0)
        robust = np.ones(len(y))
        for _ in range(3):
            ww = w * robust
            xtx = self._prior_xtx + design.T @ (ww[:, None] * design)
            xty = self._prior_xty + design.T @ (ww * y)
            if xtx[0, 0] <= 0:
                return None
            coef = nonnegative_solve(xtx, xty, floor_a)
            if len(y) < 4:
                break
            resid = y - design @ coef
            scale = 1.4826 * float(np.median(np.abs(resid - np.median(resid)))) + 1e-12
            robust = np.minimum(1.0, 1.5 * scale / np.maximum(np.abs(resid), 1e-15))
        ww = w * robust
        a, c, d = (float(v) for v in coef)
        dof = max(float(ww.sum()) - 2.0, 1.0)
        s2 = float((ww * (y - design @ coef) ** 2).sum()) / dof if len(y) else (0.1 * max(a, 1e-9)) ** 2
        # Standard errors of the free coefficients; a slope the data cannot tell from zero (no
        # spread in the batch) reads its own size as its error.
        xtx = self._prior_xtx + design.T @ (ww[:, None] * design)
        cov = _inverse_or_none(xtx)
        if cov is None or xtx[1, 1] - xtx[0, 1] ** 2 / max(xtx[0, 0], 1e-300) <= 1e-12 * max(1.0, xtx[1, 1]):
            se = (math.sqrt(s2 / max(xtx[0, 0], 1e-300)), c, d)
        else:
            se = tuple(math.sqrt(max(0.0, s2 * cov[i, i])) for i in range(3))
        result = Fit(a, c, se[0], se[1], d, se[2], float(xtx[0, 1] / xtx[0, 0]))
        self._cache = (now_step, result)
        return result


def weighted_median(pts, forget: float, now: int) -> tuple[float, float]:
    """(exp of the weighted median, its upper one-sigma spread) of (log value, weight, step) points
    (rows) whose weights decay by age."""
    arr = np.asarray(pts, dtype=float)
    w = arr[:, 1] * forget ** (now - arr[:, 2])
    order = np.argsort(arr[:, 0])
    cum = np.cumsum(w[order]) / w.sum()

    def q(p):
        return float(arr[order, 0][min(len(cum) - 1, int(np.searchsorted(cum, p)))])
    median = q(0.5)
    return math.exp(median), max(0.0, q(0.84) - median)


def _inverse_or_none(m: np.ndarray):
    try:
        inv = np.linalg.inv(m)
    except np.linalg.LinAlgError:
        return None
    return inv if np.all(np.isfinite(inv)) else None


def nonnegative_solve(xtx: np.ndarray, xty: np.ndarray, floor_a: float) -> np.ndarray:
    """argmin of the quadratic (coef' X'WX coef − 2 coef' X'Wy) over a >= floor_a, c >= 0, d >= 0:
    the best of the solutions on each set of free coefficients that is feasible (three
    coefficients, so the active sets are few)."""
    best, best_obj = None, math.inf
    for free in ((0, 1, 2), (0, 1), (0, 2), (0,), (1, 2), (1,), (2,), ()):
        coef = np.zeros(3)
        fixed_a = 0 not in free
        if fixed_a:
            coef[0] = floor_a
        idx = list(free)
        if idx:
            rhs = xty[idx] - xtx[np.ix_(idx, [0])][:, 0] * coef[0]
            sub = xtx[np.ix_(idx, idx)]
            try:
                sol = np.linalg.solve(sub, rhs)
            except np.linalg.LinAlgError:
                continue
            if not np.all(np.isfinite(sol)):
                continue
            coef[idx] = sol
        if coef[0] < floor_a - 1e-15 or coef[1] < 0.0 or coef[2] < 0.0:
            continue
        obj = float(coef @ xtx @ coef - 2.0 * coef @ xty)
        if obj < best_obj - 1e-18:
            best, best_obj = coef, obj
    return best if best is not None else np.array([max(floor_a, 0.0), 0.0, 0.0])
