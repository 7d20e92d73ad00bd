"""The prior read from a `goodput bench engine --json` result (forecaster/service_prior.py): the
decode step's line, and its concave part from three batch sizes on."""

from __future__ import annotations

import math

import pytest

from forecaster.service_model import Slo, TokenMix
from forecaster.service_prior import model_from_bench, step_curve

# `goodput bench engine --dtype float32 --batches 1,2,4,8,16,32` on a 2-core AMD EPYC (SmolLM2).
EPYC = {1: 0.0431, 2: 0.0747, 4: 0.1056, 8: 0.1010, 16: 0.1162, 32: 0.1722}


def _bench(points: dict) -> dict:
    return {"model": "smollm2", "engine_decode": [{"batch": b, "step_s": s} for b, s in points.items()],
            "engine_prefill": {"tokens_per_s": 590.0}}


def test_three_batch_sizes_give_the_concave_step_where_the_line_overstates_it():
    a, c, d = step_curve(list(EPYC), list(EPYC.values()))
    assert d > 0 and c >= 0
    for b, s in EPYC.items():
        if b >= 4:
            assert a + c * b + d * math.log(b) == pytest.approx(s, rel=0.2), b
    two = {b: EPYC[b] for b in (1, 8)}
    line = model_from_bench(_bench(two))
    assert line.decode_log_s == 0.0
    assert line.step_s(32) > 1.6 * EPYC[32]                # the line through 1 and 8: 300 ms at 32
    curve = model_from_bench(_bench(EPYC))
    assert curve.step_s(32) == pytest.approx(EPYC[32], rel=0.2)
    mix = TokenMix.from_samples([54] * 10, [30] * 10)
    slo = [Slo(3.0, 0.5, 0.9, "demo")]
    assert curve.slo_capacity_rps(mix, slo) > 1.5 * line.slo_capacity_rps(mix, slo)


def test_two_points_give_the_line_through_them():
    a, c, d = step_curve([1, 8], [0.05, 0.12])
    assert (a, c, d) == (pytest.approx(0.04), pytest.approx(0.01), 0.0)


def test_a_convex_step_keeps_the_line_and_a_falling_one_is_flat():
    a, c, d = step_curve([1, 8, 32], [0.01, 0.03, 0.20])     # grows faster than linearly: no log part
    assert d == 0.0 and c > 0
    a, c, d = step_curve([1, 8, 32], [0.09, 0.06, 0.03])
    assert (c, d) == (0.0, 0.0) and a == pytest.approx(0.06)


def test_without_a_one_sequence_point_the_floor_on_the_base_is_part_of_the_fit():
    # Batches 8-64 only (a GPU's bench often starts there): the unconstrained best base is below
    # zero. Clamping it afterwards (as step_curve once did) shifted the whole curve up by the base's
    # deficit, 43 ms here; fitted with the base at its floor, the curve stays on the points.
    points = {8: 0.0697, 16: 0.114, 64: 0.2429}
    a, c, d = step_curve(list(points), list(points.values()))
    assert a == pytest.approx(1e-4)
    for b, s in points.items():
        assert a + c * b + d * math.log(b) == pytest.approx(s, abs=0.006), b
