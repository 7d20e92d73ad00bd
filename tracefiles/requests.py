"""Per-request trace files: Azure CSV, Mooncake JSONL, BurstGPT CSV."""

from __future__ import annotations

import csv
import json
from datetime import datetime, timezone
from pathlib import Path

from tracefiles.records import TraceError, TraceRequest

MOONCAKE_BLOCK_TOKENS = 512
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")


def detect_format(path: str | Path) -> str:
    """"azure", "mooncake", "burstgpt" (files) or "servegen" (a folder of client CSVs)."""
    path = Path(path)
    if path.is_dir():
        return "servegen"
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file or folder")
    if path.name.lower().endswith(".jsonl"):
        return "mooncake"
    with open(path, newline="") as fh:
        header = fh.readline()
    if "ContextTokens" in header:
        return "azure"
    if "Request tokens" in header:
        return "burstgpt"
    raise TraceError(f"{path}: unknown trace format (expected an Azure CSV, a Mooncake JSONL, a BurstGPT CSV "
                     f"or a ServeGen client folder; header {header.strip()[:80]!r})")


def read_requests(path: str | Path, fmt: str | None = None) -> list[TraceRequest]:
    """Requests of a per-request trace, sorted by arrival, in seconds from the first request."""
    path = Path(path)
    fmt = fmt or detect_format(path)
    readers = {"azure": read_azure, "mooncake": read_mooncake, "burstgpt": read_burstgpt}
    if fmt not in readers:
        raise TraceError(f"{path}: {fmt!r} is not a per-request trace format; choose one of {sorted(readers)}")
    return readers[fmt](path)


def spread_ties(times: list[float]) -> list[float]:
    """Arrival times (ascending) with each group sharing one timestamp spread evenly up to the
    next timestamp; the last group keeps the mean gap of the others.

    Traces logged at a coarse resolution (the Mooncake traces at 3 s: 10 requests at 0 ms, 16 at
    3000 ms, ...) would otherwise replay as clumps that arrived together, which they did not."""
    distinct = sorted(set(times))
    if len(distinct) < 2:
        return list(times)
    mean_gap = (distinct[-1] - distinct[0]) / (len(distinct) - 1)
    nxt = {t: (distinct[i + 1] if i + 1 < len(distinct) else t + mean_gap) for i, t in enumerate(distinct)}
    out, i = [], 0
    while i < len(times):
        j = i
        while j < len(times) and times[j] == times[i]:
            j += 1
        t0, gap = times[i], nxt[times[i]] - times[i]
        out.extend(t0 + gap * (k - i) / (j - i) for k in range(i, j))
        i = j
    return out


def _rebased(path: Path, rows: list[TraceRequest]) -> list[TraceRequest]:
    if not rows:
        raise TraceError(f"{path}: the trace holds no requests")
    rows.sort(key=lambda r: r.arrival_s)
    t0 = rows[0].arrival_s
    return [TraceRequest(r.arrival_s - t0, r.input_tokens, r.output_tokens, r.hash_ids) for r in rows]


def _open(path: Path):
    try:
        return open(path, newline="")
    except OSError as exc:
        raise TraceError(f"{path}: cannot open the trace ({exc.strerror})") from None


def _check_header(path: Path, fieldnames: list[str] | None, need: tuple[str, ...], what: str) -> None:
    missing = [c for c in need if c not in (fieldnames or [])]
    if missing:
        raise TraceError(f"{path}:1: not {what}: header lacks {', '.join(missing)} (got {fieldnames})")


def _azure_timestamp(text: str) -> tuple[int, float]:
    """'2023-11-16 18:17:03.9799600' → (POSIX whole seconds (UTC), fraction). Seven fractional
    digits (100 ns) are more than `datetime` parses, and more than a float of ~1.7e9 s holds
    (its step is ~240 ns), so the whole seconds stay an int until the trace is re-based."""
    main, _, frac = text.strip().partition(".")
    base = datetime.strptime(main, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
    if frac and not frac.isdigit():
        raise ValueError(f"bad fractional seconds {frac!r}")
    return int(base.timestamp()), (float("0." + frac) if frac else 0.0)


def _count(text: str, column: str) -> int:
    n = int(text)
    if n < 0:
        raise ValueError(f"{column} is negative ({n})")
    return n


def read_azure(path: str | Path) -> list[TraceRequest]:
    """Azure LLM inference CSV: wall-clock `TIMESTAMP` (100 ns), `ContextTokens`, `GeneratedTokens`."""
    path = Path(path)
    stamps, rows = [], []
    with _open(path) as fh:
        reader = csv.DictReader(fh)
        _check_header(path, reader.fieldnames, AZURE_COLUMNS, "an Azure LLM trace CSV")
        for row in reader:
            try:
                stamps.append(_azure_timestamp(row["TIMESTAMP"]))
                rows.append((_count(row["ContextTokens"], "ContextTokens"), _count(row["GeneratedTokens"], "GeneratedTokens")))
            except (ValueError, TypeError, AttributeError) as exc:
                raise TraceError(f"{path}:{reader.line_num}: bad Azure row {list(row.values())} ({exc})") from None
    if not stamps:
        return _rebased(path, [])
    s0 = min(stamps)[0]
    return _rebased(path, [TraceRequest((s - s0) + f, n_in, n_out) for (s, f), (n_in, n_out) in zip(stamps, rows)])


def read_mooncake(path: str | Path) -> list[TraceRequest]:
    """Mooncake JSONL: `timestamp` (ms from the start), `input_length`, `output_length`, `hash_ids`."""
    path = Path(path)
    rows = []
    with _open(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                rows.append(TraceRequest(float(rec["timestamp"]) / 1000.0, _count(rec["input_length"], "input_length"),
                                         _count(rec["output_length"], "output_length"),
                                         tuple(int(h) for h in rec.get("hash_ids", ()))))
            except KeyError as exc:
                raise TraceError(f"{path}:{lineno}: bad Mooncake record (no {exc.args[0]!r} field)") from None
            except (ValueError, TypeError, AttributeError) as exc:
                raise TraceError(f"{path}:{lineno}: bad Mooncake record ({exc})") from None
    return _rebased(path, rows)


def read_burstgpt(path: str | Path) -> list[TraceRequest]:
    """BurstGPT CSV, timestamps in seconds. Failed requests record 0 response tokens; they were
    sent, so they are kept, with lengths raised to 1 (a request asks for at least one token)."""
    path = Path(path)
    rows = []
    with _open(path) as fh:
        reader = csv.DictReader(fh)
        _check_header(path, reader.fieldnames, BURSTGPT_COLUMNS, "a BurstGPT CSV")
        for row in reader:
            try:
                rows.append(TraceRequest(float(row["Timestamp"]), max(1, int(float(row["Request tokens"]))),
                                         max(1, int(float(row["Response tokens"])))))
            except (ValueError, TypeError) as exc:
                raise TraceError(f"{path}:{reader.line_num}: bad BurstGPT row ({exc})") from None
    return _rebased(path, rows)
