"""ServeGen client folders: `chunk-<client>-trace.csv`, no header, one 10-minute window a row.

Columns: window start (s from the trace start), rate (req/s), cv of the inter-arrival gaps, the
fitted inter-arrival distribution (`Gamma`/`Weibull`, empty = no traffic), shape, scale.
"""

from __future__ import annotations

import csv
from pathlib import Path

from tracefiles.records import ClientWindows, TraceError

SERVEGEN_WINDOW_S = 600.0
_FAMILIES = ("Gamma", "Weibull", "")


def _client_id(path: Path) -> int:
    try:
        return int(path.stem.split("-")[1])
    except (IndexError, ValueError):
        raise TraceError(f"{path}: expected a file named chunk-<client number>-trace.csv") from None


def _number(text: str) -> float:
    # An empty numeric cell only appears on no-traffic rows; it means 0 there.
    return float(text) if text.strip() else 0.0


def read_client(path: str | Path) -> ClientWindows:
    path = Path(path)
    cols: tuple[list, ...] = ([], [], [], [], [], [])
    try:
        fh = open(path, newline="")
    except OSError as exc:
        raise TraceError(f"{path}: cannot open the ServeGen client file ({exc.strerror})") from None
    with fh:
        for lineno, row in enumerate(csv.reader(fh), start=1):
            if not row:
                continue
            try:
                if len(row) < 6:
                    raise ValueError(f"{len(row)} columns, expected 6")
                start, rate, cv = float(row[0]), _number(row[1]), _number(row[2])
                dist = row[3].strip()
                if dist not in _FAMILIES:
                    raise ValueError(f"distribution {dist!r} is not Gamma, Weibull or empty")
                if rate < 0:
                    raise ValueError(f"negative rate {rate}")
                values = (start, rate, cv, dist, _number(row[4]), _number(row[5]))
            except ValueError as exc:
                raise TraceError(f"{path}:{lineno}: bad ServeGen row {row} ({exc})") from None
            for col, value in zip(cols, values):
                col.append(value)
    return ClientWindows(_client_id(path), *cols)


def read_servegen(folder: str | Path) -> list[ClientWindows]:
    """Every client of a ServeGen folder, in client-number order (the simulator's seeded draws
    depend on a stable order)."""
    folder = Path(folder)
    files = list(folder.glob("chunk-*-trace.csv")) if folder.is_dir() else []
    if not files:
        raise TraceError(f"{folder}: no chunk-<client>-trace.csv files; pass a ServeGen client folder")
    return [read_client(p) for p in sorted(files, key=_client_id)]
