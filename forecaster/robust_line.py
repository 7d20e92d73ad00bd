"""A straight line y = a + c·x fitted robustly to points that age: the service-model learner's
decode step against the batch (forecaster/service_learn.py)."""

from __future__ import annotations

import math
from collections import deque

import numpy as np


class RobustLine:
    """y = a + c·x fitted by weighted least squares with Huber weights (a step whose batch emptied
    for a while, or a burst's transient, does not drag the line), over recent points whose weights
    decay by age. The prior's pseudo-points do not decay: a slope the data never tested stays at
    the prior instead of drifting on noise, and any spread in the data outweighs them."""

    def __init__(self, forget: float, max_points: int = 720):
        self.forget = forget
        self.points: deque = deque(maxlen=max_points)
        self.prior = np.zeros(5)   # sums of w, wx, wy, wxx, wxy of the pseudo-points
        self._cache = None

    def set_prior(self, xs, a: float, c: float, weight: float) -> None:
        self.prior = np.zeros(5)
        for x in xs:
            y = a + c * x
            self.prior += (weight / len(xs)) * np.array([1.0, x, y, x * x, x * y])
        self._cache = None

    @property
    def has_prior(self) -> bool:
        return bool(self.prior[0])

    def add(self, x: float, y: float, w: float, step: int) -> None:
        self.points.append((float(x), float(y), float(w), step))
        self._cache = None

    def fit(self, now_step: int, floor_a: float = 0.0):
        """(a, c, se_a, se_c), or None with neither data nor prior."""
        if self._cache is not None and self._cache[0] == now_step:
            return self._cache[1]
        if not self.points and not self.has_prior:
            return None
        if self.points:
            pts = np.array(self.points)
            x, y = pts[:, 0], pts[:, 1]
            w = pts[:, 2] * self.forget ** (now_step - pts[:, 3])
        else:
            x = y = w = np.zeros(0)
        pw, px, py, pxx, pxy = self.prior
        robust = np.ones(len(x))
        for _ in range(3):
            ww = w * robust
            sw, sx, sy = pw + ww.sum(), px + (ww * x).sum(), py + (ww * y).sum()
            sxx, sxy = pxx + (ww * x * x).sum(), pxy + (ww * x * y).sum()
            if sw <= 0:
                return None
            mx, my = sx / sw, sy / sw
            sxx_c = sxx - sw * mx * mx
            c = max(0.0, (sxy - sw * mx * my) / sxx_c) if sxx_c > 1e-12 * max(1.0, sxx) else 0.0
            a = max(floor_a, my - c * mx)
            if len(x) < 4:
                break
            resid = y - (a + c * x)
            scale = 1.4826 * float(np.median(np.abs(resid - np.median(resid)))) + 1e-12
            robust = np.minimum(1.0, 1.5 * scale / np.maximum(np.abs(resid), 1e-15))
        ww = w * robust
        dof = max(float(ww.sum()) - 2.0, 1.0)
        s2 = float((ww * (y - (a + c * x)) ** 2).sum()) / dof if len(x) else (0.1 * max(a, 1e-9)) ** 2
        identified = sxx_c > 1e-12 * max(1.0, sxx)
        se_c = math.sqrt(s2 / sxx_c) if identified else c
        se_a = math.sqrt(s2 * (1.0 / sw + (mx * mx / sxx_c if identified else 0.0)))
        result = (a, c, se_a, se_c)
        self._cache = (now_step, result)
        return result
