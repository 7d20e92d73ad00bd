"""Traces the simulator replays: per-request (Azure CSV, Mooncake JSONL, BurstGPT CSV) and per-client
rates (ServeGen folder).

The files are read by `tracefiles` (one reader per format, shared with the load generator and
the backtests); this module turns the records into arrays and draws arrivals.

- Per-request traces, one record per request (Azure LLM inference CSV: TIMESTAMP, ContextTokens,
  GeneratedTokens; Mooncake JSONL: timestamp in ms, input_length, output_length; BurstGPT CSV):
  here they become arrays, optionally scaled.
- ServeGen client folder (chunk-<client>-trace.csv, no header: window start s, rate req/s, cv,
  distribution Gamma|Weibull, shape, scale): per client and 10-minute window, the rate and the
  fitted inter-arrival distribution. servegen_requests() draws the arrivals inside each window
  from each client's fitted distribution, rescaled so its mean gap is 1/rate (the fitted scale and the published rate
  disagree for some Weibull rows; the rate is what the trace counts, the shape keeps the burstiness),
  starting at a random phase, with a fixed seed; the clients are summed. (forecaster/traces.py
  sums the clients' rates per window; the simulator needs the arrivals themselves.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import tracefiles

SERVEGEN_WINDOW_S = tracefiles.SERVEGEN_WINDOW_S


@dataclass(frozen=True)
class RequestTrace:
    """Requests sorted by arrival: seconds from the first one, prompt and output tokens."""

    name: str
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if len(self.prompt_tokens) != n or len(self.output_tokens) != n:
            raise ValueError("arrival_s, prompt_tokens and output_tokens must have the same length")

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1]) if len(self.arrival_s) else 0.0

    def __len__(self) -> int:
        return len(self.arrival_s)


def read_azure_csv(path: str | Path, rate_scale: float = 1.0, seed: int = 0) -> RequestTrace:
    """Read an Azure trace (tracefiles.read_azure; a bad file raises its TraceError, a
    ValueError naming the file and line); `rate_scale` != 1 replays each request that many
    times (see scale_requests)."""
    return read_request_trace(path, rate_scale, seed, fmt="azure")


def read_request_trace(path: str | Path, rate_scale: float = 1.0, seed: int = 0, fmt: str | None = None) -> RequestTrace:
    """Read any per-request trace tracefiles knows (Azure CSV, Mooncake JSONL, BurstGPT CSV; the
    format from the file unless `fmt` names it) into arrays, requests sharing a timestamp spread
    evenly to the next one (tracefiles.spread_ties); `rate_scale` as in read_azure_csv."""
    path = Path(path)
    requests = tracefiles.read_requests(path, fmt)
    trace = RequestTrace(
        name=path.stem,
        # A trace logged at a coarse resolution (Mooncake's at 3 s) has requests sharing a
        # timestamp; they arrived spread over the interval, not in one clump.
        arrival_s=np.array(tracefiles.spread_ties([r.arrival_s for r in requests]), dtype=float),
        prompt_tokens=np.array([r.input_tokens for r in requests], dtype=np.int64),
        output_tokens=np.maximum(1, np.array([r.output_tokens for r in requests], dtype=np.int64)),
    )
    return scale_requests(trace, rate_scale, seed) if rate_scale != 1.0 else trace


def scale_requests(trace: RequestTrace, rate_scale: float, seed: int = 0) -> RequestTrace:
    """Each request replayed floor(k) times (plus once more with probability frac(k)), each copy at
    its own time jittered uniformly within +-0.5 s: the trace's minute-scale shape and bursts are
    kept, only multiplied (as if k times as many users behaved alike)."""
    if rate_scale <= 0:
        raise ValueError(f"rate scale must be > 0, got {rate_scale}")
    rng = np.random.default_rng(seed)
    n = len(trace)
    copies = np.full(n, int(math.floor(rate_scale)))
    copies += rng.random(n) < (rate_scale - math.floor(rate_scale))
    idx = np.repeat(np.arange(n), copies)
    t = trace.arrival_s[idx] + rng.uniform(-0.5, 0.5, len(idx))
    t -= t.min()
    order = np.argsort(t, kind="stable")
    return RequestTrace(f"{trace.name}x{rate_scale:g}", t[order], trace.prompt_tokens[idx][order], trace.output_tokens[idx][order])


def _mean_gap(dist: str, shape: float, scale: float) -> float:
    if dist == "Gamma":
        return shape * scale
    return scale * math.gamma(1.0 + 1.0 / shape)  # Weibull


def _window_arrivals(rng: np.random.Generator, dist: str, shape: float, rate: float, window_s: float) -> np.ndarray:
    """Arrival offsets in [0, window_s) with gaps from the fitted family, mean gap 1/rate."""
    scale = (1.0 / rate) / _mean_gap(dist, shape, 1.0)
    expected = rate * window_s
    times: list[np.ndarray] = []
    # Random phase: the first arrival falls at a uniform point of a first gap.
    start = -rng.random() * _draw(rng, dist, shape, scale, 1)[0]
    total = start
    while total < window_s:
        gaps = _draw(rng, dist, shape, scale, int(expected * 1.2) + 16)
        cum = total + np.cumsum(gaps)
        times.append(cum)
        total = cum[-1]
    t = np.concatenate(times)
    return t[(t >= 0) & (t < window_s)]


def _draw(rng: np.random.Generator, dist: str, shape: float, scale: float, n: int) -> np.ndarray:
    if dist == "Gamma":
        return rng.gamma(shape, scale, n)
    return scale * rng.weibull(shape, n)


def servegen_requests(folder: str | Path, lengths: RequestTrace, start_s: float, duration_s: float,
                      rate_scale: float = 1.0, seed: int = 0) -> RequestTrace:
    """A per-request slice of the summed ServeGen clients (every arrival drawn, see the module
    docstring), with prompt/output lengths drawn (with replacement) from `lengths` (ServeGen's language files
    carry rates only, no lengths)."""
    folder = Path(folder)
    clients = tracefiles.read_servegen(folder)
    if duration_s <= 0:
        raise ValueError(f"a ServeGen slice needs --duration > 0 seconds, got {duration_s}")
    rng = np.random.default_rng(seed)
    first = int(start_s // SERVEGEN_WINDOW_S)
    last = int(math.ceil((start_s + duration_s) / SERVEGEN_WINDOW_S))
    times: list[np.ndarray] = []
    for client in clients:
        for start, rate, dist, shape in zip(client.window_start_s, client.rate, client.distribution, client.shape):
            w = int(start // SERVEGEN_WINDOW_S)
            rate *= rate_scale
            if dist and first <= w < last and rate > 0:
                t = _window_arrivals(rng, dist, shape, rate, SERVEGEN_WINDOW_S)
                times.append(t + (w - first) * SERVEGEN_WINDOW_S)
    if not times:
        raise ValueError(f"{folder}: no arrivals between {start_s} s and {start_s + duration_s} s")
    t = np.sort(np.concatenate(times))
    t = t[t < duration_s]
    pick = rng.integers(0, len(lengths), len(t))
    return RequestTrace(f"servegen-{folder.name}@{start_s / 3600:g}h+{duration_s / 3600:g}h"
                        + (f"x{rate_scale:g}" if rate_scale != 1 else ""),
                        t, lengths.prompt_tokens[pick], lengths.output_tokens[pick])
