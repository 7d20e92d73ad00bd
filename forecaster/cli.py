"""`goodput forecast backtest` and `goodput forecaster run`.

Heavy imports (numpy, statsmodels, the server) happen inside the command functions.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from goodput_cli.errors import UsageError

DEFAULT_MODELS = "selected,level,naive,seasonal_naive,holt_winters,arima,linear"


def _model_names(text: str, flag: str, also: tuple[str, ...] = ()) -> list[str]:
    """A comma-separated list of model names (blanks dropped), each a known model or one of `also`."""
    from forecaster.models import MODELS

    names = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS and m not in also]
    if unknown:
        raise UsageError(f"unknown {flag} {unknown}; choose from {','.join((*also, *sorted(MODELS)))}")
    return names


def _floats(text: str, flag: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated numbers, e.g. 1,3,5,10; got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise UsageError(f"{flag} needs positive numbers, got {text!r}")
    return values


def run_backtest(args: argparse.Namespace) -> int:
    import numpy as np
    from rich.console import Console
    from rich.progress import Progress

    from forecaster.backtest import backtest, markdown_table, plot_forecasts, summary_table, timing_benchmark
    from forecaster.traces import load_series

    console = Console(stderr=True)
    horizons = _floats(args.horizons, "--horizons")
    models = _model_names(args.models, "--models", also=("selected",))
    candidates = _model_names(args.selected_candidates, "--selected-candidates")
    try:
        series = load_series(args.trace, args.resolution)
    except (ValueError, OSError) as exc:
        raise UsageError(str(exc)) from None
    y = np.asarray(series.arrival_rate)
    step = series.step_seconds
    season = round(86400 / step) if len(y) >= 3 * 86400 / step else None
    out = Path(args.out or f"backtest-{series.name}")
    out.mkdir(parents=True, exist_ok=True)
    console.print(f"{series.name}: {len(y)} points at {step:g} s, mean {y.mean():.2f} req/s, "
                  f"season {season or 'none'} steps; {len(models)} models × up to {args.origins} origins")
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("backtest", total=len(models) * args.origins)
        try:
            result = backtest(y, step, horizons, models, num_origins=args.origins, season_steps=season,
                              max_window=args.max_window, plot_horizon_minutes=args.plot_horizon,
                              reselect_minutes=args.reselect_minutes,
                              selected_candidates=candidates,
                              progress=lambda: progress.advance(task))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    result.trace = series.name
    table = summary_table(result) + "\n\nAll models:\n\n" + markdown_table(result)
    print(table)
    data = result.to_json()
    if args.timing_points:
        # Fit+predict on a day of history at the server's step, as the server does every step.
        day = _timing_series(y, step, args.timing_points)
        steps = max(1, round(args.timing_horizon / args.timing_step))
        timing = timing_benchmark(day, steps, models, repeats=args.timing_repeats)
        data["timing"] = {"points": len(day), "step_seconds": args.timing_step, "horizon_steps": steps,
                          "source": f"{series.name} rates, Poisson arrivals per {args.timing_step:g} s (seeded)",
                          "models": timing}
        print(f"\nfit+predict on {len(day)} points ({args.timing_step:g} s steps), {steps}-step horizon:")
        for name, t in timing.items():
            print(f"  {name:15s} p50 {t['p50_ms']:8.1f} ms   p95 {t['p95_ms']:8.1f} ms")
    (out / "backtest.json").write_text(json.dumps(data, indent=2, sort_keys=True))
    (out / "backtest.md").write_text(f"# Backtest: {series.name}, {step:g} s steps\n\n{table}\n")
    plot_path = out / f"{series.name}.png"
    plot_forecasts(result, y, plot_path)
    console.print(f"wrote {out / 'backtest.json'}, {out / 'backtest.md'}, {plot_path}")
    return 0


def _timing_series(y, step: float, points: int):
    """A `points`-long series at 15 s built from the trace's own rates (repeated to fill the day),
    with Poisson counts: the shape and noise of real arrivals at the server's resolution."""
    import numpy as np
    rng = np.random.default_rng(0)
    per_step = max(1, int(round(step / 15.0)))
    rates = np.repeat(y, per_step)
    rates = np.resize(rates, points)
    return rng.poisson(rates * 15.0) / 15.0


def register(registry) -> None:
    p = registry.command("forecast backtest", "forecast accuracy on a trace", run_backtest)
    p.add_argument("--trace", required=True, help="Azure trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens), "
                   "a Mooncake trace JSONL (timestamp ms) or a ServeGen client folder (rates summed over clients; "
                   "a --resolution under 600 s draws the counts from each window's rate and cv, seeded)")
    p.add_argument("--resolution", type=float, default=None,
                   help="seconds per interval (default 60 for Azure and Mooncake, 600 for ServeGen)")
    p.add_argument("--horizons", default="1,3,5,10", help="forecast horizons in minutes (default 1,3,5,10); "
                   "a horizon shorter than the resolution is one step")
    p.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated (default {DEFAULT_MODELS})")
    p.add_argument("--origins", type=int, default=200, help="rolling origins evaluated (default 200)")
    p.add_argument("--max-window", type=int, default=None, help="fit on at most this many points before each origin")
    p.add_argument("--reselect-minutes", type=float, default=60.0,
                   help="trace minutes between model re-selections of 'selected' (default 60; the server: 5)")
    p.add_argument("--selected-candidates", default="",
                   help="fitted candidates 'selected' scores against its built-in pool, as the server's --models "
                        "(default none: the pool alone; the timing run stays the pool's, as the server refits "
                        "its candidates in a background thread)")
    p.add_argument("--plot-horizon", type=float, default=5.0, help="horizon (minutes) drawn in the PNG (default 5)")
    p.add_argument("--timing-points", type=int, default=5760,
                   help="also time fit+predict on a history this long (default 5760 = 24 h at 15 s; 0 = skip)")
    p.add_argument("--timing-step", type=float, default=15.0, help=argparse.SUPPRESS)
    p.add_argument("--timing-horizon", type=float, default=180.0, help="horizon (s) for the timing run (default 180)")
    p.add_argument("--timing-repeats", type=int, default=30, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help="folder for backtest.json, backtest.md and the PNG")

    from forecaster.run_cli import add_replay_command, add_run_command
    add_run_command(registry)
    add_replay_command(registry)
