"""Real request traces as a load run's `PlannedRequest`s, and the transforms a replay needs
(ties spread, window, speed-up, fit).

The files are read by `tracefiles` (one reader per format, shared with the backtests and the
simulator): Azure LLM inference CSV, Mooncake JSONL (with its 512-token prefix `hash_ids`) and
BurstGPT CSV.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import tracefiles
from sidecar.loadgen.workload import PlannedRequest

MOONCAKE_BLOCK_TOKENS = tracefiles.MOONCAKE_BLOCK_TOKENS
# A ValueError whose message names the file and line; callers catch it to print a usage error.
TraceError = tracefiles.TraceError


def read_trace(path: str | Path, fmt: str | None = None) -> list[PlannedRequest]:
    """Requests of a trace with arrivals in seconds from its first request, sorted by arrival."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    return [PlannedRequest(r.arrival_s, r.input_tokens, r.output_tokens, r.hash_ids)
            for r in tracefiles.read_requests(path, fmt)]


def spread_ties(requests: list[PlannedRequest]) -> list[PlannedRequest]:
    """Requests sharing one timestamp spread evenly up to the next timestamp (tracefiles.spread_ties:
    a trace logged at 3 s would otherwise replay as clumps that arrived together)."""
    ordered = sorted(requests, key=lambda r: r.arrival)
    times = tracefiles.spread_ties([r.arrival for r in ordered])
    return [replace(r, arrival=t) for r, t in zip(ordered, times)]


@dataclass(frozen=True)
class FitReport:
    """What `fit_to_model` changed, so the summary can say so."""

    scale: float
    requests_scaled: int
    block_tokens: int


def window(requests: list[PlannedRequest], start: float = 0.0, duration: float | None = None,
           speedup: float = 1.0, limit: int | None = None) -> list[PlannedRequest]:
    """Requests with start <= arrival < start+duration, re-based to 0 and compressed by `speedup`."""
    if speedup <= 0:
        raise ValueError(f"speedup must be > 0, got {speedup}")
    end = float("inf") if duration is None else start + duration
    picked = [r for r in requests if start <= r.arrival < end]
    if limit is not None:
        picked = picked[:limit]
    return [replace(r, arrival=(r.arrival - start) / speedup) for r in picked]


def fit_to_model(requests: list[PlannedRequest], max_model_len: int, max_input: int | None = None,
                 max_output: int | None = None, scale: float | None = None) -> tuple[list[PlannedRequest], FitReport]:
    """Scale lengths so every request fits the model's context (and optional caps).

    One factor for all input lengths keeps the trace's shape and prefix structure: Mooncake's
    512-token blocks become `block_tokens`-token blocks, so shared prefixes stay shared. By
    default the factor makes the longest prompt fit; a fixed `scale` instead keeps blocks at a
    chosen size (say 32 tokens, two KV blocks) and truncates the few prompts still too long,
    from the end, so their shared prefixes survive. Output lengths are capped (not scaled) at
    `max_output`, and so that input + output fits the context.
    """
    max_output = max_output or max_model_len // 4
    cap_in = min(max_input or max_model_len, max_model_len - 1)
    if scale is None:
        biggest = max(r.input_tokens for r in requests)
        scale = min(1.0, (cap_in - 1) / biggest) if biggest > cap_in - 1 else 1.0
    elif not 0 < scale <= 1:
        raise ValueError(f"length scale must be in (0, 1], got {scale}")
    block = max(1, int(MOONCAKE_BLOCK_TOKENS * scale))
    out, changed = [], 0
    for r in requests:
        n_in = r.input_tokens if scale == 1.0 else max(1, int(r.input_tokens * scale))
        if r.hash_ids and scale != 1.0:
            n_in = min(n_in, len(r.hash_ids) * block)
        n_in = min(n_in, cap_in - 1)
        n_out = max(1, min(r.output_tokens, max_output, max_model_len - n_in))
        if (n_in, n_out) != (r.input_tokens, r.output_tokens):
            changed += 1
        out.append(replace(r, input_tokens=n_in, output_tokens=n_out))
    return out, FitReport(scale, changed, block)
