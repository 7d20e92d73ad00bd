"""Rolling-origin backtest of the model zoo on an interval series.

At each origin o (evenly spaced over the series once `min_train` points exist) every model is
fitted on the points before o (at most `max_window` of them) and forecasts the horizons; errors
are kept per horizon. "selected" is the forecaster's own path: a ModelSelector that re-chooses
among its candidates by a rolling-origin backtest on the recent history every `reselect_minutes`
minutes of trace time (forecaster/selection.py), as the server does every `refit_every_seconds`
(300 s by default; the backtest's default is an hour, to keep runs short on small machines).

Scores: MASE (mean absolute error over the mean absolute one-step naive change of the whole
series — the same scale for every model, so ratios between models are exact), sMAPE (%, 0/0 = 0),
coverage of the central prediction interval (with the 95 % interval this run can know it to,
`coverage_interval`), fit and predict times (p50/p95, ms), and for the
window peak (the max of the series over steps 1..h, what a replica ordered now must absorb) the
pinball loss at `peak_quantile` (0.9) of each model's peak quantile (`selected`: forecast_window's
calibrated peak_upper; the others: the highest per-step upper bound of their own interval over
the window, the usual stand-in) and how often the peak stayed under it.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from forecaster.models import make_model
from forecaster.selection import ModelSelector

BASELINES = ("naive", "seasonal_naive", "holt_winters", "arima", "linear")
# The anchors' own predictors: ARIMA (NVIDIA Dynamo's planner), Holt-Winters and linear
# regression (predictive-horizontal-pod-autoscaler).
ANCHORS = ("holt_winters", "arima", "linear")


@dataclass
class ModelScore:
    model: str
    horizon_minutes: float
    horizon_steps: int
    mase: float
    smape: float
    coverage: float
    num_origins: int
    fit_ms_p50: float
    fit_ms_p95: float
    predict_ms_p50: float
    predict_ms_p95: float
    peak_pinball: float = float("nan")   # req/s, at peak_quantile
    peak_coverage: float = float("nan")  # share of windows whose peak stayed under the quantile
    # 95 % interval of `coverage` (coverage_interval): how well this run can know it at all
    coverage_low: float = float("nan")
    coverage_high: float = float("nan")


@dataclass
class BacktestResult:
    trace: str
    step_seconds: float
    num_points: int
    season_steps: int | None
    scores: list[ModelScore]
    # per model: origins, and forecasts at the plotted horizon (for the forecast-vs-actual plot)
    plot: dict = field(default_factory=dict)
    selected_candidates: tuple[str, ...] = ()   # the fitted models `selected`'s selectors held beside the pool

    def to_json(self) -> dict:
        return {"trace": self.trace, "step_seconds": self.step_seconds, "num_points": self.num_points,
                "season_steps": self.season_steps, "selected_candidates": list(self.selected_candidates),
                "scores": [asdict(s) for s in self.scores]}


def coverage_interval(hits: int, origins: int, horizon_steps: int, spacing: float) -> tuple[float, float]:
    """95 % Wilson interval of a coverage of `hits` in `origins`, counted on the independent
    windows the run holds. An h-step forecast from neighbouring origins ends on neighbouring
    targets, and a miss at one comes with misses at the origins around it (a burst a horizon long
    sinks them all), so `origins` spaced `spacing` steps apart hold origins·spacing/h windows
    (never more than `origins`): an hour-long trace holds about 7 for a 5-minute horizon, and a
    coverage measured as 0.90 on 7 windows has the interval [0.53, 0.99]."""
    from statsmodels.stats.proportion import proportion_confint

    if origins <= 0:
        return math.nan, math.nan
    n = min(float(origins), max(1.0, origins * max(spacing, 1.0) / max(horizon_steps, 1)))
    low, high = proportion_confint(hits / origins * n, n, alpha=0.05, method="wilson")
    # Exact at the ends (the formula leaves float dust there).
    return (0.0 if hits <= 0 else float(low)), (1.0 if hits >= origins else float(high))


def _p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000.0 if values else float("nan")


def backtest(y: np.ndarray, step_seconds: float, horizons_minutes: list[float], models: list[str],
             num_origins: int = 200, min_train: int | None = None, max_window: int | None = None,
             season_steps: int | None = None, interval: float = 0.9, selected_candidates=(),
             plot_horizon_minutes: float = 5.0, reselect_minutes: float = 60.0, peak_quantile: float = 0.9,
             progress=None) -> BacktestResult:
    y = np.asarray(y, dtype=float)
    n = len(y)
    steps_of = {h: max(1, math.ceil(h * 60.0 / step_seconds)) for h in horizons_minutes}
    max_h = max(steps_of.values())
    if min_train is None:
        # Two seasons when the series has them (so seasonal models can be seasonal), else a quarter.
        min_train = 2 * season_steps if season_steps and n > 3 * season_steps else max(10, n // 3)
    last_origin = n - max_h
    if last_origin <= min_train:
        raise ValueError(f"series of {n} points is too short for {min_train} training points and a "
                         f"{max_h}-step horizon; use a finer --resolution or shorter --horizons")
    origins = np.unique(np.linspace(min_train, last_origin, min(num_origins, last_origin - min_train + 1)).astype(int))
    spacing = (origins[-1] - origins[0]) / max(1, len(origins) - 1) if len(origins) > 1 else 1.0
    # The selector re-chooses every `reselect_minutes` of trace time (at least every origin).
    reselect_every = max(1, round(reselect_minutes * 60.0 / (step_seconds * max(spacing, 1.0))))
    scale = float(np.mean(np.abs(np.diff(y))))
    if scale <= 0:
        raise ValueError("the series is constant: MASE is undefined")
    plot_steps = steps_of.get(plot_horizon_minutes, max_h)
    scores: list[ModelScore] = []
    plot: dict = {"origins": origins.tolist(), "steps": plot_steps}
    scored: tuple[str, ...] = ()
    for name in models:
        errs = {h: [] for h in steps_of.values()}
        apes = {h: [] for h in steps_of.values()}
        covered = {h: 0 for h in steps_of.values()}
        peak_loss = {h: [] for h in steps_of.values()}
        peak_in = {h: 0 for h in steps_of.values()}
        fit_s, pred_s = [], []
        means, uppers, lowers = [], [], []
        selectors = {}
        for o in origins:
            train = y[max(0, o - max_window):o] if max_window else y[:o]
            if name == "selected":
                # One selector per horizon: each chooses for the horizon it is scored on.
                fcs, peaks = {}, {}
                for h in sorted(set(steps_of.values())):
                    sel = selectors.setdefault(h, ModelSelector(
                        [make_model(m, interval, season_steps) for m in selected_candidates], h,
                        fit_timeout=30.0, reselect_every=reselect_every, min_points=5, interval=interval))
                    t0 = time.perf_counter()
                    fcs[h] = sel.forecast(train, end_index=int(o))
                    peaks[h] = sel.forecast_window(train, int(o), 1, h, peak_quantile).peak_upper
                    fit_s.append(time.perf_counter() - t0)
                get = lambda h: (fcs[h].mean[h - 1], fcs[h].lower[h - 1], fcs[h].upper[h - 1])  # noqa: E731
            else:
                model = make_model(name, interval, season_steps)
                t0 = time.perf_counter()
                fitted = model.fit(train, max_h)
                t1 = time.perf_counter()
                fc = fitted.forecast(max_h)
                t2 = time.perf_counter()
                fit_s.append(t1 - t0)
                pred_s.append(t2 - t1)
                get = lambda h: (fc.mean[h - 1], fc.lower[h - 1], fc.upper[h - 1])  # noqa: E731
                peaks = {h: float(np.max(fc.upper[:h])) for h in errs}
            for h in errs:
                peak = float(np.max(y[o:o + h]))
                peak_loss[h].append(pinball(peak, peaks[h], peak_quantile))
                peak_in[h] += peak <= peaks[h]
                mean, lower, upper = get(h)
                actual = y[o + h - 1]
                errs[h].append(abs(mean - actual))
                denom = abs(mean) + abs(actual)
                apes[h].append(0.0 if denom == 0 else 200.0 * abs(mean - actual) / denom)
                covered[h] += lower <= actual <= upper
            mean, lower, upper = get(plot_steps)
            means.append(float(mean))
            lowers.append(float(lower))
            uppers.append(float(upper))
            if progress is not None:
                progress()
        for sel in selectors.values():
            # What the selector took, not what it was handed: a pool member's name (naive) is the pool's.
            scored = tuple(sel.candidates)
            sel.close()
        plot[name] = {"mean": means, "lower": lowers, "upper": uppers}
        for h_min, h in steps_of.items():
            low, high = coverage_interval(covered[h], len(origins), h, spacing)
            scores.append(ModelScore(name, h_min, h, float(np.mean(errs[h]) / scale), float(np.mean(apes[h])),
                                     covered[h] / len(origins), len(origins), _p(fit_s, 50), _p(fit_s, 95),
                                     _p(pred_s, 50), _p(pred_s, 95), float(np.mean(peak_loss[h])),
                                     peak_in[h] / len(origins), low, high))
    return BacktestResult("", step_seconds, n, season_steps, scores, plot, scored)


def pinball(actual: float, predicted: float, q: float) -> float:
    """Pinball (quantile) loss: q·(a − p) when under-predicted, (1 − q)·(p − a) when over."""
    return q * (actual - predicted) if actual >= predicted else (1.0 - q) * (predicted - actual)


def timing_benchmark(y: np.ndarray, steps: int, models: list[str], repeats: int = 30,
                     season_steps: int | None = None) -> dict[str, dict[str, float]]:
    """Fit+predict wall time (ms, p50/p95) on the whole of `y` for each model (`selected`: one
    selector called on each of the last `repeats` steps in turn, as the server calls it)."""
    out = {}
    for name in models:
        times = []
        sel = ModelSelector([], steps) if name == "selected" else None
        for r in range(repeats):
            if sel is not None:
                # The server's path per step: score the pool, forecast, and the decision window,
                # one step later each time (so the bounds served earlier are checked, as live).
                end = max(1, len(y) - repeats + 1 + r)
                t0 = time.perf_counter()
                sel.forecast(y[:end], end)
                sel.forecast_window(y[:end], end, 1, steps)
                times.append(time.perf_counter() - t0)
                continue
            model = make_model(name, season=season_steps)
            t0 = time.perf_counter()
            model.fit(y, steps).forecast(steps)
            times.append(time.perf_counter() - t0)
        if sel is not None:
            sel.close()
        out[name] = {"p50_ms": _p(times, 50), "p95_ms": _p(times, 95), "points": len(y), "repeats": repeats}
    return out


def markdown_table(result: BacktestResult) -> str:
    lines = ["| horizon | steps | model | MASE | vs naive | sMAPE % | coverage | fit ms p50/p95 | predict ms p50/p95 |",
             "|---|---|---|---|---|---|---|---|---|"]
    naive = {s.horizon_minutes: s.mase for s in result.scores if s.model == "naive"}
    for s in sorted(result.scores, key=lambda s: (s.horizon_minutes, s.mase)):
        ratio = f"{(s.mase / naive[s.horizon_minutes] - 1) * 100:+.1f} %" if s.horizon_minutes in naive else ""
        pred = f"{s.predict_ms_p50:.2f}/{s.predict_ms_p95:.2f}" if math.isfinite(s.predict_ms_p50) else "in fit"
        lines.append(f"| {s.horizon_minutes:g} min | {s.horizon_steps} | {s.model} | {s.mase:.3f} | {ratio} | "
                     f"{s.smape:.1f} | {s.coverage:.2f} | {s.fit_ms_p50:.1f}/{s.fit_ms_p95:.1f} | {pred} |")
    return "\n".join(lines)


def summary_table(result: BacktestResult) -> str:
    """The issue's table: selected against naive, ARIMA and Holt-Winters, with coverage and the
    window peak's pinball loss (req/s; lower is better) and coverage of its 0.9 quantile."""
    by = {(s.model, s.horizon_minutes): s for s in result.scores}
    lines = ["| horizon (steps) | selected MASE | vs naive | naive | ARIMA | Holt-Winters | selected 90 % coverage "
             "[95 % interval] | peak pinball: selected / naive | selected peak ≤ q0.9 |",
             "|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda m, h, attr="mase": f"{getattr(by[(m, h)], attr):.3f}" if (m, h) in by else "–"  # noqa: E731
    for h in sorted({s.horizon_minutes for s in result.scores}):
        sel, naive = by.get(("selected", h)), by.get(("naive", h))
        if sel is None:
            continue
        ratio = f"{(sel.mase / naive.mase - 1) * 100:+.1f} %" if naive else "–"
        lines.append(f"| {h:g} min ({sel.horizon_steps}) | {sel.mase:.3f} | {ratio} | {fmt('naive', h)} | "
                     f"{fmt('arima', h)} | {fmt('holt_winters', h)} | {sel.coverage:.2f} "
                     f"[{sel.coverage_low:.2f}, {sel.coverage_high:.2f}] | "
                     f"{sel.peak_pinball:.3f} / {fmt('naive', h, 'peak_pinball')} | {sel.peak_coverage:.2f} |")
    return "\n".join(lines)


def plot_forecasts(result: BacktestResult, y: np.ndarray, path, models=("selected", "naive")) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    step = result.step_seconds
    origins = np.asarray(result.plot["origins"])
    h = result.plot["steps"]
    target = origins + h - 1  # index of the point each forecast is for
    fig, ax = plt.subplots(figsize=(11, 4), dpi=110)
    hours = np.arange(len(y)) * step / 3600.0
    ax.plot(hours, y, color="black", lw=0.8, label="actual")
    colors = {"selected": "tab:blue", "naive": "tab:orange"}
    for name in models:
        if name not in result.plot:
            continue
        data = result.plot[name]
        ax.plot(target * step / 3600.0, data["mean"], lw=1.0, color=colors.get(name), label=f"{name} forecast")
        if name == "selected":
            ax.fill_between(target * step / 3600.0, data["lower"], data["upper"], color="tab:blue", alpha=0.15,
                            label="selected 90 % interval")
    ax.set_xlabel("hours since trace start")
    ax.set_ylabel("requests / s")
    ax.set_title(f"{result.trace}: forecast {h * step / 60:g} min ahead vs actual ({step:g} s steps)")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
