"""Counters → rates: resets, gaps, NaNs and late samples."""

import math

import numpy as np

from forecaster.series import CounterRate, GaugeSeries, RateSeries, aggregate


def test_counter_reset_counts_the_new_value_as_the_increase():
    c = CounterRate()
    assert c.update(0.0, 100.0) is None  # first sample: nothing to difference yet
    assert c.update(15.0, 130.0) == (30.0, 15.0)
    # 130 → 12: the process restarted and has counted 12 since (what Prometheus rate() assumes).
    assert c.update(30.0, 12.0) == (12.0, 15.0)
    assert c.num_resets == 1


def test_nan_and_late_samples_are_dropped():
    c = CounterRate()
    c.update(0.0, 10.0)
    assert c.update(15.0, math.nan) is None
    assert c.update(-5.0, 50.0) is None  # older than the last accepted sample
    assert c.update(15.0, 25.0) == (15.0, 15.0)


def test_rate_series_spreads_a_gap_evenly():
    r = RateSeries(step=15.0, capacity=100)
    r.update(0.0, 0.0)
    r.update(15.0, 30.0)     # 2/s in step 1
    r.update(60.0, 120.0)    # steps 2 and 3 missed: 90 over 45 s = 2/s, written to steps 2, 3, 4
    assert r.values().tolist() == [2.0, 2.0, 2.0, 2.0]


def test_gauge_series_holds_across_gaps_and_skips_nan():
    g = GaugeSeries(step=15.0, capacity=100)
    g.update(0.0, 3.0)
    g.update(15.0, float("nan"))
    g.update(45.0, 7.0)
    # step 1 (NaN) and step 2 (missing) hold 3.0; step 3 is 7.0
    assert g.values().tolist() == [3.0, 3.0, 3.0, 7.0]


def test_ring_buffer_keeps_the_newest_points():
    g = GaugeSeries(step=1.0, capacity=3)
    for t in range(5):
        g.update(float(t), float(t))
    assert g.values().tolist() == [2.0, 3.0, 4.0]


def test_aggregate_aligns_blocks_to_the_end():
    # 7 points by 3: the oldest point is dropped so the newest block is complete.
    assert aggregate(np.arange(7.0), 3).tolist() == [2.0, 5.0]
