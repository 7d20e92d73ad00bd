"""Traces as interval series for the backtests; the files are read by `tracefiles` (one reader
per format, shared with the load generator and the simulator).

- Azure LLM inference trace CSV: one request a row, counted into per-interval rates.
- ServeGen client folder: per-client 10-minute windows; the fleet is the sum of all clients'
  rates per window.
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
    requests = read_azure(path)
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
    return IntervalSeries(Path(path).stem, step_seconds, [a * scale for a in arrivals],
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


def load_series(path: str | Path, step_seconds: float | None = None) -> IntervalSeries:
    """An Azure CSV file or a ServeGen folder, as an interval series."""
    path = Path(path)
    if path.is_dir():
        return servegen_series(path, step_seconds or SERVEGEN_WINDOW_SECONDS)
    if path.is_file():
        return azure_series(path, step_seconds or 60.0)
    raise ValueError(f"no trace at {path}: pass an Azure trace CSV or a ServeGen client folder")
