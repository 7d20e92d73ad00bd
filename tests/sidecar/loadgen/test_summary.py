"""Goodput and percentile maths against hand-computed cases."""

from __future__ import annotations

import pytest

from sidecar.loadgen.summary import RequestRecord, percentile, summarise


def rec(i, outcome, ttft=None, tpot=None, e2e=None, itl=(), out=0, violated=()):
    return RequestRecord(index=i, scheduled=float(i), sent=float(i), input_tokens=10, max_tokens=10,
                         outcome=outcome, violated=list(violated), ttft=ttft, tpot=tpot, e2e=e2e,
                         itl=list(itl), output_tokens=out)


def test_percentile_linear_interpolation():
    # Sorted 10,20,30,40: p50 sits halfway between 20 and 30; p90 at rank 0.9·3 = 2.7 → 37.
    assert percentile([40, 10, 30, 20], 50) == 25
    assert percentile([40, 10, 30, 20], 90) == pytest.approx(37)
    assert percentile([], 50) is None


def test_goodput_and_attainment_hand_computed():
    records = [
        rec(0, "good", ttft=0.1, tpot=0.02, e2e=1.0, itl=[0.02, 0.02], out=3),
        rec(1, "good", ttft=0.3, tpot=0.04, e2e=2.0, itl=[0.04], out=2),
        rec(2, "slo_violated", ttft=2.0, tpot=0.05, e2e=3.0, itl=[0.05], out=2, violated=["ttft"]),
        rec(3, "error"),
    ]
    s = summarise(records, duration=10.0, offered_span=4.0)
    assert (s.requests, s.completed, s.good, s.errors) == (4, 3, 2, 1)
    assert s.goodput == pytest.approx(0.2)         # 2 good / 10 s
    assert s.attainment == pytest.approx(0.5)      # 2 good / 4 sent
    assert s.achieved_rate == pytest.approx(0.3)   # 3 completed / 10 s
    assert s.offered_rate == pytest.approx(1.0)    # 4 / 4 s
    assert s.output_tokens_per_s == pytest.approx(0.7)  # 7 tokens / 10 s
    # TTFT over completed requests only: 0.1, 0.3, 2.0 → p50 0.3, mean 0.8.
    assert s.ttft["p50"] == pytest.approx(0.3)
    assert s.ttft["mean"] == pytest.approx(0.8)
    # ITL pools every gap: 0.02, 0.02, 0.04, 0.05 → p50 = 0.03.
    assert s.itl["p50"] == pytest.approx(0.03)
    assert s.violations == {"ttft": 1}


def test_shed_requests_and_per_class_attainment():
    from sidecar.loadgen.summary import RequestRecord, summarise

    records = ([RequestRecord(i, i, i, 16, 4, outcome="good", slo_class="high", ttft=0.1, e2e=0.2) for i in range(4)]
               + [RequestRecord(4, 4, 4, 16, 4, outcome="shed", slo_class="low", e2e=0.001)]
               + [RequestRecord(5, 5, 5, 16, 4, outcome="slo_violated", slo_class="low", ttft=3, e2e=4)])
    s = summarise(records, 10.0)
    # 4 good of 6 sent; of the 5 admitted, 4 good. A shed request is neither completed nor an error.
    assert (s.shed, s.errors, s.completed, s.attainment, s.admitted_attainment) == (1, 0, 5, 4 / 6, 4 / 5)
    ttft = {name: s.by_class[name].pop("ttft") for name in ("high", "low")}
    assert s.by_class == {"high": {"requests": 4, "good": 4, "shed": 0, "attainment": 1.0, "admitted_attainment": 1.0},
                          "low": {"requests": 2, "good": 0, "shed": 1, "attainment": 0.0, "admitted_attainment": 0.0}}
    # TTFT per class over the requests that were served (the shed one has none).
    assert ttft["high"]["p50"] == pytest.approx(0.1) and ttft["low"]["p99"] == pytest.approx(3.0)
