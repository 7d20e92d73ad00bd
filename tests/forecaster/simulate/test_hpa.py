"""The HPA controller against hand-worked cases from the Kubernetes documentation.

Source: kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/ ("Algorithm details",
"Configurable scaling behavior", "Default Behavior") and the controller code it describes
(replica_calculator.go, horizontal.go).
"""

from __future__ import annotations

import pytest

from forecaster.simulate.hpa import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    HpaController,
    HpaSpec,
    ScalingPolicy,
    ScalingRules,
    external_average_value_replicas,
    external_value_replicas,
)


def test_ratio_doubles_and_halves_as_in_the_docs():
    # Docs: "if the current metric value is 200m, and the desired value is 100m, the number of
    # replicas will be doubled, since 200.0 / 100.0 == 2.0 ... 50m ... halve".
    assert external_value_replicas(0.2, 0.1, spec_replicas=4, ready_pods=4, tolerance=0.1) == 8
    assert external_value_replicas(0.05, 0.1, spec_replicas=4, ready_pods=4, tolerance=0.1) == 2


def test_tolerance_skips_small_changes():
    # Docs: the controller skips scaling if the ratio is within 0.1 of 1.0: 105m/100m = 1.05.
    assert external_value_replicas(0.105, 0.1, spec_replicas=4, ready_pods=4, tolerance=0.1) == 4
    # 1.09 is within. A ratio of exactly 110/100 is not: in float64 (Go's and Python's alike)
    # |1 - 1.1| = 0.10000000000000009 > 0.1, so the controller scales: ceil(1.1 * 4) = 5.
    assert external_value_replicas(0.109, 0.1, spec_replicas=4, ready_pods=4, tolerance=0.1) == 4
    assert external_value_replicas(0.11, 0.1, spec_replicas=4, ready_pods=4, tolerance=0.1) == 5


def test_value_target_multiplies_ready_pods_not_spec():
    # GetExternalMetricReplicas: ceil(ratio * readyPodCount). 10 in spec, 6 ready, ratio 1.5 -> 9,
    # fewer than the 10 asked for: pods still starting do not count.
    assert external_value_replicas(150.0, 100.0, spec_replicas=10, ready_pods=6, tolerance=0.1) == 9


def test_average_value_divides_the_sum_by_the_per_pod_target():
    # GetExternalPerPodMetricReplicas: 3 pods, metric sum 12, target 2 per pod: ratio 12/(2*3) = 2
    # -> ceil(12 / 2) = 6; sum 6.5 -> ratio 1.083, within tolerance -> stays 3; sum 7 -> ratio
    # 1.167 -> ceil(3.5) = 4.
    assert external_average_value_replicas(12.0, 2.0, status_replicas=3, tolerance=0.1) == 6
    assert external_average_value_replicas(6.5, 2.0, status_replicas=3, tolerance=0.1) == 3
    assert external_average_value_replicas(7.0, 2.0, status_replicas=3, tolerance=0.1) == 4
    # The forecaster's desired replicas read with AverageValue 1 lands exactly on the decision
    # unless it is within 10 % of the current count: 21 wanted with 20 running stays at 20.
    assert external_average_value_replicas(37.0, 1.0, status_replicas=20, tolerance=0.1) == 37
    assert external_average_value_replicas(21.0, 1.0, status_replicas=20, tolerance=0.1) == 20


def test_default_scale_up_doubles_or_adds_four_every_15_seconds():
    # Default scaleUp: max(100 % per 15 s, 4 pods per 15 s), no stabilisation. From 1 pod with a
    # metric asking for 100: 1 -> max(2, 5) = 5 -> max(10, 9) = 10 -> 20 -> 40 -> 80 -> 100 (max).
    hpa = HpaController(HpaSpec("AverageValue", 1.0, 1, 100))
    spec, seen = 1, []
    for k in range(1, 8):
        spec = hpa.reconcile(15.0 * k, spec, usage=100.0, ready_pods=spec)
        seen.append(spec)
    assert seen == [5, 10, 20, 40, 80, 100, 100]


def test_scale_up_select_min_and_disabled():
    # selectPolicy Min takes the smaller of the two limits: from 10, min(20, 14) = 14.
    rules = ScalingRules(0, DEFAULT_SCALE_UP.policies, "Min")
    assert HpaController(HpaSpec("AverageValue", 1.0, 1, 100, scale_up=rules)).reconcile(15.0, 10, 100.0, 10) == 14
    off = ScalingRules(0, DEFAULT_SCALE_UP.policies, "Disabled")
    assert HpaController(HpaSpec("AverageValue", 1.0, 1, 100, scale_up=off)).reconcile(15.0, 10, 100.0, 10) == 10


def test_docs_scale_down_example_80_to_10():
    # Docs ("Scaling Policies"): Pods 4 per 60 s and Percent 10 per 60 s; "if there are 80 replicas
    # and the target has to be scaled down to 10 replicas then during the first step 8 replicas
    # will be reduced. In the next iteration when the number of replicas is 72, 10% of the pods is
    # 7.2 but the number is rounded up to 8 ... When the number of replicas falls below 40 the
    # first policy (Pods) is applied and 4 replicas will be reduced at a time."
    # Worked with the code: each step is int(start * 0.9) vs start - 4, the lower wins (Max
    # change); a 60 s period means one step per minute (syncs in between see the last event).
    rules = ScalingRules(0, (ScalingPolicy("Pods", 4, 60), ScalingPolicy("Percent", 10, 60)), "Max")
    hpa = HpaController(HpaSpec("AverageValue", 1.0, 1, 100, scale_down=rules))
    spec, per_minute = 80, []
    for k in range(1, 4 * 16):
        spec = hpa.reconcile(15.0 * k, spec, usage=10.0, ready_pods=spec)
        if k % 4 == 0:
            per_minute.append(spec)
    assert per_minute[:15] == [72, 64, 57, 51, 45, 40, 36, 32, 28, 24, 20, 16, 12, 10, 10]


def test_first_scale_down_step_then_held_for_the_period():
    rules = ScalingRules(0, (ScalingPolicy("Pods", 4, 60), ScalingPolicy("Percent", 10, 60)), "Max")
    hpa = HpaController(HpaSpec("AverageValue", 1.0, 1, 100, scale_down=rules))
    assert hpa.reconcile(15.0, 80, 10.0, 80) == 72
    # 15 s later the 60 s period still holds the -8: start 80 -> limit 72, no further change.
    assert hpa.reconcile(30.0, 72, 10.0, 72) == 72
    assert hpa.reconcile(75.0, 72, 10.0, 72) == 64  # the event at 15 s is 60 s old: out


def test_scale_down_stabilisation_keeps_the_highest_recommendation_for_300_s():
    # Default scaleDown: 300 s window, 100 % per 15 s. One reading asking for 10, then readings
    # asking for 2: the HPA stays at 10 while the 10 is in the window. The window keeps samples
    # strictly newer than now - 300 s, so at 300 s after it the 10 drops out and 2 is applied.
    hpa = HpaController(HpaSpec("AverageValue", 1.0, 1, 100))
    spec = hpa.reconcile(0.0, 10, usage=10.0, ready_pods=10)
    assert spec == 10
    for t in range(15, 300, 15):
        spec = hpa.reconcile(float(t), spec, usage=2.0, ready_pods=spec)
        assert spec == 10, t
    assert hpa.reconcile(300.0, spec, usage=2.0, ready_pods=spec) == 2


def test_min_and_max_replicas_clamp():
    hpa = HpaController(HpaSpec("AverageValue", 1.0, 2, 6))
    # A new HPA seeds its recommendations with the current count (recordInitialRecommendation in
    # horizontal.go), so a first reading of 0 does not scale down within the 300 s window.
    assert hpa.reconcile(15.0, 4, usage=0.0, ready_pods=4) == 4
    hpa = HpaController(HpaSpec("AverageValue", 1.0, 2, 6, scale_down=ScalingRules(0, DEFAULT_SCALE_DOWN.policies)))
    assert hpa.reconcile(15.0, 4, usage=0.0, ready_pods=4) == 2  # ceil(0) = 0, raised to min 2
    assert hpa.reconcile(30.0, 2, usage=50.0, ready_pods=2) == 6  # capped at max 6
    assert hpa.reconcile(45.0, 9, usage=50.0, ready_pods=9) == 6  # above max: set to max at once


def test_spec_validation_says_what_to_change():
    with pytest.raises(ValueError, match="min_replicas"):
        HpaSpec("AverageValue", 1.0, 5, 2)
    with pytest.raises(ValueError, match="Value or AverageValue"):
        HpaSpec("Utilization", 1.0)
