"""Summaries of `goodput bench sidecar` runs: the JSON document and the table on stdout."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field

from sidecar.bench.stats import bootstrap_quantile, gap_quantile_difference, paired_differences, quantile

# The targets (#16).
TARGET_ADDED_TTFT_P50_MS = 0.3
TARGET_ADDED_TTFT_P99_MS = 1.0
TARGET_CPU_RATIO = 1.3           # sidecar CPU per relayed token over the bare relay's
TARGET_CPU_PER_REQUEST_US = 150.0
TARGET_RATE_RATIO = 0.95
TARGET_LITELLM_FACTOR = 10.0

# Arms with no process of their own: the direct path, and the same run again as an A/A control.
_NO_PROCESS = ("direct", "direct-again")


@dataclass
class Run:
    """One measured run: one arm, one scenario, one repeat (one arrival schedule)."""

    scenario: str
    arm: str
    repeat: int
    records: list[list[float]] = field(repr=False)   # [index, ttft, gap, gap, ...] per completed request
    scheduled: int
    errors: int
    unfinished: int
    tokens: int
    elapsed: float
    cpu_arm: float = 0.0          # seconds of CPU of the arm's process(es) over the run (0 for direct)
    cpu_upstream: float = 0.0
    cpu_client: float = 0.0
    loadavg_1m: float = 0.0       # at the end of the run
    worst_send_lag: float = 0.0   # how late the client sent its most delayed request
    first_error: str | None = None  # the client's first failure in this run, if any


def _ms(x):
    return None if x is None else x * 1e3


def _ms_pair(pair):
    return None if pair is None else [pair[0] * 1e3, pair[1] * 1e3]


def _cell(runs: list[Run], direct: list[Run] | None, arm: str) -> dict:
    ttfts = [r[1] for run in runs for r in run.records]
    gaps = [g for run in runs for r in run.records for g in r[2:]]
    requests = sum(len(run.records) for run in runs)
    tokens = sum(run.tokens for run in runs)
    elapsed = sum(run.elapsed for run in runs)
    cpu = sum(run.cpu_arm for run in runs)
    out = {
        "requests": requests, "scheduled": sum(run.scheduled for run in runs),
        "errors": sum(run.errors for run in runs), "unfinished": sum(run.unfinished for run in runs),
        "tokens": tokens, "tokens_per_s": tokens / elapsed if elapsed else None,
        "ttft_p50_ms": _ms(quantile(ttfts, 0.5)), "ttft_p99_ms": _ms(quantile(ttfts, 0.99)),
        "gap_p50_ms": _ms(quantile(gaps, 0.5)), "gap_p99_ms": _ms(quantile(gaps, 0.99)),
        "cpu_us_per_request": 1e6 * cpu / requests if requests and arm not in _NO_PROCESS else None,
        "cpu_us_per_token": 1e6 * cpu / tokens if tokens and arm not in _NO_PROCESS else None,
        "cpu_us_per_token_upstream": 1e6 * sum(r.cpu_upstream for r in runs) / tokens if tokens else None,
        "cpu_us_per_token_client": 1e6 * sum(r.cpu_client for r in runs) / tokens if tokens else None,
        "loadavg_1m": [min(r.loadavg_1m for r in runs), max(r.loadavg_1m for r in runs)],
        "worst_send_lag_ms": 1e3 * max(r.worst_send_lag for r in runs),
        "repeats": len(runs),
        "first_error": next((r.first_error for r in runs if r.first_error), None),
    }
    if direct is not None and arm != "direct":
        diffs = []
        for run in runs:
            base = next((d for d in direct if d.repeat == run.repeat), None)
            if base is not None:
                diffs += paired_differences({r[0]: r[1] for r in run.records}, {r[0]: r[1] for r in base.records})
        arm_streams = [r[2:] for run in runs for r in run.records]
        direct_streams = [r[2:] for run in direct for r in run.records]
        g50, g50_ci = gap_quantile_difference(arm_streams, direct_streams, 0.5)
        g99, g99_ci = gap_quantile_difference(arm_streams, direct_streams, 0.99)
        direct_rate = sum(d.tokens for d in direct) / sum(d.elapsed for d in direct) if direct else None
        out.update({
            "paired_requests": len(diffs),
            "added_ttft_p50_ms": _ms(quantile(diffs, 0.5)), "added_ttft_p50_ci_ms": _ms_pair(bootstrap_quantile(diffs, 0.5)),
            "added_ttft_p99_ms": _ms(quantile(diffs, 0.99)), "added_ttft_p99_ci_ms": _ms_pair(bootstrap_quantile(diffs, 0.99)),
            "added_gap_p50_ms": _ms(g50), "added_gap_p50_ci_ms": _ms_pair(g50_ci),
            "added_gap_p99_ms": _ms(g99), "added_gap_p99_ci_ms": _ms_pair(g99_ci),
            "rate_vs_direct": out["tokens_per_s"] / direct_rate if direct_rate and out["tokens_per_s"] else None,
        })
    # Past its knee an arm leaves requests unanswered at the deadline or fails them.
    out["saturated"] = out["unfinished"] > 0 or out["errors"] > 0.02 * max(1, out["scheduled"] or requests)
    return out


def summarise(runs: list[Run], scenarios: dict, settings: dict, missing: dict[str, str], cores: str) -> dict:
    by: dict[str, dict[str, list[Run]]] = {}
    for run in runs:
        by.setdefault(run.scenario, {}).setdefault(run.arm, []).append(run)
    results = {}
    for name, arms in by.items():
        direct = arms.get("direct")
        results[name] = {arm: _cell(rs, direct, arm) for arm, rs in arms.items()}
        relay = results[name].get("relay", {}).get("cpu_us_per_token")
        for arm, cell in results[name].items():
            cell["cpu_per_token_vs_relay"] = (cell["cpu_us_per_token"] / relay
                                              if relay and cell.get("cpu_us_per_token") is not None else None)
    return {
        "benchmark": "goodput bench sidecar",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "pinning": cores},
        "settings": settings,
        "scenarios": scenarios,
        "missing_arms": missing,
        "results": results,
        "targets": targets(results, scenarios),
    }


def _check(value, target: float, op: str, ci=None) -> dict:
    """`met` judges the point estimate. With its 95 % interval `ci`, `settled` says whether the
    whole interval lies on that side of the target (False: it reaches across, so another run may
    read the other way)."""
    def holds(x):
        return x < target if op == "<" else x <= target if op == "<=" else x >= target

    met = None if value is None else holds(value)
    out = {"value": value, "target": f"{op} {target:g}", "met": met}
    if met is not None and ci:
        out["ci"] = list(ci)
        out["settled"] = holds(ci[0]) == holds(ci[1]) == met
    return out


def targets(results: dict, scenarios: dict) -> dict:
    """Each of the issue's targets with its value and verdict; `scenarios` as described in the
    JSON (a scenario whose responses are one token each is judged by its CPU per request)."""
    out = {}
    for name in ("paced16", "paced64"):
        side = results.get(name, {}).get("sidecar")
        if side is None:
            continue
        again = results[name].get("direct-again")
        for q, target in (("p50", TARGET_ADDED_TTFT_P50_MS), ("p99", TARGET_ADDED_TTFT_P99_MS)):
            key = f"added_ttft_{q}_ms"
            check = _check(side.get(key), target, "<", side.get(f"added_ttft_{q}_ci_ms"))
            if again is not None and again.get(key) is not None:
                # What the method reads when nothing is added: a target under it cannot be told
                # apart from the measurement's own spread on this machine.
                check["floor"] = {"value": again[key], "ci": again.get(f"added_ttft_{q}_ci_ms")}
            out[f"{name}: sidecar added TTFT {q} ms"] = check
        lite = results[name].get("litellm")
        if lite is not None:
            out[f"{name}: LiteLLM added TTFT p50 / sidecar's"] = _check(
                _factor(lite.get("added_ttft_p50_ms"), side.get("added_ttft_p50_ms")), TARGET_LITELLM_FACTOR, ">=")
            out[f"{name}: LiteLLM CPU per token / sidecar's"] = _check(
                _factor(lite.get("cpu_us_per_token"), side.get("cpu_us_per_token")), TARGET_LITELLM_FACTOR, ">=")
    for name, arms in results.items():
        side = arms.get("sidecar")
        if side is None:
            continue
        if scenarios.get(name, {}).get("tokens") == 1:
            out[f"{name}: sidecar CPU per request µs"] = _check(side.get("cpu_us_per_request"), TARGET_CPU_PER_REQUEST_US, "<=")
            continue
        out[f"{name}: sidecar CPU per token / relay's"] = _check(side.get("cpu_per_token_vs_relay"), TARGET_CPU_RATIO, "<=")
        if name in ("paced64", "fast64"):
            out[f"{name}: sidecar token rate / direct"] = _check(side.get("rate_vs_direct"), TARGET_RATE_RATIO, ">=")
    return out


def _factor(theirs, ours):
    """How many times `theirs` is `ours`; an added cost of ours at or below zero is infinitely smaller."""
    if theirs is None or ours is None:
        return None
    if ours <= 0:
        return float("inf") if theirs > 0 else None
    return theirs / ours


def _f(value, fmt="{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def _ci(cell: dict, key: str) -> str:
    value, ci = cell.get(key), cell.get(key.replace("_ms", "_ci_ms"))
    if value is None:
        return "-"
    return f"{value:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else f"{value:.2f}"


def print_table(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    console.print(f"pinning: {doc['machine']['pinning']}")
    for name, arms in doc["results"].items():
        sc = doc["scenarios"].get(name, {})
        table = Table(title=f"{name}: {sc.get('description', '')}", title_justify="left")
        for col in ("arm", "done", "TTFT p50", "TTFT p99", "added TTFT p50 [95% CI]", "added TTFT p99 [95% CI]",
                    "added gap p50", "added gap p99", "tok/s", "vs direct", "CPU µs/req", "CPU µs/tok", "vs relay",
                    "load 1m"):
            table.add_column(col, justify="right")
        for arm, c in arms.items():
            done = f"{c['requests']}/{c['scheduled'] or c['requests']}" + (" SAT" if c["saturated"] else "")
            table.add_row(arm, done, _f(c["ttft_p50_ms"]), _f(c["ttft_p99_ms"]), _ci(c, "added_ttft_p50_ms"),
                          _ci(c, "added_ttft_p99_ms"), _f(c.get("added_gap_p50_ms"), "{:.3f}"),
                          _f(c.get("added_gap_p99_ms"), "{:.3f}"), _f(c["tokens_per_s"], "{:.0f}"),
                          _f(c.get("rate_vs_direct"), "{:.1%}"), _f(c["cpu_us_per_request"], "{:.0f}"),
                          _f(c["cpu_us_per_token"], "{:.1f}"), _f(c.get("cpu_per_token_vs_relay"), "{:.2f}x"),
                          f"{c['loadavg_1m'][0]:.2f}-{c['loadavg_1m'][1]:.2f}")
        console.print(table)
        for arm, c in arms.items():
            if c.get("errors"):
                console.print(f"  {arm}: {c['errors']} failed, the first: {c.get('first_error') or 'unknown'}")
    sink = doc.get("otlp_sink")
    if sink is not None:
        served = sum(c.get("requests", 0) or 0 for arms in doc["results"].values() for a, c in arms.items()
                     if a == "sidecar-otlp")
        console.print(f"sidecar-otlp exported {sink.get('spans', 0)} spans in {sink.get('trace_posts', 0)} posts and "
                      f"{sink.get('metric_posts', 0)} metric posts ({sink.get('bytes', 0)} bytes) to the OTLP receiver; "
                      f"it served {served} measured requests and a second of warm-up per stack")
    for arm, why in doc["missing_arms"].items():
        console.print(f"arm {arm} missing: {why}")
    console.print("(times in ms: TTFT from the scheduled send; added = through the arm minus direct, per request "
                  "of the same schedule; direct-again = the direct path run again as an arm, so its added figures are "
                  "the method's own floor; SAT = requests unfinished or failing: past the arm's knee)")
    for name, check in doc["targets"].items():
        console.print(f"  {name}: {_f(check['value'], '{:.3f}')} (target {check['target']}) {verdict(check)}")


def verdict(check: dict) -> str:
    """"met" / "NOT met" / "n/a", and where the 95 % interval reaches across the target, that it does."""
    mark = "met" if check["met"] else ("NOT met" if check["met"] is False else "n/a")
    if check.get("settled") is False:
        lo, hi = check["ci"]
        mark += f" (its 95 % interval [{lo:.3f}, {hi:.3f}] reaches across the target: not settled by this run)"
    floor = check.get("floor")
    if floor is not None:
        ci = floor.get("ci")
        mark += f"; the method's floor, direct against direct: {floor['value']:.3f}" + \
            (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
    return mark
