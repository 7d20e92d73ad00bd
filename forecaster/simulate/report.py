"""Outputs of a simulation: comparison table (text and markdown), JSON, and PNG plots."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

COLUMNS = [
    ("policy", "policy", "{}"),
    ("attainment", "SLO attainment", "{:.2%}"),
    ("goodput_rps", "goodput req/s", "{:.2f}"),
    ("replica_minutes", "replica-min", "{:.0f}"),
    ("vs_oracle", "cost vs oracle", "{:.2f}x"),
    ("scale_events", "scale events", "{}"),
    ("underprovisioned_s", "under-prov. s", "{:.0f}"),
    ("mean_replicas", "mean repl.", "{:.1f}"),
    ("peak_replicas", "peak", "{}"),
    ("ttft_p99_s", "TTFT p99 s", "{:.2f}"),
    ("tpot_p99_s", "TPOT p99 s", "{:.3f}"),
    ("note", "note", "{}"),
]


def rows(results: list[dict]) -> list[dict]:
    """Results with `vs_oracle` (replica-minutes over the oracle's) added where an oracle ran."""
    oracle = next((r for r in results if r["policy"] == "oracle"), None)
    out = []
    for r in results:
        row = dict(r)
        row["vs_oracle"] = r["replica_minutes"] / oracle["replica_minutes"] if oracle and oracle["replica_minutes"] else math.nan
        out.append(row)
    return out


def _cells(row: dict) -> list[str]:
    cells = []
    for key, _, fmt in COLUMNS:
        value = row.get(key, "")
        cells.append("-" if isinstance(value, float) and math.isnan(value) else fmt.format(value))
    return cells


def markdown_table(results: list[dict]) -> str:
    header = "| " + " | ".join(title for _, title, _ in COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in COLUMNS) + "|"
    lines = [header, rule] + ["| " + " | ".join(_cells(r)) + " |" for r in rows(results)]
    return "\n".join(lines)


def text_table(results: list[dict]) -> str:
    table = [[title for _, title, _ in COLUMNS]] + [_cells(r) for r in rows(results)]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in table)


def write_json(path: Path, setup: dict, results: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"setup": setup, "results": rows(results)}, indent=2, sort_keys=True, default=float) + "\n")


def plot(path: Path, title: str, series: dict[str, dict], bin_s: int = 60) -> None:
    """One figure: demand on top, then replicas (spec + draining, and the oracle's requirement), then queue."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(12, 9), sharex=True)
    first = next(iter(series.values()))
    scale, unit = (3600.0, "hours") if first["t"][-1] > 4 * 3600 else (60.0, "minutes")

    def binned(t, y, how=np.mean):
        k = (t // bin_s).astype(int)
        n = k.max() + 1
        if how is np.sum:
            return np.arange(n) * bin_s / scale, np.bincount(k, weights=y, minlength=n)
        sums = np.bincount(k, weights=y, minlength=n)
        return np.arange(n) * bin_s / scale, sums / np.maximum(np.bincount(k, minlength=n), 1)

    x, demand = binned(first["t"], first["arrivals"], np.sum)
    axes[0].plot(x, demand / bin_s, color="black", lw=1)
    axes[0].set_ylabel(f"arrivals req/s ({bin_s} s mean)")
    x, req = binned(first["t"], first["required"])
    axes[1].plot(x, req, color="black", lw=1, ls=":", label="required (demand)")
    for name, s in series.items():
        x, cost = binned(s["t"], s["spec"] + s["draining"])
        axes[1].plot(x, cost, lw=1.2, label=name)
        x, q = binned(s["t"], s["waiting"])
        axes[2].plot(x, q, lw=1.0, label=name)
    axes[1].set_ylabel("replicas (incl. starting, draining)")
    axes[2].set_ylabel("requests waiting")
    axes[2].set_yscale("symlog", linthresh=10)
    axes[2].set_xlabel(unit)
    axes[1].legend(fontsize=8, ncol=4)
    axes[0].set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
