"""The prompt queue of one replica: how long a prompt waits before its prefill, and how clumped
the arrivals that queue are.

Prompts queue FIFO for prefill (forecaster/service_model.py counts each prompt's service time S).
With Poisson arrivals it is an M/G/1 queue; where requests arrive in clumps it is M^X/G/1 (clumps
of geometric size with the arrivals' index of dispersion I: mean (I + 1) / 2). How clumped the
arrivals are comes from the sidecars' per-window counters (goodput_requests_arrived_squared_total),
pooled here per forecast step (ArrivalClumping) and read at a prompt's mean service time
(dispersion_at). The learner inverts the same queue's mean on the TTFT it sees
(service_per_token).
"""

from __future__ import annotations

import math

import numpy as np

# The windows the sidecars count arrivals in (label window_seconds; sidecar/metrics.py
# ARRIVAL_WINDOWS, which a test holds equal to these).
ARRIVAL_WINDOWS_S = (0.1, 1.0, 10.0)
# Clumps are taken at most this many requests on average: the draws grow with them, and a replica
# that gets clumps of hundreds has no SLO to plan for.
MAX_CLUMP = 100.0
MAX_DISPERSION = 2.0 * MAX_CLUMP - 1.0


def queue_waits(lam: float, service: np.ndarray, rho: float, rng, scale: float = 1.0) -> np.ndarray:
    """Each sampled request's wait in an M/G/1 queue (arrivals at `lam`, service times drawn from
    `service`, load `rho`): the Pollaczek-Khinchine mean, a tail at the Cramér-Lundberg rate of
    this service mix, and the share that waits at all what keeps the mean. `scale` (at most 1)
    multiplies the mean by shrinking the share that waits, not a wait's length: what a router
    that pools the replicas' queues does (OnlineServiceModel.wait_scale)."""
    n = len(service)
    w_mean = scale * lam * float(np.mean(service ** 2)) / (2.0 * (1.0 - rho))
    waits = min(1.0, tail_decay(lam, service) * w_mean) if w_mean > 0 else 0.0
    busy = rng.random(n) < waits
    return np.where(busy, -np.log(np.maximum(1e-12, rng.random(n))) * (w_mean / max(waits, 1e-12)), 0.0)


def clumped_waits(lam: float, service: np.ndarray, rho: float, dispersion: float, rng,
                  scale: float = 1.0) -> tuple[np.ndarray, float]:
    """Waits when requests arrive in clumps (M^X/G/1): clumps arrive as a Poisson process at
    λ / E[X], X geometric with E[X] = (I + 1) / 2 (a compound Poisson process with index of
    dispersion I, at most MAX_DISPERSION). A request waits for the clumps before its own (the
    M/G/1 wait of a clump, whose service is its members' summed) and then behind the members of
    its clump ahead of it: a geometric count of mean E[X] − 1 = (I − 1) / 2. Returns the waits and
    the geometric's parameter 1 / E[X]."""
    n = len(service)
    p = 2.0 / (min(dispersion, MAX_DISPERSION) + 1.0)
    clump_service = random_sums(service, rng.geometric(p, n), rng)
    wait = queue_waits(lam * p, clump_service, rho, rng, scale)
    ahead = random_sums(service, rng.geometric(p, n) - 1, rng)
    return wait + ahead, p


def random_sums(values: np.ndarray, counts: np.ndarray, rng) -> np.ndarray:
    """For each count k, the sum of k values drawn at random from `values` (0 for k = 0)."""
    counts = np.asarray(counts, dtype=int)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(len(counts))
    draws = values[rng.integers(0, len(values), total)]
    ends = np.cumsum(counts)
    sums = np.concatenate([[0.0], np.cumsum(draws)])
    return sums[ends] - sums[ends - counts]


def tail_decay(lam: float, service: np.ndarray) -> float:
    """θ > 0 with λ(E[e^(θS)] − 1) = θ (stable queue: λE[S] < 1). In logs, the root of
    g(θ) = log E[e^(θS)] − log(1 + θ/λ), which is convex with g(0) = 0 and g'(0) = E[S] − 1/λ < 0,
    so Newton's method from any point above the root descends to it monotonically; no
    exponential overflows (log-sum-exp)."""
    s = np.asarray(service, dtype=float)
    log_n = math.log(len(s))

    def g_and_slope(theta: float) -> tuple[float, float]:
        x = theta * s
        w = np.exp(x - float(np.max(x)))
        total = float(np.sum(w))
        g = float(np.max(x)) + math.log(total) - log_n - math.log1p(theta / lam)
        return g, float(np.dot(w, s)) / total - 1.0 / (lam + theta)

    theta = 1.0 / max(float(np.mean(s)), 1e-12)
    g, slope = g_and_slope(theta)
    while g < 0:                        # not yet above the root
        theta *= 2.0
        g, slope = g_and_slope(theta)
    for _ in range(100):
        step = g / slope                # slope > 0 above the root
        theta -= step
        if step <= 1e-5 * theta:
            break
        g, slope = g_and_slope(theta)
    return theta


def dispersion_at(scale_s: float, by_window: dict[float, float]) -> float:
    """The index of dispersion at time scale `scale_s`, linear in log(window) between the windows
    measured ({window seconds: index}), held flat past the outermost; 1 (Poisson) when none is
    known, never under 1, and at most what clumps of MAX_CLUMP requests on average give."""
    known = sorted((w, i) for w, i in by_window.items() if w > 0 and math.isfinite(i))
    if not known:
        return 1.0
    x = math.log(max(scale_s, 1e-9))
    xs = [math.log(w) for w, _ in known]
    return min(MAX_DISPERSION, max(1.0, float(np.interp(x, xs, [i for _, i in known]))))


def service_per_token(ttft_mean: float, lam: float, m1: float, m2: float, dispersion: float = 1.0) -> float | None:
    """Invert the model's prefill queue: the per-token service time k at which an M^X/G/1 queue
    of prompts (service P·k, clumped arrivals at `lam` with index of dispersion I: Poisson at 1;
    clumped_waits) has mean TTFT = W + E[S] = `ttft_mean`. With
    M2 = m2 + (I − 1)·m1² (a clump's second moment per request) and g = (I + 1) / 2 (the request
    itself and the clump members ahead of it), TTFT(k) = lam·M2·k² / (2(1 − lam·m1·k)) + g·m1·k,
    increasing in k, so the root of (lam·M2 − 2·g·lam·m1²)·k² + 2·m1·(g + lam·T)·k − 2T = 0 in
    (0, 1 / (lam·m1))."""
    if not (ttft_mean > 0 and m1 > 0):
        return None
    g = (dispersion + 1.0) / 2.0
    a = lam * (m2 + (dispersion - 1.0) * m1 * m1) - 2.0 * g * lam * m1 * m1
    b = 2.0 * m1 * (g + lam * ttft_mean)
    c = -2.0 * ttft_mean
    if abs(a) < 1e-15:
        k = -c / b
    else:
        disc = b * b - 4 * a * c
        if disc < 0:
            return None
        k = (-b + math.sqrt(disc)) / (2 * a)
        if k <= 0:
            k = (-b - math.sqrt(disc)) / (2 * a)
    if lam > 0:
        k = min(k, 0.999 / (lam * m1))
    return k if k > 0 else None



class ArrivalClumping:
    """How clumped arrivals come, pooled over forecast steps with forgetting, per window of the
    sidecars' counters. In the R·dt / w windows of w seconds a step holds across R replicas,
    arrivals have mean n·w / (R·dt); Σ n_i² less the windows' count times that mean squared is
    their variance about it, times the windows' count: n for Poisson arrivals, more for clumps.
    The step's own mean is taken out, so a rate that moves between steps (the forecast's business)
    does not count as clumping; taking it out of the same counts costs one of the dt / w windows'
    worth (Poisson leaves n·(1 − w / dt), as a sample variance's n − 1), which is put back.
    Windows over a quarter of the step say too little and are left out."""

    def __init__(self, min_arrivals: float = 50.0):
        self.min_arrivals = min_arrivals
        self._excess: dict[float, float] = {}
        self._arrivals = 0.0

    def decay(self, factor: float) -> None:
        self._excess = {w: v * factor for w, v in self._excess.items()}
        self._arrivals *= factor

    def observe(self, squares: dict | None, arrivals: float | None, replicas: float, dt: float) -> None:
        """One step: {window seconds: Σ over the sidecars' windows of (arrivals in it)²} and the
        arrivals counted beside them."""
        if not squares or arrivals is None or arrivals <= 0:
            return
        for w, sq in squares.items():
            if w <= dt / 4.0:
                excess = sq - arrivals ** 2 * w / (replicas * dt)
                self._excess[w] = self._excess.get(w, 0.0) + excess / (1.0 - w / dt)
        self._arrivals += arrivals

    def by_window(self) -> dict[float, float]:
        """{window seconds: index of dispersion of one replica's arrivals in such windows}; empty
        until `min_arrivals` are counted beside the counters."""
        if self._arrivals < self.min_arrivals:
            return {}
        return {w: v / self._arrivals for w, v in self._excess.items()}

    def at(self, scale_s: float | None) -> float:
        """The index at time scale `scale_s` (the smallest window's while it is not known)."""
        by_window = self.by_window()
        if not by_window:
            return 1.0
        return dispersion_at(min(by_window) if scale_s is None else scale_s, by_window)


__all__ = ["ARRIVAL_WINDOWS_S", "ArrivalClumping", "MAX_CLUMP", "clumped_waits", "dispersion_at", "queue_waits",
           "random_sums", "service_per_token", "tail_decay"]
