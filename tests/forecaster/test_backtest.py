"""Trace readers and the backtest command on the real traces in ../shared/traces."""

import json
import subprocess

import numpy as np
import pytest

from forecaster.backtest import backtest
from forecaster.traces import azure_series, read_azure, servegen_series
from tests.support import TRACES, goodput_command

AZURE = TRACES / "azure2023_code.csv"
SERVEGEN = TRACES / "servegen_language_m-large"
needs_traces = pytest.mark.skipif(not AZURE.exists(), reason="needs ../shared/traces")


@needs_traces
def test_azure_reader_counts_every_request():
    requests = read_azure(AZURE)
    # traces/README.md: 8,819 requests over 57 min, mean 2,048 prompt tokens.
    assert len(requests) == 8819
    assert requests[0].t == 0.0 and 56 * 60 < requests[-1].t < 58 * 60
    assert 2000 < np.mean([r.input_tokens for r in requests]) < 2100
    series = azure_series(AZURE, 60.0)
    # Every request before the cut-short last minute is in the per-minute series, once.
    kept = sum(r.t < len(series.arrival_rate) * 60 for r in requests)
    assert round(sum(series.arrival_rate) * 60) == kept and kept > 8500


@needs_traces
def test_servegen_sum_matches_the_readme():
    series = servegen_series(SERVEGEN)
    y = np.asarray(series.arrival_rate)
    # traces/README.md: 14 days of 10-minute windows; summed min 48, mean 196, max 583 req/s.
    assert len(y) == 2016
    assert round(y.min()) == 48 and round(y.mean()) == 196 and round(y.max()) == 583
    assert len(servegen_series(SERVEGEN, 3600.0).arrival_rate) == 336


def test_mase_of_naive_on_an_alternating_series_is_exact():
    y = np.tile([0.0, 1.0], 50)
    result = backtest(y, 60.0, [1.0, 2.0], ["naive"], num_origins=30)
    by_h = {s.horizon_minutes: s for s in result.scores}
    # Naive is always off by 1 one step ahead and exactly right two steps ahead; the MASE scale
    # (mean absolute one-step change) is 1.
    assert by_h[1.0].mase == 1.0 and by_h[2.0].mase == 0.0
    assert by_h[1.0].smape == 200.0  # |0-1| / ((0+1)/2) every time


@needs_traces
def test_backtest_command_writes_json_table_and_plot(tmp_path):
    proc = subprocess.run(goodput_command("forecast", "backtest", "--trace", str(AZURE), "--models",
                                          "level,naive,linear,selected", "--selected-candidates", "linear",
                                          "--origins", "15", "--horizons", "1,5", "--timing-points", "240",
                                          "--timing-repeats", "3", "--out", str(tmp_path)),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "backtest.json").read_text())
    assert {s["model"] for s in data["scores"]} == {"level", "naive", "linear", "selected"}
    assert data["selected_candidates"] == ["linear"]
    assert {s["horizon_minutes"] for s in data["scores"]} == {1.0, 5.0}
    assert data["timing"]["points"] == 240
    assert "| 5 min | 5 | " in (tmp_path / "backtest.md").read_text()
    for score in data["scores"]:
        assert 0.0 <= score["coverage_low"] <= score["coverage"] <= score["coverage_high"] <= 1.0, score
    assert (tmp_path / "azure2023_code.png").read_bytes()[:4] == b"\x89PNG"


def test_backtest_bad_input_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run(goodput_command("forecast", "backtest", "--trace", str(tmp_path / "nope.csv")),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("goodput: error: no trace at") and proc.stderr.count("\n") == 1
    proc = subprocess.run(goodput_command("forecast", "backtest", "--trace", str(tmp_path), "--horizons", "x"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--horizons" in proc.stderr
    proc = subprocess.run(goodput_command("forecast", "backtest", "--trace", str(AZURE), "--selected-candidates",
                                          "holt_winters,bogus"), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--selected-candidates ['bogus']" in proc.stderr
    proc = subprocess.run(goodput_command("forecast", "backtest", "--trace", str(AZURE), "--models", "selected,bogus"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--models ['bogus']; choose from selected," in proc.stderr


def test_selected_scores_the_fitted_candidates_it_is_handed():
    # On a ramp the pool's damped trends lag while a fitted line does not: handed `linear` (as the
    # server's --models hands its selector fitted models), selected switches to it.
    y = 10.0 + 0.5 * np.arange(600) + np.random.default_rng(0).normal(0.0, 0.2, 600)
    pool, fitted = (backtest(y, 15.0, [5], ["selected"], num_origins=50, selected_candidates=c, reselect_minutes=1)
                    for c in ((), ("linear",)))
    assert fitted.selected_candidates == ("linear",) and pool.selected_candidates == ()
    # A pool member's name handed as a candidate is the pool's own, not a fitted candidate.
    assert backtest(y[:200], 15.0, [1], ["selected"], num_origins=5, selected_candidates=("naive", "linear")
                    ).selected_candidates == ("linear",)
    assert fitted.scores[0].mase < 0.5 * pool.scores[0].mase, (fitted.scores[0].mase, pool.scores[0].mase)


def test_coverage_interval_counts_the_windows_a_run_holds():
    from forecaster.backtest import coverage_interval

    # Origins a horizon apart or more are independent windows: the plain Wilson interval.
    low, high = coverage_interval(9, 10, 1, 1.0)
    assert (low, high) == (pytest.approx(0.5958, abs=1e-4), pytest.approx(0.9821, abs=1e-4))
    assert coverage_interval(9, 10, 5, 5.0) == (low, high)
    # 140 origins one step apart, a 20-step horizon: 7 windows, as an hour at 15 s holds for 5
    # minutes. The interval is the one 7 windows give, far wider than 140 would.
    wide = coverage_interval(126, 140, 20, 1.0)
    assert wide[0] == pytest.approx(0.53, abs=0.01) and wide[1] == pytest.approx(0.99, abs=0.01)
    narrow = coverage_interval(126, 140, 1, 1.0)
    assert wide[0] < narrow[0] - 0.2
    assert all(np.isnan(v) for v in coverage_interval(0, 0, 1, 1.0))   # nothing to know
