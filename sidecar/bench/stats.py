"""Statistics for `goodput bench sidecar`: paired differences and bootstrap confidence intervals.

Added TTFT is measured per request: the arm and the direct path are loaded with the same
arrival schedule, so request i through the arm is compared with request i sent directly, and
the quantiles are taken of those differences (not the difference of two quantiles, which goes
negative when the two tails happen to differ). Intervals are percentile bootstraps over
requests (2,000 resamples for TTFT). Inter-chunk gaps are compared as quantiles of each arm's
gaps, with a cluster bootstrap that resamples whole requests, since gaps within a stream are
not independent.
"""

from __future__ import annotations

import numpy as np

CI = 0.95


def quantile(values, q: float) -> float | None:
    arr = np.asarray(values, dtype=float)
    return float(np.quantile(arr, q)) if arr.size else None


def paired_differences(arm: dict[int, float], direct: dict[int, float]) -> list[float]:
    """arm[i] - direct[i] for every request index both completed."""
    return [arm[i] - direct[i] for i in sorted(arm.keys() & direct.keys())]


def bootstrap_quantile(values, q: float, resamples: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """A 95 % percentile-bootstrap interval for the q-quantile of `values`."""
    arr = np.asarray(values, dtype=float)
    if arr.size < 2:
        return None
    rng = np.random.default_rng(seed)
    stats = np.empty(resamples)
    chunk = max(1, 4_000_000 // arr.size)     # resamples per batch: bounded memory
    for lo in range(0, resamples, chunk):
        n = min(chunk, resamples - lo)
        stats[lo:lo + n] = np.quantile(arr[rng.integers(0, arr.size, (n, arr.size))], q, axis=1)
    tail = (1 - CI) / 2
    return float(np.quantile(stats, tail)), float(np.quantile(stats, 1 - tail))


def _padded(streams: list[list[float]]) -> np.ndarray:
    width = max((len(s) for s in streams), default=0)
    out = np.full((len(streams), width), np.nan)
    for i, s in enumerate(streams):
        out[i, :len(s)] = s
    return out


def gap_quantile_difference(arm: list[list[float]], direct: list[list[float]], q: float, resamples: int = 300,
                            seed: int = 0) -> tuple[float | None, tuple[float, float] | None]:
    """q-quantile of the arm's inter-chunk gaps minus the direct path's, and a 95 % interval from a
    cluster bootstrap (whole streams resampled, both sides independently)."""
    a, d = _padded([s for s in arm if s]), _padded([s for s in direct if s])
    if not a.size or not d.size:
        return None, None
    point = float(np.nanquantile(a, q) - np.nanquantile(d, q))
    if len(a) < 2 or len(d) < 2:
        return point, None
    rng = np.random.default_rng(seed)
    stats = np.empty(resamples)
    for k in range(resamples):
        ra = a[rng.integers(0, len(a), len(a))]
        rd = d[rng.integers(0, len(d), len(d))]
        stats[k] = np.nanquantile(ra, q) - np.nanquantile(rd, q)
    tail = (1 - CI) / 2
    return point, (float(np.quantile(stats, tail)), float(np.quantile(stats, 1 - tail)))
