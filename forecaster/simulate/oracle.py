"""The oracle: knows every future arrival, orders replicas exactly one cold start ahead.

Required replicas at second k: the work (replica-seconds, ServiceProfile.request_work_s) arriving
in any window of w seconds must be done within w + the TTFT objective, so for every window
covering second k, N >= work / (w + ttft). Windows of 1 s to 5 min catch bursts and sustained
load alike. The oracle's deployment size at t is the largest requirement over [t, t + cold start]:
replicas ordered at t serve from t + cold start, and one that will be needed again within a cold
start is kept rather than re-ordered. `headroom` multiplies the requirement; run_oracle_search()
picks the smallest of a few that reaches the attainment target, so the oracle is the cheapest
clairvoyant plan that meets it: the cost floor.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

WINDOWS_S = (1, 2, 5, 15, 60, 300)
HEADROOMS = (1.0, 1.1, 1.25, 1.5, 2.0, 3.0)


def _rolling_max_covering(x: np.ndarray, w: int) -> np.ndarray:
    """out[k] = max of x[j] for window starts j in [k - w + 1, k] (the windows that cover k)."""
    padded = np.concatenate([np.full(w - 1, -np.inf), x])
    return sliding_window_view(padded, w).max(axis=1)


def required_replicas(work_per_s: np.ndarray, ttft_s: float, headroom: float = 1.0,
                      windows_s=WINDOWS_S) -> np.ndarray:
    """Replicas needed at each second (float, before rounding up) to serve `work_per_s`."""
    n = len(work_per_s)
    need = np.zeros(n)
    cum = np.concatenate([[0.0], np.cumsum(work_per_s)])
    for w in windows_s:
        if w > n:
            continue
        window_work = cum[w:] - cum[:-w]            # work arriving in [j, j + w)
        per_start = window_work / (w + ttft_s)
        cover = _rolling_max_covering(per_start, w)  # len n - w + 1 ... pad to n
        full = np.concatenate([cover, np.full(n - len(cover), cover[-1] if len(cover) else 0.0)])
        need = np.maximum(need, full)
    return need * headroom


def oracle_plan(required: np.ndarray, cold_start_s: float, min_replicas: int, max_replicas: int) -> np.ndarray:
    """Deployment size at each second: the largest rounded-up requirement over [t, t + cold start]."""
    req = np.clip(np.ceil(required - 1e-9), min_replicas, max_replicas).astype(np.int64)
    c = int(math.ceil(cold_start_s)) + 1
    padded = np.concatenate([req, np.full(c - 1, req[-1] if len(req) else min_replicas)])
    return sliding_window_view(padded, c).max(axis=1)[: len(req)]


class Oracle:
    """Direct control (no HPA, no metric delay): sets the deployment size from the plan each second."""

    name = "oracle"

    def __init__(self, plan: np.ndarray, headroom: float):
        self.plan = plan
        self.headroom = headroom
        self.published: list[tuple[float, float]] = []

    def hpa_spec(self):
        return None

    def desired_at(self, t: float) -> int:
        k = min(max(int(t), 0), len(self.plan) - 1)
        return int(self.plan[k])

    def observe(self, view, history) -> None:
        pass

    def close(self) -> None:
        pass
