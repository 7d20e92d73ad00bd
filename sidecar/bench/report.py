"""Summaries of `goodput bench sidecar` runs: the JSON document and the table on stdout."""

from __future__ import annotations

import os
import platform
import statistics
from dataclasses import dataclass, field

PATHS = ("direct", "relay", "sidecar")

# The targets.
TARGET_ADDED_TTFT_P50_MS = 0.5
TARGET_ADDED_TTFT_P99_MS = 2.0
TARGET_CPU_RATIO = 1.5
TARGET_RATE_RATIO = 0.9


@dataclass
class Run:
    upstream: str
    path: str
    concurrency: int
    repeat: int
    tokens: int
    requests: int
    errors: int
    elapsed: float
    ttft: list[float] = field(repr=False)
    cpu_upstream: float = 0.0     # seconds of CPU over the run
    cpu_middle: float = 0.0       # the relay's or the sidecar's (0 for direct)
    cpu_client: float = 0.0


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _cell(runs: list[Run]) -> dict:
    ttfts = [t for r in runs for t in r.ttft]
    tokens = sum(r.tokens for r in runs)

    def per_token_us(attr: str) -> float | None:
        return 1e6 * sum(getattr(r, attr) for r in runs) / tokens if tokens else None

    p50, p99 = _pct(ttfts, 0.5), _pct(ttfts, 0.99)
    return {
        "tokens_per_s": statistics.fmean(r.tokens / r.elapsed for r in runs),
        "ttft_p50_ms": p50 * 1e3 if p50 is not None else None,
        "ttft_p99_ms": p99 * 1e3 if p99 is not None else None,
        "ttft_samples": len(ttfts),
        "requests": sum(r.requests for r in runs),
        "errors": sum(r.errors for r in runs),
        "tokens": tokens,
        "cpu_us_per_token_middle": per_token_us("cpu_middle"),
        "cpu_us_per_token_upstream": per_token_us("cpu_upstream"),
        "cpu_us_per_token_client": per_token_us("cpu_client"),
        "repeats": len(runs),
    }


def _diff(a, b):
    return None if a is None or b is None else a - b


def _ratio(a, b):
    return None if a is None or not b else a / b


def summarise(runs: list[Run], duration: float, tokens: int, loadavg: tuple | None = None) -> dict:
    cells: dict = {}
    for r in runs:
        cells.setdefault(r.upstream, {}).setdefault(str(r.concurrency), {}).setdefault(r.path, []).append(r)
    results = {u: {c: {p: _cell(rs) for p, rs in by_path.items()} for c, by_path in by_c.items()} for u, by_c in cells.items()}
    comparisons = {}
    for u, by_c in results.items():
        for c, cell in by_c.items():
            d, rl, sc = cell["direct"], cell["relay"], cell["sidecar"]
            comparisons.setdefault(u, {})[c] = {
                "sidecar_added_ttft_p50_ms": _diff(sc["ttft_p50_ms"], d["ttft_p50_ms"]),
                "sidecar_added_ttft_p99_ms": _diff(sc["ttft_p99_ms"], d["ttft_p99_ms"]),
                "relay_added_ttft_p50_ms": _diff(rl["ttft_p50_ms"], d["ttft_p50_ms"]),
                "relay_added_ttft_p99_ms": _diff(rl["ttft_p99_ms"], d["ttft_p99_ms"]),
                "sidecar_over_relay_cpu_per_token": _ratio(sc["cpu_us_per_token_middle"], rl["cpu_us_per_token_middle"]),
                "sidecar_over_direct_token_rate": _ratio(sc["tokens_per_s"], d["tokens_per_s"]),
                "relay_over_direct_token_rate": _ratio(rl["tokens_per_s"], d["tokens_per_s"]),
            }
    return {
        "benchmark": "goodput bench sidecar",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    # 1-minute load average before and after: other work on a shared machine skews every figure.
                    "loadavg_1m_before_after": list(loadavg) if loadavg else None},
        "settings": {"duration_s": duration, "tokens_per_request": tokens, "upstreams": {
            "paced": "first token after 5 ms, then one every 5 ms per stream", "fast": "tokens as fast as the loop allows"}},
        "results": results,
        "comparisons": comparisons,
        "targets": _targets(comparisons),
    }


def _targets(comparisons: dict) -> dict:
    out = {}
    paced = comparisons.get("paced", {})
    if "16" in paced:
        c = paced["16"]
        out["added_ttft_p50_ms_at_16_under_0.5"] = _check(c["sidecar_added_ttft_p50_ms"], TARGET_ADDED_TTFT_P50_MS, "<")
        out["added_ttft_p99_ms_at_16_under_2"] = _check(c["sidecar_added_ttft_p99_ms"], TARGET_ADDED_TTFT_P99_MS, "<")
    for u, by_c in comparisons.items():
        for level, c in by_c.items():
            out[f"cpu_per_token_ratio_{u}_{level}_within_1.5x"] = _check(c["sidecar_over_relay_cpu_per_token"], TARGET_CPU_RATIO, "<=")
        if "64" in by_c:
            out[f"token_rate_ratio_{u}_64_at_least_0.9"] = _check(by_c["64"]["sidecar_over_direct_token_rate"], TARGET_RATE_RATIO, ">=")
    return out


def _check(value, target, op) -> dict:
    met = None if value is None else (value < target if op == "<" else value <= target if op == "<=" else value >= target)
    return {"value": value, "target": f"{op} {target}", "met": met}


def _f(value, fmt="{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def print_table(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="goodput bench sidecar (CPU µs per relayed token; TTFT ms as the client saw it)")
    for col in ("upstream", "streams", "path", "tokens/s", "TTFT p50", "TTFT p99", "added p50", "added p99",
                "CPU/tok middle", "CPU/tok upstream", "rate vs direct"):
        table.add_column(col, justify="right")
    for u, by_c in doc["results"].items():
        for c, cell in by_c.items():
            comp = doc["comparisons"][u][c]
            for p in PATHS:
                x = cell[p]
                added = (comp.get(f"{p}_added_ttft_p50_ms"), comp.get(f"{p}_added_ttft_p99_ms")) if p != "direct" else (None, None)
                rate = comp.get(f"{p}_over_direct_token_rate") if p != "direct" else None
                table.add_row(u, c, p, _f(x["tokens_per_s"], "{:.0f}"), _f(x["ttft_p50_ms"]), _f(x["ttft_p99_ms"]),
                              _f(added[0]), _f(added[1]), _f(x["cpu_us_per_token_middle"] if p != "direct" else None, "{:.1f}"),
                              _f(x["cpu_us_per_token_upstream"], "{:.1f}"), _f(rate, "{:.0%}"))
    Console(width=170).print(table)
    for name, check in doc["targets"].items():
        mark = "met" if check["met"] else ("not met" if check["met"] is False else "n/a")
        print(f"  {name}: {_f(check['value'], '{:.3f}')} (target {check['target']}) {mark}")
