"""The replicas recurring bursts shorter than the cold start need (forecaster/policy.py's burst
floor): a replica ordered when such a burst begins serves after it has ended, so only capacity
already there serves it.

Over the last five cold starts, the arrival rate averaged over the tightest TTFT objective (a
request can wait that long, no longer, so a burst's excess cannot be spread wider; at least one
step, the finest the forecaster sees). A burst is a run of those means above both the Poisson
noise around their median (the highest of all the memory's windows, not of one: see burst_floor)
and halfway from the median to the rate that the SLO's objective ratio of the *requests* arrived
at or under (weighted by requests: a burst step carries many). With two or more bursts, each
shorter than the cold start, the floor is the fewest replicas that leave at most the SLO's error
budget (1 − ratio) of those requests beyond capacity. A level shift (one long run) or a lone
burst holds nothing: the forecast follows those.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np


def burst_floor(y: np.ndarray, mu: float, step_s: float, cold_start_s: float, window_steps: int,
                ratio: float) -> int:
    """Replicas (each serving `mu` requests/s within the SLO) the recent recurring bursts of the
    per-step arrival rates `y` need; 0 when there are none."""
    found = _bursts(y, step_s, cold_start_s, window_steps, ratio)
    if found is None or mu <= 0:
        return 0
    means, runs = found
    cold_steps = max(1, math.ceil(cold_start_s / step_s))
    w = max(1, int(window_steps))
    if len(runs) < 2 or int(runs.max()) + w - 1 > cold_steps:
        return 0
    return shortfall_replicas(means, mu, 1.0 - ratio)


def burst_in_memory(y: np.ndarray, step_s: float, cold_start_s: float, window_steps: int, ratio: float) -> bool:
    """Whether any window of the burst floor's memory stands out as a burst (recurring or not,
    shorter than the cold start or not): arrivals then queue beyond what their rate says."""
    found = _bursts(y, step_s, cold_start_s, window_steps, ratio)
    return found is not None and len(found[1]) > 0


def _bursts(y: np.ndarray, step_s: float, cold_start_s: float, window_steps: int,
            ratio: float) -> tuple[np.ndarray, np.ndarray] | None:
    """(the memory's rolling means, the lengths of its runs above the burst line), or None while
    the memory is shorter than two windows."""
    memory = max(2, math.ceil(5 * max(cold_start_s, step_s) / step_s))
    w = max(1, int(window_steps))
    recent = np.asarray(y[-memory:], dtype=float)
    if len(recent) < 2 * w:
        return None
    means = np.convolve(recent, np.ones(w) / w, mode="valid")
    high = request_quantile(means, ratio)
    median = float(np.median(means))
    # Poisson variation around the level is not a burst: the service model already prices it. A
    # burst stands out beyond what the highest of the memory's windows reaches under Poisson
    # arrivals at the level with the objective ratio's probability: the count's quantile at
    # 1 − (1 − ratio) / windows (a union bound over the windows; one window's quantile alone is
    # crossed by chance somewhere in the memory, and pure Poisson arrivals at 40 req/s in 15-s
    # steps read as recurring bursts in 25 of 200 memories, at 200 req/s in 5-s steps in 104).
    # Exact, not normal (at a few requests a window the normal approximation reads noise as
    # bursts), the level being at most the median count + ln 2 (a Poisson mean's bound from its median).
    window_s = w * step_s
    level = max(median, 0.0) * window_s + math.log(2.0)
    noise_top = poisson_quantile(1.0 - (1.0 - ratio) / len(means), level) / window_s
    above = means > max((median + high) / 2.0, noise_top)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], above.astype(np.int8), [0]])))
    return means, edges[1::2] - edges[::2]              # run lengths, in steps of the rolling means


def poisson_quantile(q: float, mean: float) -> float:
    """The smallest count k with P(N <= k) >= q for N ~ Poisson(mean) (normal beyond 500)."""
    if mean <= 0:
        return 0.0
    if mean > 500:
        return mean + NormalDist().inv_cdf(q) * math.sqrt(mean)
    k, pmf = 0, math.exp(-mean)
    cdf = pmf
    while cdf < q and k < 10_000:
        k += 1
        pmf *= mean / k
        cdf += pmf
    return float(k)


def shortfall_replicas(rates: np.ndarray, mu: float, budget: float) -> int:
    """The fewest replicas (each serving `mu` requests/s within the SLO) at which the requests
    arriving beyond capacity, Σ max(0, r_k − N·μ), stay within `budget` of all that arrived: the
    SLO's error budget spent on the excess of the bursts, not on every request of a busy step."""
    rates = np.clip(np.asarray(rates, dtype=float), 0.0, None)
    total = float(rates.sum())
    if total <= 0 or mu <= 0:
        return 0
    lo, hi = 0, max(1, math.ceil(float(rates.max()) / mu - 1e-9))
    while lo < hi:
        mid = (lo + hi) // 2
        if float(np.clip(rates - mid * mu, 0.0, None).sum()) <= budget * total + 1e-12:
            hi = mid
        else:
            lo = mid + 1
    return lo


def request_quantile(rates: np.ndarray, q: float) -> float:
    """The rate at or under which a share `q` of the requests arrived, given per-step rates
    (each step weighted by the requests it carried)."""
    rates = np.asarray(rates, dtype=float)
    if len(rates) == 0:
        return 0.0
    total = float(np.clip(rates, 0.0, None).sum())
    if total <= 0:
        return 0.0
    order = np.sort(np.clip(rates, 0.0, None))
    cum = np.cumsum(order) / total
    return float(order[min(len(order) - 1, int(np.searchsorted(cum, q - 1e-12)))])
