"""Trace readers into interval series, standard library only (the simulator reuses the Azure reader).

- Azure LLM inference trace CSV: `TIMESTAMP,ContextTokens,GeneratedTokens`, one request a row,
  wall-clock timestamps with 100 ns resolution (7 fractional digits, which `datetime` does not
  parse, hence the hand-rolled parser).
- ServeGen client folder: `chunk-<client>-trace.csv`, no header, one 10-minute window a row:
  window start (s), rate (req/s), cv, distribution, shape, scale. The fleet is the sum of all
  clients' rates per window. At a finer step (15 s, 60 s) the counts are drawn, seeded: each
  client's rate is the window's (a step function, as the trace says nothing finer), and a
  renewal process with inter-arrival cv c has counts of variance ≈ λΔ·c² over Δ; the fleet's
  count per step is the sum, drawn as a normal of that mean and variance (thousands of requests
  a step: the central limit is exact enough). Synthetic noise on real rates: say so when used.
- Mooncake trace JSONL: one request a line, `timestamp` (ms from the start), `input_length`,
  `output_length`; arrivals and tokens per interval like the Azure reader.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

SERVEGEN_WINDOW_SECONDS = 600.0


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


def _parse_timestamp(text: str) -> float:
    """'2023-11-16 18:17:03.9799600' → POSIX seconds (UTC), keeping all fractional digits."""
    text = text.strip()
    main, _, frac = text.partition(".")
    base = datetime.strptime(main, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    return base + (float("0." + frac) if frac else 0.0)


def read_azure(path: str | Path) -> list[TraceRequest]:
    path = Path(path)
    with path.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:3]] != ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]:
            raise ValueError(f"{path}: expected an Azure trace header TIMESTAMP,ContextTokens,GeneratedTokens, got {header}")
        rows = [(_parse_timestamp(r[0]), int(r[1]), int(r[2])) for r in reader if r]
    if not rows:
        raise ValueError(f"{path}: no requests in the trace")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    return [TraceRequest(t - t0, i, o) for t, i, o in rows]


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
    files = sorted(folder.glob("chunk-*-trace.csv"))
    if not files:
        raise ValueError(f"{folder}: no chunk-<client>-trace.csv files; is this a ServeGen client folder?")
    factor = step_seconds / SERVEGEN_WINDOW_SECONDS
    if factor < 1 or abs(factor - round(factor)) > 1e-9:
        raise ValueError(f"ServeGen windows are {SERVEGEN_WINDOW_SECONDS:.0f} s; --resolution must be a multiple of it, got {step_seconds}")
    totals: dict[int, float] = {}
    for file in files:
        with file.open(newline="") as f:
            for row in csv.reader(f):
                if not row:
                    continue
                k = int(float(row[0]) // SERVEGEN_WINDOW_SECONDS)
                rate = float(row[1]) if row[1] else 0.0
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
    files = sorted(folder.glob("chunk-*-trace.csv"))
    if not files:
        raise ValueError(f"{folder}: no chunk-<client>-trace.csv files; is this a ServeGen client folder?")
    per_window = SERVEGEN_WINDOW_SECONDS / step_seconds
    if step_seconds <= 0 or abs(per_window - round(per_window)) > 1e-9:
        raise ValueError(f"a step finer than {SERVEGEN_WINDOW_SECONDS:.0f} s must divide it, got {step_seconds}")
    mean: dict[int, float] = {}
    var: dict[int, float] = {}
    for file in files:
        with file.open(newline="") as f:
            for row in csv.reader(f):
                if not row or not row[1]:
                    continue
                k = int(float(row[0]) // SERVEGEN_WINDOW_SECONDS)
                rate = float(row[1])
                cv = float(row[2]) if row[2] else 1.0
                mean[k] = mean.get(k, 0.0) + rate
                var[k] = var.get(k, 0.0) + rate * cv * cv
    n = max(mean) + 1
    m = np.repeat([mean.get(k, 0.0) for k in range(n)], int(round(per_window))) * step_seconds
    v = np.repeat([var.get(k, 0.0) for k in range(n)], int(round(per_window))) * step_seconds
    counts = np.maximum(0.0, np.random.default_rng(seed).normal(m, np.sqrt(v)))
    return IntervalSeries(f"{folder.name}_{step_seconds:g}s_drawn", step_seconds, (counts / step_seconds).tolist())


def mooncake_series(path: str | Path, step_seconds: float) -> IntervalSeries:
    """Requests and tokens per second in each interval of a Mooncake JSONL trace (ms timestamps)."""
    path = Path(path)
    rows = []
    with path.open() as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                rows.append((float(r["timestamp"]) / 1000.0, int(r["input_length"]), int(r["output_length"])))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not a Mooncake trace line with timestamp (ms), "
                                 f"input_length, output_length ({exc})") from None
    if not rows:
        raise ValueError(f"{path}: no requests in the trace")
    rows.sort()
    t0 = rows[0][0]
    requests = [TraceRequest(t - t0, i, o) for t, i, o in rows]
    return _binned(path.stem, requests, step_seconds)


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
