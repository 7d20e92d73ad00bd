"""Traces as interval series for the backtests; the files are read by `tracefiles` (one reader
per format, shared with the load generator and the simulator).

- Azure LLM inference trace CSV: one request a row, counted into per-interval rates.
- ServeGen client folder: per-client 10-minute windows; the fleet is the sum of all clients'
  rates per window. At a finer step (15 s, 60 s) the counts are drawn, seeded: each client's rate
  is the window's (a step function, as the trace says nothing finer), and a renewal process with
  inter-arrival cv c has counts of variance ≈ λΔ·c² over Δ; the fleet's count per step is the
  sum, drawn as a normal of that mean and variance (thousands of requests a step: the central
  limit is exact enough). Synthetic noise on real rates: say so when used.
- Mooncake trace JSONL: one request a line; arrivals and tokens per interval like the Azure reader.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import tracefiles

SERVEGEN_WINDOW_SECONDS = tracefiles.SERVEGEN_WINDOW_S


@dataclass
class TraceRequest:
    t: float               # seconds since the first request
    input_tokens: int
    output_tokens: int


@dataclass
class IntervalSeries:
    """Per-interval rates (units per second) of one trace."""
    name: str
    step_seconds: float
    arrival_rate: list[float]
    input_token_rate: list[float] | None = None
    output_token_rate: list[float] | None = None


def read_azure(path: str | Path) -> list[TraceRequest]:
    """The Azure trace's requests, `t` in seconds from the first (reader: tracefiles.read_azure)."""
    return [TraceRequest(r.arrival_s, r.input_tokens, r.output_tokens) for r in tracefiles.read_azure(path)]


def azure_series(path: str | Path, step_seconds: float) -> IntervalSeries:
    """Requests and tokens per second in each `step_seconds` interval."""
    return _binned(Path(path).stem, read_azure(path), step_seconds)


def mooncake_series(path: str | Path, step_seconds: float) -> IntervalSeries:
    """Requests and tokens per second in each interval of a Mooncake JSONL trace (reader:
    tracefiles.read_mooncake)."""
    requests = [TraceRequest(r.arrival_s, r.input_tokens, r.output_tokens) for r in tracefiles.read_mooncake(path)]
    if not requests:
        raise ValueError(f"{path}: no requests in the trace")
    return _binned(Path(path).stem, requests, step_seconds)


def _binned(name: str, requests: list[TraceRequest], step_seconds: float) -> IntervalSeries:
    n = int(math.floor(requests[-1].t / step_seconds)) + 1
    arrivals, inputs, outputs = [0.0] * n, [0.0] * n, [0.0] * n
    for r in requests:
        k = int(r.t // step_seconds)
        arrivals[k] += 1
        inputs[k] += r.input_tokens
        outputs[k] += r.output_tokens
    # The last interval is cut short by the end of the trace: drop it rather than report a dip.
    if n > 1:
        arrivals, inputs, outputs = arrivals[:-1], inputs[:-1], outputs[:-1]
    scale = 1.0 / step_seconds
    return IntervalSeries(name, step_seconds, [a * scale for a in arrivals],
                          [x * scale for x in inputs], [x * scale for x in outputs])


def servegen_series(folder: str | Path, step_seconds: float = SERVEGEN_WINDOW_SECONDS) -> IntervalSeries:
    """All clients' rates summed per window; `step_seconds` a multiple of 600 averages windows."""
    folder = Path(folder)
    factor = step_seconds / SERVEGEN_WINDOW_SECONDS
    if factor < 1 or abs(factor - round(factor)) > 1e-9:
        raise ValueError(f"ServeGen windows are {SERVEGEN_WINDOW_SECONDS:.0f} s; --resolution must be a multiple of it, got {step_seconds}")
    totals: dict[int, float] = {}
    for client in tracefiles.read_servegen(folder):
        for start, rate in zip(client.window_start_s, client.rate):
            k = int(start // SERVEGEN_WINDOW_SECONDS)
            totals[k] = totals.get(k, 0.0) + rate
    n = max(totals) + 1
    per_window = [totals.get(k, 0.0) for k in range(n)]
    f = int(round(factor))
    rates = [sum(per_window[i:i + f]) / f for i in range(0, n - n % f, f)]
    return IntervalSeries(folder.name, step_seconds, rates)


def servegen_fine_series(folder: str | Path, step_seconds: float, seed: int = 0) -> IntervalSeries:
    """All clients summed at a step finer than the 10-minute windows (module docstring: the
    counts are drawn from each window's rate and inter-arrival cv, seeded)."""
    import numpy as np

    folder = Path(folder)
    per_window = SERVEGEN_WINDOW_SECONDS / step_seconds if step_seconds > 0 else 0.0
    if step_seconds <= 0 or abs(per_window - round(per_window)) > 1e-9:
        raise ValueError(f"a step finer than {SERVEGEN_WINDOW_SECONDS:.0f} s must divide it, got {step_seconds}")
    mean: dict[int, float] = {}
    var: dict[int, float] = {}
    for client in tracefiles.read_servegen(folder):
        for start, rate, cv in zip(client.window_start_s, client.rate, client.cv):
            if not (rate == rate and rate > 0):
                continue   # no traffic in the window (an empty rate reads as NaN)
            k = int(start // SERVEGEN_WINDOW_SECONDS)
            cv = cv if cv == cv and cv > 0 else 1.0
            mean[k] = mean.get(k, 0.0) + rate
            var[k] = var.get(k, 0.0) + rate * cv * cv
    n = max(mean) + 1
    m = np.repeat([mean.get(k, 0.0) for k in range(n)], int(round(per_window))) * step_seconds
    v = np.repeat([var.get(k, 0.0) for k in range(n)], int(round(per_window))) * step_seconds
    counts = np.maximum(0.0, np.random.default_rng(seed).normal(m, np.sqrt(v)))
    return IntervalSeries(f"{folder.name}_{step_seconds:g}s_drawn", step_seconds, (counts / step_seconds).tolist())


def load_series(path: str | Path, step_seconds: float | None = None) -> IntervalSeries:
    """An Azure CSV, a Mooncake JSONL or a ServeGen folder, as an interval series."""
    path = Path(path)
    if path.is_dir():
        if step_seconds is not None and step_seconds < SERVEGEN_WINDOW_SECONDS:
            return servegen_fine_series(path, step_seconds)
        return servegen_series(path, step_seconds or SERVEGEN_WINDOW_SECONDS)
    if path.is_file() and path.suffix == ".jsonl":
        return mooncake_series(path, step_seconds or 60.0)
    if path.is_file():
        return azure_series(path, step_seconds or 60.0)
    raise ValueError(f"no trace at {path}: pass an Azure trace CSV, a Mooncake JSONL or a ServeGen client folder")
