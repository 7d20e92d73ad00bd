"""Adaptive conformal levels (forecaster/coverage.py): the exact update, and what it is for, a
trace whose errors change after the calibration window was filled."""

import numpy as np
import pytest

from forecaster.coverage import AdaptiveTails
from forecaster.selection import ModelSelector


def test_a_miss_widens_and_a_hit_narrows_by_gamma():
    t = AdaptiveTails(2, target=0.05, gamma=0.02)
    # Made at step 10: an upper bound 5.0 on the value at step 11, a lower bound 1.0 at step 12.
    t.record(10, [(11, 11, 0, 5.0, +1, "value"), (12, 12, 1, 1.0, -1, "value")])
    t.observe(11, np.array([0.0, 7.0]))          # step 11 = 7.0 > 5.0: a miss; step 12 not yet seen
    assert t.tails[0] == pytest.approx(0.05 + 0.02 * (0.05 - 1.0))
    assert t.tails[1] == pytest.approx(0.05) and t.checked == 1 and t.missed == 1
    t.observe(12, np.array([7.0, 2.0]))          # step 12 = 2.0 >= 1.0: a hit
    assert t.tails[1] == pytest.approx(0.05 + 0.02 * 0.05)
    t.observe(13, np.array([2.0, 9.0]))          # nothing left to check
    assert t.checked == 2


def test_window_bounds_check_the_mean_or_the_peak():
    t = AdaptiveTails(2, target=0.1, gamma=0.1)
    t.record(0, [(1, 3, 0, 2.5, +1, "mean"), (1, 3, 1, 2.5, +1, "max")])
    t.observe(3, np.array([0.0, 1.0, 2.0, 3.0]))  # steps 1..3: mean 2.0 (held), max 3.0 (missed)
    assert t.tails[0] == pytest.approx(0.1 + 0.1 * 0.1)
    assert t.tails[1] == pytest.approx(0.1 + 0.1 * (0.1 - 1.0))


def test_a_bound_made_twice_from_one_history_counts_once_and_a_new_clock_starts_over():
    t = AdaptiveTails(1, target=0.05, gamma=0.02)
    t.record(5, [(6, 6, 0, 1.0, +1, "value")])
    t.record(5, [(6, 6, 0, 100.0, +1, "value")])   # ignored: the first stands
    t.record(2, [(3, 3, 0, 100.0, +1, "value")])   # the clock went back: step 6's bound is dropped
    t.observe(6, np.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    assert t.checked == 1 and t.missed == 0      # only step 3's bound (100 >= 2.0)


def test_rejects_bad_levels():
    with pytest.raises(ValueError):
        AdaptiveTails(1, target=0.0)
    with pytest.raises(ValueError):
        AdaptiveTails(1, target=0.05, gamma=-0.1)


def _coverage(y: np.ndarray, gamma: float, origins: range) -> float:
    sel = ModelSelector([], steps=1, gamma=gamma)
    hits = 0
    for end in origins:
        fc = sel.forecast(y[:end], end)
        hits += fc.lower[0] <= y[end] <= fc.upper[0]
    return hits / len(origins)


@pytest.mark.parametrize("seed", [0, 1])
def test_coverage_holds_when_the_noise_triples(seed):
    # The noise triples at step 1500; the split-conformal window (two hours of 15-s steps) is
    # then mostly the quiet regime for a long while. Scored from 1400 to 2400: with the level
    # fixed (gamma 0) the 90 % interval covers about 82 %; moved by its misses, about 90 %.
    rng = np.random.default_rng(seed)
    sd = np.concatenate([np.full(1500, 1.0), np.full(1500, 3.0)])
    y = np.maximum(0.0, 20.0 + rng.normal(0.0, 1.0, 3000) * sd)
    origins = range(1400, 2400)
    fixed, adaptive = _coverage(y, 0.0, origins), _coverage(y, 0.02, origins)
    assert fixed < 0.86, fixed
    assert 0.87 <= adaptive <= 0.93, adaptive


def test_window_levels_are_kept_for_a_bounded_number_of_windows():
    from forecaster.selection import MAX_WINDOWS
    y = np.random.default_rng(3).poisson(60, 400) / 15.0
    sel = ModelSelector([], steps=4)
    for end in range(100, 100 + MAX_WINDOWS + 10):
        sel.forecast_window(y[:end], end, 1, 1 + end % (MAX_WINDOWS + 5))
    assert len(sel._window_tails) == MAX_WINDOWS


def test_a_target_not_observed_is_not_counted():
    t = AdaptiveTails(1, target=0.05, gamma=0.02)
    t.record(0, [(1, 1, 0, 1.0, +1, "value")])
    t.observe(1, np.array([0.0, np.nan]))
    assert t.checked == 0 and t.tails[0] == 0.05
