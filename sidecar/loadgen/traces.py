"""Readers for real request traces, and the transforms a replay needs (window, speed-up, fit).

Formats:
- Azure LLM inference (Splitwise): CSV `TIMESTAMP,ContextTokens,GeneratedTokens`, wall-clock
  timestamps with 100 ns resolution.
- Mooncake (FAST'25): JSONL `timestamp` (ms), `input_length`, `output_length`, `hash_ids`
  (512-token prefix blocks; equal ids are the same prefix content).
- BurstGPT: CSV `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`,
  timestamps in seconds; failed requests have 0 response tokens and are kept (they were sent).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from sidecar.loadgen.workload import PlannedRequest

MOONCAKE_BLOCK_TOKENS = 512


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file and line."""


def detect_format(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".jsonl"):
        return "mooncake"
    with open(path, newline="") as fh:
        header = fh.readline()
    if "ContextTokens" in header:
        return "azure"
    if "Request tokens" in header:
        return "burstgpt"
    raise TraceError(f"{path}: unknown trace format (expected Azure CSV, Mooncake JSONL or BurstGPT CSV; header {header.strip()[:80]!r})")


def read_trace(path: str | Path, fmt: str | None = None) -> list[PlannedRequest]:
    """Requests of a trace with arrivals in seconds from its first request, sorted by arrival."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    fmt = fmt or detect_format(path)
    readers = {"azure": _read_azure, "mooncake": _read_mooncake, "burstgpt": _read_burstgpt}
    if fmt not in readers:
        raise TraceError(f"unknown trace format {fmt!r}; choose one of {sorted(readers)}")
    requests = readers[fmt](path)
    if not requests:
        raise TraceError(f"{path}: the trace holds no requests")
    requests.sort(key=lambda r: r.arrival)
    t0 = requests[0].arrival
    return [replace(r, arrival=r.arrival - t0) for r in requests]


def _read_azure(path: Path) -> list[PlannedRequest]:
    out = []
    with open(path, newline="") as fh:
        for lineno, row in enumerate(csv.DictReader(fh), start=2):
            try:
                # Seven fractional digits (100 ns) are more than datetime parses: keep microseconds.
                stamp = row["TIMESTAMP"].strip()
                if "." in stamp:
                    head, frac = stamp.split(".", 1)
                    stamp = f"{head}.{frac[:6]}"
                t = datetime.fromisoformat(stamp).timestamp()
                out.append(PlannedRequest(t, int(row["ContextTokens"]), int(row["GeneratedTokens"])))
            except (KeyError, ValueError, TypeError) as exc:
                raise TraceError(f"{path}:{lineno}: bad Azure row ({exc})") from None
    return out


def _read_mooncake(path: Path) -> list[PlannedRequest]:
    out = []
    with open(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                out.append(PlannedRequest(rec["timestamp"] / 1000.0, int(rec["input_length"]),
                                          int(rec["output_length"]), tuple(int(h) for h in rec.get("hash_ids", ()))))
            except (KeyError, ValueError, TypeError) as exc:
                raise TraceError(f"{path}:{lineno}: bad Mooncake record ({exc})") from None
    return out


def _read_burstgpt(path: Path) -> list[PlannedRequest]:
    out = []
    with open(path, newline="") as fh:
        for lineno, row in enumerate(csv.DictReader(fh), start=2):
            try:
                out.append(PlannedRequest(float(row["Timestamp"]), max(1, int(float(row["Request tokens"]))),
                                          max(1, int(float(row["Response tokens"])))))
            except (KeyError, ValueError, TypeError) as exc:
                raise TraceError(f"{path}:{lineno}: bad BurstGPT row ({exc})") from None
    return out


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
